"""The flight recorder's cost on a training step, paired in one job: ringlet's DDP trains the CNN of
``examples/synthetic_benchmark.py`` (batch 32, synthetic data) in blocks of steps with the recorder on
and off alternated (``rt.recorder.size`` switched between blocks on every rank at once; the order flips
every round); rank 0 prints the median step time of each arm and the per-round on/off ratio.

    ringlet run -np 2 -- python benchmarks/flight_recorder/step_overhead.py --out results/cnn_np2.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import synthetic_benchmark  # noqa: E402  the models of the synthetic benchmark

import ringlet  # noqa: E402
import ringlet.torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out")
    a = ap.parse_args()
    rt = ringlet.init()
    torch.manual_seed(0)
    model = ringlet.torch.DistributedDataParallel(synthetic_benchmark.cnn())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(a.batch, 3, 32, 32), torch.randint(0, 10, (a.batch,))
    on_size = rt.recorder.size

    def block(steps: int) -> float:
        ringlet.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - t0) / steps

    block(3)  # warm-up
    ratios, times = [], {"on": [], "off": []}
    for r in range(a.rounds):
        got = {}
        for arm in (("on", "off") if r % 2 == 0 else ("off", "on")):
            rt.recorder.size = on_size if arm == "on" else 0
            got[arm] = block(a.steps)
            times[arm].append(got[arm])
        ratios.append(got["on"] / got["off"])
    if ringlet.rank() == 0:
        res = {"world": ringlet.size(), "model": "cnn", "batch": a.batch, "steps": a.steps, "rounds": a.rounds,
               "on_ms": statistics.median(times["on"]) * 1e3, "off_ms": statistics.median(times["off"]) * 1e3,
               "ratio_median": statistics.median(ratios), "ratio_mean": statistics.fmean(ratios),
               "ratio_se": statistics.stdev(ratios) / len(ratios) ** 0.5}
        print(json.dumps(res))
        if a.out:
            with open(a.out, "w") as fh:
                json.dump(res, fh, indent=1)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
