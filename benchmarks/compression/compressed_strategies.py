"""Compressed all-reduce: reduce-scatter/all-gather on compressed payloads (``scatter``) against a ring
that re-quantises every partial sum per hop (``ring``), beside the float32 ring all-reduce.

    ringlet run -np 4 --transport shm -- python benchmarks/compression/compressed_strategies.py [--sizes-mib 1 16 64]
                                                                                   [--compressors fp16 int8]

Per size and compressor the timed calls of every strategy are interleaved (A B C A B C ...); each number
is the slowest rank's median over ``--repeats`` calls (the metadata check off: the data path alone).
``bytes/rank``: what this rank's transport sent for one call (``ringlet.wire_bytes()``); ``rel. error``:
``||result - exact|| / ||exact||`` of the average of Gaussian inputs against the float64 average.
Rank 0 prints a markdown table.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import ringlet
from ringlet.collectives import Compressed, compressed_allreduce_async_


def _inputs(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _exact(n: int, p: int) -> torch.Tensor:
    return sum(_inputs(n, 1000 + r).double() for r in range(p)) / p


def _runner(label: str, comp):
    if label == "float32 ring":
        return lambda t: ringlet.allreduce_(t, op="avg", algorithm="ring", check=False)
    spec = Compressed(comp, {}, None, label)
    return lambda t: compressed_allreduce_async_(t, spec, average=True, check=False).wait()


def _first(run, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """One untimed call: the bytes this rank sent for it, and its result."""
    t = x.clone()
    before = ringlet.wire_bytes()
    run(t)
    return (ringlet.wire_bytes() - before).sent, t


def _timed(run, x: torch.Tensor, t: torch.Tensor) -> float:
    t.copy_(x)
    ringlet.barrier()
    t0 = time.perf_counter()
    run(t)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16, 64])
    ap.add_argument("--compressors", nargs="+", default=["fp16"])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ringlet.init()
    p = ringlet.size()
    from ringlet import compression

    rows = []
    for mib in args.sizes_mib:
        n = int(mib * (1 << 20)) // 4
        exact = _exact(n, p)
        for name in args.compressors:
            comp = compression.get(name)
            labels = ["float32 ring", "scatter", "ring"]
            runs = {lab: _runner(lab, comp) for lab in labels}
            x, t = _inputs(n, 1000 + ringlet.rank()), torch.empty(n)
            first = {lab: _first(runs[lab], x) for lab in labels}
            times = {lab: [] for lab in labels}
            for _ in range(args.repeats):  # interleaved: one call of each per round
                for lab in labels:
                    times[lab].append(_timed(runs[lab], x, t))
            for lab in labels:
                med = statistics.median(times[lab])
                slowest = ringlet.allreduce(torch.tensor([med], dtype=torch.float64), op="max").item()
                sent, res = first[lab]
                err = float((res.double() - exact).norm() / exact.norm())
                rows.append((mib, name if lab != "float32 ring" else "-", lab, slowest * 1e3, sent, err))
    if ringlet.rank() == 0:
        print(f"{p} ranks, transport {ringlet.collectives.runtime().transport.name}, repeats {args.repeats}\n")
        print("| MiB (float32) | compressor | strategy | ms (median, slowest rank) | bytes/rank | rel. error |")
        print("|---:|---|---|---:|---:|---:|")
        for mib, name, lab, ms, sent, err in rows:
            print(f"| {mib:g} | {name} | {lab} | {ms:.1f} | {sent} | {err:.2e} |")
    ringlet.shutdown()


if __name__ == "__main__":
    main()
