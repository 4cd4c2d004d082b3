"""Compressed all-reduce: a flat floating tensor summed (or averaged) over the group, where every byte
that travels is a payload of a :class:`~ringlet.compression.base.Compressor`.

:func:`compressed_allreduce_` reduces in place; the result is cast back to the input's dtype, and
everything in between is float32 (payloads are decompressed before they are added, so float16 cannot
overflow while summing and int8 cannot saturate). Every member ends with bitwise-identical values. Like
every operation of the engine it trusts that the members agree on the size (the front end checked it)
and it exchanges no sizes: ``compressor.wire_bytes(n)`` tells every member every payload's size.

Strategies (``strategy=None`` takes the compressor's ``reduces_by``):

``"sum"``
    The payload is linear in the input (``none``): decompress it and all-reduce the float32 values with
    :func:`ringlet.engine.ops.allreduce_` (any algorithm).
``"scatter"``
    Dense payloads. The buffer is cut into ``p`` blocks (:func:`~ringlet.engine.ops.split_rows`); each
    block is compressed on its own (state ``("rs", j)``) and an all-to-all hands block ``j``'s payloads
    to rank ``j``, which accumulates the ``p`` of them in float32, its own compressed payload among them
    (every contribution is treated alike), averages when asked, compresses the reduced block again
    (state ``("ag", j)``) and all-gathers it. Every member, the block's owner too, decompresses every
    reduced block from the gathered payloads. ``2(p-1)/p`` payloads sent per rank, two quantisations.
``"ring"``
    Dense payloads, re-quantised at every hop: a ring reduce-scatter where each rank decompresses the
    incoming partial sum, adds its own block in float32, compresses the sum (state ``("ring", j)``)
    and forwards it; then the same all-gather as ``"scatter"``. The same bytes as ``"scatter"`` but
    ``p-1`` dependent hops, each with a compression and a decompression on its critical path, and up to
    ``p`` quantisations of a partial sum. Kept for measurement (docs/compression.md).
``"gather"``
    Sparse payloads: every member's whole payload is all-gathered and accumulated with
    ``compressor.accumulate_`` into a float32 buffer; nothing is densified before it is sent.
``"custom"``
    The compressor runs its own schedule (:meth:`~ringlet.compression.base.Compressor.allreduce_`, e.g.
    PowerSGD), given an in-place float32 SUM all-reduce over the group and the tensors' ``shapes``.

State: ``state`` is the caller's dict for this buffer, the same one every call (error-feedback
residuals, PowerSGD's ``Q``); the block strategies keep one sub-dict per block and phase in it, so the
same block meets the same sub-dict every step. ``algorithm``: the all-reduce algorithm of ``"sum"`` and
``"custom"``; for the others ``"direct"`` picks the direct all-gather, anything else the ring.

Tags: the phases of one call use the channel's steps ``[0, 2p)`` (the all-to-all or the ring hops
first, the all-gather from step ``p``). Memory: the byte buffers that payloads travel in are kept in the
channel's workspace between calls, like the executor's scratch (fresh buffers of tens of MiB cost a
page fault per 4 KiB every call).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from ..algorithms import ring
from ..compression.base import check_input
from ..types import ReduceOp, reduction
from . import ops
from .channel import META_STEP, Channel
from .payloads import Blocks, Contexts, put_payload, workspace_bytes

if TYPE_CHECKING:
    from ..compression.base import Compressor

__all__ = ["STRATEGIES", "strategy_of", "compressed_allreduce_", "describe"]

STRATEGIES = ("sum", "scatter", "ring", "gather", "custom")
_ANY = ("scatter", "ring", "gather")  # need only compress / decompress / accumulate_: any compressor


def strategy_of(compressor: Compressor, strategy: str | None = None) -> str:
    """The strategy a compressed all-reduce with ``compressor`` runs: ``strategy`` when given, else the
    compressor's ``reduces_by``. ``"scatter"``, ``"ring"`` and ``"gather"`` suit any compressor;
    ``"sum"`` and ``"custom"`` only those that reduce so. ``ValueError`` otherwise."""
    how = compressor.reduces_by if strategy is None else strategy
    if how not in STRATEGIES:
        raise ValueError(f"unknown compressed all-reduce strategy {how!r}; choose one of {', '.join(STRATEGIES)}")
    if how not in _ANY and how != compressor.reduces_by:
        raise ValueError(f"strategy {how!r} needs a compressor that reduces by it; {compressor.name} reduces by "
                         f"{compressor.reduces_by!r}")
    return how


def describe(compressor: Compressor, numel: int, strategy: str | None = None) -> str:
    """What every member of a compressed all-reduce must agree on, as a short string for the metadata
    record: the compressor's name, the strategy and the payload size of ``numel`` elements (so that two
    compressors of one name with different parameters differ too)."""
    return f"{compressor.name} {strategy_of(compressor, strategy)} {compressor.wire_bytes(numel)}B"


@dataclass(frozen=True, slots=True)
class _Job:
    """One call: where it runs and how."""

    ch: Channel
    comp: Any
    state: dict
    average: bool
    algorithm: str
    shapes: Sequence[tuple[int, ...]] | None

    def buffer(self, role: str, nbytes: int, device: torch.device) -> torch.Tensor:
        """``nbytes`` bytes for one role of this call (``send``, ``recv``, ``gather``), kept in the
        channel's workspace between calls when it has one."""
        return workspace_bytes(self.ch, ("engine.compressed", role, device), nbytes, device)

    def phase(self, first_step: int) -> Channel:
        """The channel whose step 0 is this call's step ``first_step``."""
        return dataclasses.replace(self.ch, tag=self.ch.tag + first_step)

    def sub(self, phase: str, block: int) -> dict:
        """The state of one block in one phase (the same dict every call)."""
        return self.state.setdefault((phase, block), {})

    def scale_(self, acc: torch.Tensor) -> torch.Tensor:
        """Average, when asked, as the engine's AVG does (one multiplication by ``1/p``)."""
        return ops.scale_(acc, 1.0 / self.ch.size) if self.average else acc

    @property
    def gather_algorithm(self) -> str:
        return "direct" if self.algorithm == "direct" else "ring"


