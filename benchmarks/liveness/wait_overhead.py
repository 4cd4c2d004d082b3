"""What the interruptible Gloo wait costs: all-reduces with waits handed to a helper thread (what the
torch transport does, so that an abort can release a blocked rank) against waits made directly in the
calling thread, alternated in blocks in one job.

    ringlet run --cluster -np 4 --transport torch -- python benchmarks/liveness/wait_overhead.py --out R.json

Prints, per size, the median seconds per all-reduce of each arm and their ratio (helper / direct).
"""
import argparse
import json
import statistics
import sys
import time

import torch

import ringlet
from ringlet.transport import torchdist


class Direct:
    """Waits in the calling thread (no abort can release them)."""

    @staticmethod
    def wait(job, aborted):
        job()


def block(t: torch.Tensor, n: int) -> float:
    ringlet.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        ringlet.allreduce_(t)
    return (time.perf_counter() - t0) / n


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="4096,65536,1048576,16777216", help="bytes per all-reduce")
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--seconds", type=float, default=1.0, help="target seconds per block")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    ringlet.init()
    helper = torchdist._waiter
    rows = []
    for size in (int(s) for s in a.sizes.split(",")):
        t = torch.ones(size // 4)
        per = block(t, 3)
        n = max(3, int(a.seconds / max(per, 1e-6)))
        n = int(ringlet.allreduce(torch.tensor([float(n)]), op=ringlet.ReduceOp.MAX)[0])
        arms = {"helper": [], "direct": []}
        for b in range(a.blocks):
            for arm in (("helper", "direct") if b % 2 == 0 else ("direct", "helper")):
                torchdist._waiter = helper if arm == "helper" else Direct
                arms[arm].append(block(t, n))
        torchdist._waiter = helper
        med = {k: statistics.median(v) for k, v in arms.items()}
        rows.append({"bytes": size, "n": n, **{f"{k}_s": v for k, v in med.items()},
                     "ratio": med["helper"] / med["direct"], "blocks": arms})
        if ringlet.rank() == 0:
            print(f"{size:>10} B  helper {med['helper'] * 1e3:8.3f} ms  direct {med['direct'] * 1e3:8.3f} ms  "
                  f"ratio {med['helper'] / med['direct']:.3f}", flush=True)
    if ringlet.rank() == 0 and a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    ringlet.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
