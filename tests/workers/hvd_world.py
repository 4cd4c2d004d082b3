"""Run a Horovod-style function on every rank of an in-process world (ranks as threads).

Each thread gets its own ringlet runtime (``use_runtime``) and therefore its own ``ringlet.torch``
context: ``hvd.init()`` inside the thread notices the thread's runtime.
"""
from __future__ import annotations

import zlib

import torch
from conftest import run_world

import ringlet.torch as hvd


def hvd_world(p: int, fn, **kw) -> list:
    """``fn(rank)`` on ``p`` ranks between ``hvd.init()`` and ``hvd.shutdown()``; results in rank order."""

    def body(r):
        hvd.init()
        try:
            return fn(r)
        finally:
            hvd.shutdown()

    return run_world(p, body, **kw)


def ints(key: str, rank: int, shape, dtype=torch.float32, lo: int = -3, hi: int = 4) -> torch.Tensor:
    """Integer-valued data of ``rank`` for case ``key`` (every rank can compute every rank's input)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}|{rank}".encode()))
    n = 1
    for s in shape:
        n *= s
    return torch.randint(lo, hi, (n,), generator=g).to(dtype).reshape(shape)