def compressed_allreduce_(ch: Channel, flat: torch.Tensor, compressor: Compressor, state: dict | None,
                          average: bool, shapes: Sequence[tuple[int, ...]] | None = None, *,
                          strategy: str | None = None, algorithm: str = "auto") -> torch.Tensor:
    """Replace ``flat`` (contiguous 1-D floating) by the sum over the group of its compressed
    approximations, divided by the group size when ``average``; returns ``flat``. ``state``: the
    caller's dict for this buffer (None: a fresh one, no memory between calls); ``shapes``: the tensors
    ``flat`` concatenates (for ``"custom"``); ``strategy`` and ``algorithm``: see the module doc.
    ``TypeError`` for a non-floating input, ``ValueError`` for a strategy the compressor cannot take or a
    payload whose size is not ``wire_bytes``. Every member must pass the same sizes, compressor and
    strategy."""
    how = strategy_of(compressor, strategy)
    check_input(flat, "compressed all-reduce")
    if 2 * ch.size > META_STEP:
        raise ValueError(f"a compressed all-reduce supports groups of up to {META_STEP // 2} ranks")
    if flat.numel() == 0:
        return flat
    job = _Job(ch, compressor, {} if state is None else state, bool(average), algorithm, shapes)
    work = flat if flat.dtype == torch.float32 else flat.float()
    out = _RUN[how](job, work)
    if out.data_ptr() != flat.data_ptr() or out.dtype != flat.dtype:
        flat.copy_(out)
    return flat


# ---- helpers ------------------------------------------------------------------------------------------
_put, _Blocks, _Contexts = put_payload, Blocks, Contexts


def _allgather_blocks(job: _Job, blocks: _Blocks, reduced: torch.Tensor, ctxs: _Contexts,
                      out: torch.Tensor) -> torch.Tensor:
    """This rank's reduced block compressed again, every block's payload all-gathered, and every block
    (this rank's too) decompressed from the gathered payloads into ``out``."""
    ch, comp, me = job.ch, job.comp, job.ch.rank
    buf = job.buffer("gather", blocks.total_wire, out.device)
    if blocks.counts[me]:
        _put(blocks.payload(buf, me), ctxs.compress(reduced, job.sub("ag", me)), comp)
    ops.allgather_(job.phase(ch.size), buf, blocks.wire, job.gather_algorithm)
    for j, c in enumerate(blocks.counts):
        if c:
            blocks.elems(out, j).copy_(comp.decompress(blocks.payload(buf, j), ctxs.of(c)))
    return out


# ---- strategies ---------------------------------------------------------------------------------------
def _sum(job: _Job, work: torch.Tensor) -> torch.Tensor:
    payload, ctx = job.comp.compress(work, job.state)
    vals = job.comp.decompress(payload, ctx)
    if vals.dtype != torch.float32 or not vals.is_contiguous():
        vals = vals.float().contiguous()
    red = reduction(ReduceOp.AVG if job.average else ReduceOp.SUM)
    ops.allreduce_(job.ch, vals, red, job.algorithm)
    return vals


