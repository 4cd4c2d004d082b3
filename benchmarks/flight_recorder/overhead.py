"""The flight recorder's cost on a small all-reduce, paired in one job: blocks of 4 KiB all-reduces with
the recorder on and off alternate (``rt.recorder.size`` switched between blocks on every rank at once);
rank 0 prints the median block time per call of each arm and the ratio per round.

    ringlet run -np 2 --transport torch -- python benchmarks/flight_recorder/overhead.py --out results/np2.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import ringlet


def block(t: torch.Tensor, calls: int) -> float:
    ringlet.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        ringlet.allreduce_(t)
    return (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out")
    a = ap.parse_args()
    rt = ringlet.init()
    on_size = rt.recorder.size
    t = torch.ones(1024)  # 4 KiB of float32
    block(t, a.calls)  # warm-up
    ratios, times = [], {"on": [], "off": []}
    for r in range(a.rounds):
        order = ("on", "off") if r % 2 == 0 else ("off", "on")
        got = {}
        for arm in order:
            rt.recorder.size = on_size if arm == "on" else 0
            got[arm] = block(t, a.calls)
            times[arm].append(got[arm])
        ratios.append(got["on"] / got["off"])
    if ringlet.rank() == 0:
        res = {"world": ringlet.size(), "calls": a.calls, "rounds": a.rounds,
               "on_us": statistics.median(times["on"]) * 1e6, "off_us": statistics.median(times["off"]) * 1e6,
               "ratio_median": statistics.median(ratios),
               "ratio_mean": statistics.fmean(ratios), "ratio_se": statistics.stdev(ratios) / len(ratios) ** 0.5}
        print(json.dumps(res))
        if a.out:
            json.dump(res, open(a.out, "w"), indent=1)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
