"""Inputs and references shared by the ZeRO reducer tests (unit and multi-process): every rank's
bucket, ragged counts, and the exact average sliced to a rank's block."""
from __future__ import annotations

import zlib

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def counts_of(n: int, p: int, cut: str) -> list[int]:
    """``n`` elements cut into ``p`` blocks: ``"even"`` (the first ``n % p`` one larger) or ``"ragged"``
    (uneven, some blocks empty when ``n`` is small), the same on every rank."""
    if cut == "even":
        return [n // p + (1 if r < n % p else 0) for r in range(p)]
    g = torch.Generator().manual_seed(n * 31 + p)
    cuts = sorted(torch.randint(0, n + 1, (p - 1,), generator=g).tolist())
    edges = [0] + cuts + [n]
    return [edges[i + 1] - edges[i] for i in range(p)]


def bucket(rank: int, n: int, dtype: torch.dtype, step: int = 0, exact: bool = True) -> torch.Tensor:
    """Rank ``rank``'s bucket: integers in [-3, 3] (sums over <= 8 ranks exact in every dtype) when
    ``exact``, else normal floats (distinct magnitudes: top-k has no ties)."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((rank, n, str(dtype), step, exact)).encode()))
    vals = torch.randint(-3, 4, (n,), generator=g).float() if exact else torch.randn(n, generator=g)
    return vals.to(dtype)


def average(buckets: list[torch.Tensor]) -> torch.Tensor:
    """The exact average of the buckets, in float64."""
    return torch.stack([b.double() for b in buckets]).mean(0) if buckets[0].numel() else torch.zeros(0).double()


def block_of(t: torch.Tensor, counts: list[int], i: int) -> torch.Tensor:
    start = sum(counts[:i])
    return t[start:start + counts[i]]
