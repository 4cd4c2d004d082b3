"""Measurement helpers shared by the demo, the benchmark scripts and (later) ``ringlet bench``.

Metrics follow nccl-tests: ``algbw = bytes / time``; ``busbw = algbw × factor`` where the factor
makes busbw comparable to the link rate (2(p−1)/p for all-reduce).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from .sizes import parse_size  # noqa: F401 - the benchmark scripts' size parser is the library's

BUSBW_FACTOR = {
    "allreduce": lambda p: 2.0 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "alltoall": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}


def busbw(kind: str, p: int, nbytes: int, seconds: float) -> float:
    """Bus bandwidth in bytes/s of one ``kind`` collective of ``nbytes`` on ``p`` ranks taking ``seconds``."""
    return BUSBW_FACTOR[kind](p) * nbytes / seconds if seconds > 0 else float("inf")


def time_collective(run: Callable[[], object], sync: Callable[[], None], *, iters: int, warmup: int = 2,
                    agree_max: Callable[[float], float] | None = None, blocks: int = 0) -> float:
    """Time per call of ``run()``: the median over ``blocks`` of back-to-back loops, each started after ``sync()``.

    As nccl-tests does, calls within a block follow each other without a barrier in between, so a
    small message is not charged the skew with which ranks leave the barrier (which can exceed the
    collective itself). ``blocks`` (default: 3 when ``iters >= 9``, else 1) splits ``iters`` into
    loops whose median resists a single stall on a shared machine. ``agree_max`` (e.g. a max
    all-reduce) makes every rank report the slowest rank's time.
    """
    # One implementation interleaved with nothing: the same blocks and medians.
    med = time_interleaved({"": run}, sync, iters=iters, warmup=warmup, blocks=blocks or (3 if iters >= 9 else 1))[""]
    return agree_max(med) if agree_max is not None else med


def time_interleaved(runs: dict[str, Callable[[], object]], sync: Callable[[], None], *, iters: int,
                     warmup: int = 2, blocks: int = 0) -> dict[str, float]:
    """Time per call of each ``runs[name]()``, like :func:`time_collective`, but with the blocks of
    all implementations interleaved (A B C A B C ...) and the median taken per implementation.

    On a shared, noisy machine a slow spell then hits every implementation alike instead of
    whichever happened to run during it, so the ratios between them (what a comparison reports)
    stay meaningful. ``blocks`` defaults to 5 (3 below 10 iterations, 1 below 3).
    """
    for run in runs.values():
        for _ in range(warmup):
            run()
    blocks = blocks or (5 if iters >= 10 else 3 if iters >= 3 else 1)
    per = max(1, iters // blocks)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(blocks):
        for name, run in runs.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(per):
                run()
            times[name].append((time.perf_counter() - t0) / per)
    return {name: statistics.median(ts) for name, ts in times.items()}


def iterations_for(nbytes: int, budget_bytes: int = 1 << 30, lo: int = 3, hi: int = 50) -> int:
    """Fewer iterations for big messages so a sweep stays short."""
    return max(lo, min(hi, budget_bytes // max(1, nbytes)))


def integer_data(n: int, rank: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Integer-valued data in [-4, 4] so float sums are exact in any order (nccl-tests' trick)."""
    g = torch.Generator().manual_seed(seed * 1000003 + rank)
    return torch.randint(-4, 5, (n,), generator=g).to(dtype)


def fmt_size(nbytes: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << k and nbytes % (1 << k) == 0:
            return f"{nbytes >> k} {unit}"
    return f"{nbytes} B"
