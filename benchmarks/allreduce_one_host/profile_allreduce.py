"""Where an all-reduce spends its time: run one implementation in a loop, for a sampling profiler.

    ringlet run --cluster -- sh -c 'if [ "$RANK" = 0 ]; then exec py-spy record --threads --native -f raw \
        -o prof.txt -- python benchmarks/allreduce_one_host/profile_allreduce.py ring 64M 20; \
        else exec python benchmarks/allreduce_one_host/profile_allreduce.py ring 64M 20; fi'

Also prints the wall time per call and this process's CPU time per call (user+system of all its
threads, Gloo's I/O thread included), so CPU-bound runs can be told from link-bound ones.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import ringlet
from ringlet.benchmarking import parse_size


def main() -> None:
    impl, size, iters = sys.argv[1], parse_size(sys.argv[2]), int(sys.argv[3])
    ringlet.init()
    t = torch.ones(size // 4)
    run = (lambda: dist.all_reduce(t)) if impl == "native" else (lambda: ringlet.allreduce_(t, algorithm=impl))
    run()
    ringlet.barrier()
    c0, t0 = os.times(), time.perf_counter()
    for _ in range(iters):
        run()
    wall = (time.perf_counter() - t0) / iters
    c1 = os.times()
    cpu = ((c1.user - c0.user) + (c1.system - c0.system)) / iters
    busbw = 2 * (ringlet.size() - 1) / ringlet.size() * size / wall / 1e9
    print(f"rank {ringlet.rank()}: {impl} {size} B: {wall * 1e3:.1f} ms/call, busbw {busbw:.3f} GB/s, "
          f"CPU {cpu * 1e3:.1f} ms/call (user {(c1.user - c0.user) / iters * 1e3:.1f}, "
          f"system {(c1.system - c0.system) / iters * 1e3:.1f})", flush=True)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
