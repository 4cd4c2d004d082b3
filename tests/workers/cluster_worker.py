"""Rank of a job on emulated hosts (``ringlet run --cluster``): report the layout ringlet sees, check
all-reduces element by element, time a small one; write ``OUT.rank<r>`` as JSON.

    ringlet run --cluster -- python cluster_worker.py OUT [ALGORITHM ...]
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time

import torch

import ringlet


def main() -> None:
    out, algorithms = sys.argv[1], sys.argv[2:] or ["auto"]
    ringlet.init()
    r, p = ringlet.rank(), ringlet.size()
    rt = ringlet.collectives.runtime()
    rec = {
        "rank": r, "size": p, "local_rank": ringlet.local_rank(), "local_size": ringlet.local_size(),
        "cross_rank": ringlet.cross_rank(), "cross_size": ringlet.cross_size(),
        "uts_hostname": socket.gethostname(), "runtime_hosts": list(rt.hostnames),
        "cluster_host": os.environ.get("RINGLET_CLUSTER_HOST"), "wrong": {}, "times_us": {},
    }
    for algo in algorithms:
        for n in (1, 1000, 65_537, 1 << 18):
            x = torch.arange(n, dtype=torch.float32) + r  # integers: the sum is exact in any order
            want = torch.arange(n, dtype=torch.float32) * p + p * (p - 1) / 2
            got = ringlet.allreduce(x, op="sum", algorithm=algo)
            rec["wrong"][f"{algo}/{n}"] = int((got != want).sum())
        # A 256 KiB all-reduce, timed after one warm-up: the median of 5 (reported, never asserted).
        x = torch.ones(1 << 16)
        ringlet.allreduce(x, op="sum", algorithm=algo)
        times = []
        for _ in range(5):
            ringlet.barrier()
            t0 = time.perf_counter()
            ringlet.allreduce(x, op="sum", algorithm=algo)
            times.append((time.perf_counter() - t0) * 1e6)
        rec["times_us"][algo] = sorted(times)[len(times) // 2]
    with open(f"{out}.rank{r}", "w") as f:
        json.dump(rec, f)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
