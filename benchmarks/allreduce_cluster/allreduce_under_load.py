"""All-reduce time while the host computes, as it does during a backward pass with overlap.

    ringlet run --cluster -np 4 -- python benchmarks/allreduce_cluster/allreduce_under_load.py 10M 8 native,ring,direct,halving_doubling

On an emulated host with a CPU quota, a busy compute thread uses up the quota and the kernel freezes the
whole host (communication threads included) until the next period. An all-reduce whose steps depend on
each other through every host waits for each host's next unfrozen window once per step, so the number of
dependent steps matters there, while on idle hosts only the bytes on the wire do. This script times each
implementation idle and beside a compute thread (a loop of matrix products, which release the GIL as
backward does), in interleaved blocks so that drift on a shared machine hits every implementation alike.
Rank 0 prints the median ms per call of each implementation and condition.
"""
from __future__ import annotations

import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

import ringlet
from ringlet.benchmarking import parse_size


class Busy:
    """A thread that multiplies matrices while ``on`` is set: the stand-in for backward's compute."""

    def __init__(self) -> None:
        self.on = threading.Event()
        self.stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        a, b = torch.randn(256, 256), torch.randn(256, 256)
        while not self.stop:
            if not self.on.wait(0.05):
                continue
            torch.mm(a, b)


def main() -> None:
    size, iters = parse_size(sys.argv[1]), int(sys.argv[2])
    impls = sys.argv[3].split(",") if len(sys.argv) > 3 else ["native", "ring", "direct", "halving_doubling"]
    blocks = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    torch.set_num_threads(1)
    ringlet.init()
    t = torch.ones(size // 4)
    busy = Busy()

    def call(impl: str) -> None:
        if impl == "native":
            dist.all_reduce(t)
        else:
            ringlet.allreduce_(t, algorithm=impl)

    for impl in impls:  # warm connections and buffers
        call(impl)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(blocks):
        for cond in ("idle", "busy"):
            for impl in impls:
                if cond == "busy":
                    busy.on.set()
                    time.sleep(0.2)  # let the quota run out as it would during backward
                ringlet.barrier()
                for _ in range(iters):
                    t0 = time.perf_counter()
                    call(impl)
                    times.setdefault((impl, cond), []).append(time.perf_counter() - t0)
                busy.on.clear()
    busy.stop = True
    if ringlet.rank() == 0:
        print(f"# {ringlet.size()} ranks, {size} B, {blocks} interleaved blocks of {iters} calls; "
              "median ms per call (rank 0)")
        print(f"{'implementation':<18} {'idle':>8} {'busy':>8}  busy/idle  busy vs native busy")
        base = statistics.median(times[("native", "busy")]) if ("native", "busy") in times else None
        for impl in impls:
            idle, hot = (statistics.median(times[(impl, c)]) * 1e3 for c in ("idle", "busy"))
            rel = f"{hot / (base * 1e3):.2f}x" if base else "-"
            print(f"{impl:<18} {idle:8.1f} {hot:8.1f}  {hot / idle:8.2f}  {rel:>8}", flush=True)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
