"""Flat-buffer collectives on agreed sizes: the operations every front end runs.

Each takes a :class:`~ringlet.engine.channel.Channel` (this op's group, rank, tags and scratch) and
contiguous tensors whose sizes every member already agrees on — the front end made sure of that (the
core API by its metadata check, the Horovod coordinator by negotiation, DDP by its fixed bucket
layout). Nothing here exchanges metadata. Results match :mod:`ringlet.algorithms.reference`.

Reductions are :class:`~ringlet.types.Reduction` objects; ``pre``/``post`` scale factors apply before
and after the reduction, and an averaging reduction divides by the group size once, at the end.
Integer tensors are scaled in float64 and truncated toward zero.

Where more than one algorithm could run, the channel's selector (``Channel.selector``: a
:class:`ringlet.tuning.select.Selector`, handed over by whoever built the channel) chooses; this module
does not import the tuning package.

Every front end's all-reduce enters the engine at :func:`ringlet.engine.allreduce.allreduce_`, which
chooses between the transport's small-message path, the compressed all-reduce and :func:`allreduce_`
(the schedule this module runs) and calls down into them.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from ..algorithms import ALLREDUCE, ALLTOALL, AUTO, NATIVE, binomial, direct, ring
from ..algorithms import alltoall as alltoall_alg
from ..algorithms import barrier as barrier_alg
from ..algorithms.scratch import scratch
from ..types import Reduction, dtype_name
from .channel import Channel

_ALLGATHER = {"ring": ring.allgather, "direct": direct.allgather}


def scale_(t: torch.Tensor, factor: float) -> torch.Tensor:
    """``t *= factor`` in place; integers are scaled in float64 and truncated toward zero."""
    if factor == 1.0 or t.numel() == 0:
        return t
    if t.is_floating_point():
        return t.mul_(factor)
    return t.copy_(torch.trunc(t.double() * factor))


def finish_(t: torch.Tensor, red: Reduction, size: int, post: float) -> torch.Tensor:
    """Apply the postscale factor, divided by ``size`` for an averaging reduction."""
    return scale_(t, post / size if red.averages else post)


def split_rows(rows: int, p: int) -> list[int]:
    """Horovod's split of dim 0: the first ``rows % p`` ranks get one extra row."""
    return [rows // p + (1 if r < rows % p else 0) for r in range(p)]


def row_numel(t: torch.Tensor) -> int:
    """Elements per row of dim 0 (1 for a 0-d tensor), also when dim 0 is empty."""
    n = 1
    for s in t.shape[1:]:
        n *= s
    return n


# ---- all-reduce -------------------------------------------------------------------------------
def _selector(ch: Channel):
    """The channel's algorithm selector; ``ValueError`` when whoever built the channel handed none."""
    if ch.selector is None:
        raise ValueError("this channel has no algorithm selector: build it with selector= (a "
                         "ringlet.tuning.select.Selector; Runtime.channel hands the runtime's).")
    return ch.selector


def allreduce_(ch: Channel, flat: torch.Tensor, red: Reduction, algorithm: str = AUTO,
               pre: float = 1.0, post: float = 1.0) -> str:
    """Reduce ``flat`` over the group in place by a schedule (or the backend's own all-reduce); returns
    the algorithm that ran (``""`` when nothing moved). ``algorithm``: a name from
    :func:`ringlet.tuning.select.requested` — ``"auto"`` or forced — that the channel's selector turns
    into what runs. A forced ``"native"`` the transport cannot run (no native all-reduce, or not for
    this dtype) raises ``ValueError``; ``"auto"`` then falls back to ringlet's schedules."""
    scale_(flat, pre)
    ran = ""
    if ch.size > 1 and flat.numel() > 0:
        nbytes, itemsize = flat.numel() * flat.element_size(), flat.element_size()
        host_of, selector, caps = ch.group.host_of, _selector(ch), ch.transport.capabilities
        choice = selector.allreduce(algorithm, ch.size, nbytes, host_of, caps, itemsize)
        if choice.algorithm == NATIVE and not ch.transport.native_allreduce(flat, red.op, ch.peers):
            if algorithm == NATIVE:
                raise ValueError(f"algorithm 'native' is not available on the {ch.transport.name} transport "
                                 f"for {dtype_name(flat.dtype)} tensors.")
            choice = selector.allreduce(AUTO, ch.size, nbytes, host_of, dataclasses.replace(caps, native_small=False),
                                        itemsize)
        ran = choice.algorithm
        if ran != NATIVE:
            run_on = ch if choice.segment_bytes is None else dataclasses.replace(ch, segment_bytes=choice.segment_bytes)
            run_on.run(ALLREDUCE[ran](ch.size, flat.numel(), host_of), (flat,), red.combine)
    finish_(flat, red, ch.size, post)
    return ran


# ---- reduce-scatter -------------------------------------------------------------------------------
def reduce_scatter_(ch: Channel, flat: torch.Tensor, counts: Sequence[int], red: Reduction) -> torch.Tensor:
    """Reduce ``flat`` (``sum(counts)`` elements) so that this rank's block — ``counts[rank]`` elements
    after the blocks of lower ranks — holds the reduction over the group (not yet averaged or scaled);
    the rest of ``flat`` is scratch afterwards. Returns a view of the block."""
    start = sum(counts[:ch.rank])
    if ch.size > 1 and flat.numel() > 0:
        ch.run(ring.reduce_scatter(ch.size, tuple(counts)), (flat,), red.combine)
    return flat[start:start + counts[ch.rank]]


def reduce_scatter_rows(ch: Channel, work: torch.Tensor, red: Reduction, pre: float = 1.0,
                        post: float = 1.0) -> torch.Tensor:
    """Horovod's reduce-scatter: reduce ``work`` (consumed as scratch) over the group and return a new
    tensor of this rank's rows of dim 0 (:func:`split_rows`)."""
    rows = split_rows(work.shape[0], ch.size)
    row = row_numel(work)
    flat = work.view(-1)
    scale_(flat, pre)
    block = reduce_scatter_(ch, flat, [r * row for r in rows], red)
    out = block.clone().view((rows[ch.rank],) + tuple(work.shape[1:]))
    return finish_(out, red, ch.size, post)


# ---- all-gather -------------------------------------------------------------------------------------
def allgather_(ch: Channel, flat: torch.Tensor, counts: Sequence[int], algorithm: str = "ring") -> None:
    """Fill ``flat`` with every member's block in rank order; this rank's block (``counts[rank]``
    elements after the lower ranks' blocks) must already hold its data. ``algorithm``: ring, direct or
    ``"auto"`` (the channel's selector chooses: :func:`ringlet.tuning.select.allgather_choice`)."""
    if ch.size > 1 and sum(counts) > 0:
        name = algorithm
        if algorithm not in _ALLGATHER:
            name = _selector(ch).allgather(algorithm, tuple(counts), flat.element_size(), tuple(ch.group.host_of))
        ch.run(_ALLGATHER[name](ch.size, tuple(counts)), (flat,))


def allgather_rows(ch: Channel, t: torch.Tensor, dim0s: Sequence[int], algorithm: str = "ring") -> torch.Tensor:
    """Concatenate every member's ``t`` along dim 0 (member ``i`` has ``dim0s[i]`` rows; a 0-d tensor
    is one row). Returns a new tensor."""
    row = row_numel(t)
    counts = [d * row for d in dim0s]
    out_shape = (sum(dim0s),) + tuple(t.shape[1:]) if t.dim() else (ch.size,)
    out = torch.empty(out_shape, dtype=t.dtype, device=t.device)
    flat = out.view(-1)
    off = sum(counts[:ch.rank])
    flat[off:off + counts[ch.rank]].copy_(t.reshape(-1))
    allgather_(ch, flat, counts, algorithm)
    return out


# ---- rooted -------------------------------------------------------------------------------------------
def broadcast_(ch: Channel, flat: torch.Tensor, root: int) -> None:
    """Every member's ``flat`` becomes group rank ``root``'s."""
    if ch.size > 1 and flat.numel() > 0:
        ch.run(binomial.broadcast(ch.size, flat.numel(), root), (flat,))


def reduce_(ch: Channel, flat: torch.Tensor, root: int, red: Reduction) -> None:
    """Group rank ``root``'s ``flat`` becomes the reduction over the group (averaged for AVG); other
    members' ``flat`` is scratch afterwards (interior tree ranks accumulate partial results in it)."""
    if ch.size > 1 and flat.numel() > 0:
        ch.run(binomial.reduce(ch.size, flat.numel(), root), (flat,), red.combine)
    if ch.rank == root:
        finish_(flat, red, ch.size, 1.0)


# ---- all-to-all and barrier ---------------------------------------------------------------------------
def alltoall_rows(ch: Channel, t: torch.Tensor, all_splits: Sequence[Sequence[int]] | None,
                  out: torch.Tensor | None = None, algorithm: str = AUTO, *, send: Sequence[int] | None = None,
                  recv: Sequence[int] | None = None) -> tuple[torch.Tensor, list[int]]:
    """Member ``s`` sends ``all_splits[s][d]`` rows of its ``t`` to member ``d``; returns the received
    rows concatenated in rank order (in ``out`` when given: contiguous, of that shape and ``t``'s dtype)
    and how many came from each member. ``algorithm``: a name of :data:`ringlet.algorithms.ALLTOALL`, or
    ``"auto"`` (the channel's selector chooses from the count matrix:
    :func:`ringlet.tuning.select.alltoall_choice`). Instead of the matrix (``all_splits`` None), ``send``
    and ``recv``: the rows this member sends to and receives from each, which the caller made sure agree
    with the other members' (:mod:`ringlet.engine.a2a_counts`); the pairwise exchange then runs
    (``"auto"`` or ``"pairwise"``; another name raises ``ValueError``), which needs no other counts.
    Pairwise runs without a compiled schedule (:func:`pairwise_direct`)."""
    me, p = ch.rank, ch.size
    row = row_numel(t)
    if all_splits is not None:
        recv = [all_splits[s][me] for s in range(p)]
        send = all_splits[me]
    else:
        if algorithm not in (AUTO, "pairwise"):
            raise ValueError(f"alltoall: algorithm {algorithm!r} needs every member's counts; with only the "
                             "receive counts known, pairwise runs (or 'auto')")
        algorithm = "pairwise"
    recv = list(recv)
    if out is None:
        out = torch.empty((sum(recv),) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    src, dst = t.reshape(-1), out.view(-1)
    s_off, r_off, n_self = sum(send[:me]) * row, sum(recv[:me]) * row, send[me] * row
    dst[r_off:r_off + n_self].copy_(src[s_off:s_off + n_self])
    if p > 1:
        name = algorithm
        if name not in ALLTOALL:
            counts = tuple(tuple(c * row for c in sp) for sp in all_splits)
            name = _selector(ch).alltoall(algorithm, counts, t.element_size(), tuple(ch.group.host_of))
        if name == "pairwise":
            pairwise_direct(ch, src, dst, [c * row for c in send], [c * row for c in recv])
        else:
            counts = tuple(tuple(c * row for c in sp) for sp in all_splits)
            schedule = ALLTOALL[name](p, counts, tuple(ch.group.host_of))
            need = alltoall_alg.scratch_elems(schedule, me)
            work = scratch(ch.workspace, need, dst, key="engine.alltoall") if need else dst[:0]
            _run_alltoall(ch, schedule, (dst, src, work))
    return out, recv


def pairwise_direct(ch: Channel, src: torch.Tensor, dst: torch.Tensor, send: Sequence[int],
                    recv: Sequence[int]) -> None:
    """The pairwise schedule's messages (:func:`ringlet.algorithms.alltoall.pairwise`), posted straight
    from ``src`` (blocks of ``send[d]`` elements in member order) into ``dst`` (blocks of ``recv[s]``)
    without building or compiling a schedule: it has no dependencies, so every message is in flight at
    once. Step ``k-1`` (tag ``tag + k - 1``) sends to member ``me + k`` and receives from ``me - k``; each
    message is cut into segments as the executor cuts it (``segment_bytes``, at most the transport's
    ``max_segment_bytes``); empty blocks send nothing. Every member must use it for the same op (the
    segments differ from a compiled pairwise plan's order of posting, not in what travels)."""
    p, me = ch.size, ch.rank
    tr, peers, tag, timeout = ch.transport, ch.peers, ch.tag, ch.timeout
    seg_bytes, cap = ch.segment_bytes, tr.capabilities.max_segment_bytes
    seg = max(1, (min(seg_bytes, cap) if cap else seg_bytes) // max(1, src.element_size()))
    s_off = [0] * p
    r_off = [0] * p
    for r in range(1, p):
        s_off[r] = s_off[r - 1] + send[r - 1]
        r_off[r] = r_off[r - 1] + recv[r - 1]
    handles = []
    irecv, isend = tr.irecv, tr.isend
    for k in range(1, p):
        frm = (me - k) % p
        lo, hi = r_off[frm], r_off[frm] + recv[frm]
        for a in range(lo, hi, seg):
            handles.append(irecv(dst[a:min(a + seg, hi)], peers[frm], tag + k - 1))
    for k in range(1, p):
        to = (me + k) % p
        lo, hi = s_off[to], s_off[to] + send[to]
        for a in range(lo, hi, seg):
            handles.append(isend(src[a:min(a + seg, hi)], peers[to], tag + k - 1))
    tr.wait_all(handles, timeout)


def _run_alltoall(ch: Channel, schedule, bufs: tuple[torch.Tensor, ...]) -> None:
    """Run an all-to-all schedule with its local copies (:mod:`ringlet.algorithms.alltoall`): round
    ``k`` with the tags of step ``k``, each boundary's copies before it and the last boundary's after."""
    copies = schedule.meta.get("copies")
    if copies is None:
        ch.run(schedule, bufs)
        return
    for k, one in enumerate(alltoall_alg.rounds(schedule)):
        alltoall_alg.local_copy(copies[k][ch.rank], bufs)
        (ch if k == 0 else dataclasses.replace(ch, tag=ch.tag + k)).run(one, bufs)
    alltoall_alg.local_copy(copies[-1][ch.rank], bufs)


def barrier(ch: Channel) -> None:
    """Return once every member has entered (a dissemination barrier)."""
    if ch.size > 1:
        ch.run(barrier_alg.dissemination(ch.size), (torch.zeros(1, dtype=torch.uint8),))