def _scatter(job: _Job, work: torch.Tensor) -> torch.Tensor:
    ch, comp = job.ch, job.comp
    p, me = ch.size, ch.rank
    blocks = _Blocks.of(work.numel(), p, comp)
    ctxs = _Contexts(comp, work.device)
    send = job.buffer("send", blocks.total_wire, work.device)
    for j, c in enumerate(blocks.counts):
        if c:
            _put(blocks.payload(send, j), ctxs.compress(blocks.elems(work, j), job.sub("rs", j)), comp)
    # Every rank sends block d's payload to rank d and receives p payloads of its own block, in rank order.
    own, w = blocks.counts[me], blocks.wire[me]
    recv, _ = ops.alltoall_rows(job.phase(0), send, [list(blocks.wire)] * p, job.buffer("recv", p * w, work.device))
    reduced = torch.zeros(own, dtype=torch.float32, device=work.device)
    if own:
        ctx = ctxs.of(own)
        for s in range(p):
            comp.accumulate_(reduced, recv[s * w:(s + 1) * w], ctx)
    return _allgather_blocks(job, blocks, job.scale_(reduced), ctxs, work)


def _ring(job: _Job, work: torch.Tensor) -> torch.Tensor:
    ch, comp = job.ch, job.comp
    p, me = ch.size, ch.rank
    blocks = _Blocks.of(work.numel(), p, comp)
    ctxs = _Contexts(comp, work.device)
    acc = blocks.elems(work, me).clone()  # p == 1: the block is its own sum
    if p > 1:
        payload = _ring_compress(job, ctxs, blocks, blocks.elems(work, (me - 1) % p), (me - 1) % p)
    for s in range(p - 1):
        # Hop s: rank r forwards its partial sum of block r-s-1; this rank receives block me-s-2.
        sizes = tuple(blocks.wire[(r - s - 1) % p] for r in range(p))
        recv = job.buffer("recv", sizes[(me - 1) % p], work.device)
        job.phase(s).run(ring.shift(p, sizes), (recv, payload))
        b = (me - s - 2) % p
        acc = blocks.elems(work, b).clone()
        if blocks.counts[b]:
            comp.accumulate_(acc, recv, ctxs.of(blocks.counts[b]))
        if s < p - 2:
            payload = _ring_compress(job, ctxs, blocks, acc, b)
    return _allgather_blocks(job, blocks, job.scale_(acc), ctxs, work)


def _ring_compress(job: _Job, ctxs: _Contexts, blocks: _Blocks, partial: torch.Tensor, b: int) -> torch.Tensor:
    """The payload of this rank's partial sum of block ``b`` (empty for an empty block)."""
    out = torch.empty(blocks.wire[b], dtype=torch.uint8, device=partial.device)
    if blocks.counts[b]:
        _put(out, ctxs.compress(partial, job.sub("ring", b)), job.comp)
    return out


def _gather(job: _Job, work: torch.Tensor) -> torch.Tensor:
    ch, comp = job.ch, job.comp
    p, me, n = ch.size, ch.rank, work.numel()
    w = comp.wire_bytes(n)
    payload, ctx = comp.compress(work, job.state)
    buf = job.buffer("gather", p * w, work.device)
    _put(buf[me * w:(me + 1) * w], payload, comp)
    ops.allgather_(ch, buf, [w] * p, job.gather_algorithm)
    acc = torch.zeros(n, dtype=torch.float32, device=work.device)
    for s in range(p):  # in rank order on every member: the same bits everywhere
        comp.accumulate_(acc, buf[s * w:(s + 1) * w], ctx)
    return job.scale_(acc)


def _custom(job: _Job, work: torch.Tensor) -> torch.Tensor:
    # The compressor's schedule gets the engine's schedule all-reduce itself (an in-place float32 SUM),
    # not a function of this module: its calls go down to the executor without coming back here.
    # Consecutive calls reuse the channel's tags: messages of one (sender, receiver, tag) match in the
    # order they were posted, and every member makes the same calls in the same order.
    allreduce = functools.partial(ops.allreduce_, job.ch, red=reduction(ReduceOp.SUM), algorithm=job.algorithm)
    shapes = None if job.shapes is None else [tuple(s) for s in job.shapes]
    out = job.comp.allreduce_(work, job.state, allreduce, shapes)
    return job.scale_(work if out is None else out)


_RUN: dict[str, Callable[[_Job, torch.Tensor], torch.Tensor]] = {
    "sum": _sum, "scatter": _scatter, "ring": _ring, "gather": _gather, "custom": _custom}
