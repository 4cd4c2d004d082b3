"""All-to-all schedules over a full count matrix, and what they share.

Every builder takes ``(p, send_counts, host_of)``: ``send_counts[r][d]`` elements go from rank ``r`` to
rank ``d`` (ragged ``alltoallv``; an even split is a special case, a zero block moves nothing) and
``host_of[r]`` is the host index of rank ``r``. Buffers: 1 is the rank's input (its blocks in
destination order), 0 its output (the received blocks in source order), 2 a per-rank scratch of
``meta["scratch"][r]`` elements (absent or 0: none). A rank's own block (``r`` to ``r``) is never in
a schedule: the caller copies it (the schedule model has no local copies).

:func:`pairwise` (here), :func:`ringlet.algorithms.alltoall_hierarchical.hierarchical` and
:func:`ringlet.algorithms.bruck.bruck` are registered as :data:`ringlet.algorithms.ALLTOALL`.

A schedule may also need *local copies* (the schedule model has none): ``meta["copies"]`` then holds
boundaries of per-rank ``(n, 5)`` int64 arrays of ``(src_buf, src_offset, dst_buf, dst_offset, count)``
copies. With ``meta["rounds"]`` (the steps as one-step schedules) there is a boundary before every
step and one after the last, and the schedule runs round by round (Bruck packs each round's blocks
together); without it there are two, before and after, and the steps run as one schedule (the
two-level schedule puts each handler's own blocks beside the ones it gathers). :func:`rounds` gives
what runs between the boundaries. The simulator and the cost model read the steps alone (local copies cost them
nothing).
"""
from __future__ import annotations

import numpy as np
import torch

from .cache import cached
from .schedule import Schedule, ScheduleBuilder

Counts = tuple[tuple[int, ...], ...]

__all__ = ["Counts", "matrix", "offsets", "pairwise", "scratch_elems", "local_copy", "rounds", "merge_pieces"]


def matrix(p: int, send_counts: Counts) -> np.ndarray:
    """``send_counts`` as a ``p × p`` int64 array; ``ValueError`` for another shape or a negative count."""
    counts = np.asarray(send_counts, dtype=np.int64)
    if counts.shape != (p, p):
        raise ValueError(f"send_counts must be {p} rows of {p} counts, got shape {counts.shape}")
    if counts.size and counts.min() < 0:
        raise ValueError("send_counts must be non-negative")
    return counts


def offsets(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(send_off, recv_off)``: ``send_off[r, d]`` where ``r``'s block for ``d`` starts in ``r``'s input,
    ``recv_off[s, d]`` where ``s``'s block lands in ``d``'s output."""
    return np.cumsum(counts, axis=1) - counts, np.cumsum(counts, axis=0) - counts


@cached
def pairwise(p: int, send_counts: Counts) -> Schedule:
    """In step ``k`` rank ``r`` sends to ``r+k`` and receives from ``r-k``: ``p-1`` steps, one message
    per rank per step, straight from input to output. No step depends on another's data, so the
    executor keeps every step's messages in flight at once."""
    b = ScheduleBuilder("pairwise_alltoall", p)
    counts = matrix(p, send_counts)
    send_off, recv_off = offsets(counts)
    r = np.arange(p)
    for k in range(1, p):
        d = (r + k) % p
        b.new_step()
        b.add_many(r, d, send_off[r, d], counts[r, d], dst_offset=recv_off[r, d], src_buf=1, dst_buf=0)
    return b.build()


def scratch_elems(schedule: Schedule, rank: int) -> int:
    """Elements of buffer 2 that ``rank`` needs for ``schedule`` (0: none)."""
    need = schedule.meta.get("scratch")
    return int(need[rank]) if need else 0


def merge_pieces(pieces: list[tuple[int, int, int, int, int]]) -> list[tuple[int, int, int, int, int]]:
    """``(src_buf, src_off, dst_buf, dst_off, count)`` pieces in order, empty ones dropped and each
    merged into the one before when both its ranges continue that one's."""
    out: list[list[int]] = []
    for sb, so, db, do, c in pieces:
        if c <= 0:
            continue
        if out:
            last = out[-1]
            if last[0] == sb and last[2] == db and last[1] + last[4] == so and last[3] + last[4] == do:
                last[4] += c
                continue
        out.append([sb, so, db, do, c])
    return [tuple(x) for x in out]


def local_copy(copies: np.ndarray, buffers: tuple[torch.Tensor, ...]) -> None:
    """Apply one boundary's copies of one rank (rows of ``(src_buf, src_off, dst_buf, dst_off, count)``)."""
    for sb, so, db, do, c in copies.tolist():
        buffers[db][do:do + c].copy_(buffers[sb][so:so + c])


def rounds(schedule: Schedule) -> tuple[Schedule, ...]:
    """What runs between the boundaries of ``meta["copies"]``: the one-step schedules of
    ``meta["rounds"]`` (round ``k`` with the tags of step ``k``), or the schedule itself. A rank runs
    boundary 0's copies, then each round followed by the next boundary's copies (after the last round,
    the last boundary's)."""
    return schedule.meta.get("rounds") or (schedule,)
