"""Local argument checks every front end shares: a bad argument raises ``ValueError`` at the call, on
the calling rank, before anything is queued or sent."""
from __future__ import annotations

from typing import Sequence

import torch

from ..types import SUPPORTED_DTYPES, dtype_name


def check_tensor(t, allowed: Sequence[torch.dtype] = SUPPORTED_DTYPES, *, sparse_hint: str = "densify them first") -> None:
    """``t`` must be a dense, contiguous tensor with data (not on the ``meta`` device) of one of the
    ``allowed`` dtypes."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"Expected a torch.Tensor, got {type(t).__name__}.")
    if t.is_meta:
        raise ValueError("Tensor is on the meta device (it has no data); pass a CPU or CUDA tensor.")
    if t.is_sparse:
        raise ValueError(f"Sparse tensors are not supported here; {sparse_hint}.")
    if t.dtype not in allowed:
        raise ValueError(f"Tensor type {t.dtype} is not supported. Supported: "
                         + ", ".join(dtype_name(d) for d in allowed) + ".")
    if not t.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")


def alltoall_splits(splits, t: torch.Tensor, p: int) -> list[int]:
    """The rows of ``t``'s dim 0 sent to each of ``p`` members: ``splits`` (a list of ints or a 1-D
    integer tensor, non-negative, summing to dim 0), or dim 0 divided evenly when ``splits`` is None."""
    if t.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension (got a scalar).")
    if splits is None:
        if t.shape[0] % p:
            raise ValueError(f"alltoall without splits needs dim 0 ({t.shape[0]}) divisible by the number of "
                             f"ranks ({p}).")
        return [t.shape[0] // p] * p
    sp = _counts(splits, p, "splits")
    if sum(sp) != t.shape[0]:
        raise ValueError(f"alltoall splits sum to {sum(sp)}, but dim 0 of the tensor is {t.shape[0]}.")
    return sp


def alltoall_recv_splits(recv, splits: Sequence[int], p: int, me: int) -> tuple[int, ...] | None:
    """The rows received from each of ``p`` members as the caller gave them (``recv``: a list of ints or a
    1-D integer tensor, non-negative; None: unknown). A member's own block does not travel, so
    ``recv[me]`` must equal ``splits[me]``."""
    if recv is None:
        return None
    rs = _counts(recv, p, "recv_splits")
    if rs[me] != splits[me]:
        raise ValueError(f"alltoall recv_splits[{me}] = {rs[me]} (this rank's own block), but splits[{me}] = "
                         f"{splits[me]}: a rank receives from itself what it sends to itself.")
    return tuple(rs)


def _counts(counts, p: int, what: str) -> list[int]:
    """``counts`` (a list of ints or a 1-D integer tensor) as ``p`` non-negative ints; ``ValueError``
    naming ``what`` otherwise."""
    if isinstance(counts, torch.Tensor):
        if counts.dim() != 1 or counts.is_floating_point():
            raise ValueError(f"alltoall {what} must be a 1-D integer tensor or a list of ints.")
        counts = counts.tolist()
    try:
        out = [int(c) for c in counts]
    except (TypeError, ValueError):
        raise ValueError(f"alltoall {what} must be integers, got {counts!r}.") from None
    if any(isinstance(c, bool) or c != i for c, i in zip(counts, out)):
        raise ValueError(f"alltoall {what} must be integers, got {list(counts)!r}.")
    if len(out) != p:
        raise ValueError(f"alltoall {what} has {len(out)} entries, but there are {p} ranks.")
    if any(c < 0 for c in out):
        raise ValueError(f"alltoall {what} must be non-negative.")
    return out


def scale_factor(x, what: str) -> float:
    """``x`` as a float (a scale factor: any real number, NaN and infinities included); ``ValueError``
    naming ``what`` for anything else."""
    if type(x) is float:
        return x
    if isinstance(x, (str, bytes, complex)):
        raise ValueError(f"{what} must be a real number, got {x!r}.")
    try:
        return float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a real number, got {x!r}.") from None
