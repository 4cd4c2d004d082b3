"""The requests the core API queues: one object per collective call, run by the runtime's queue.

The core API (:mod:`ringlet.collectives`) checks a call's arguments, builds one of these and hands it
to :meth:`ringlet.runtime.Runtime.submit_op`; when its turn comes the runtime takes the channel of
the request's ``group`` (in execution order, so the tags agree on every member) and calls
``request.run(channel)``, which agrees on the op's metadata record (:mod:`ringlet.engine.agree`) and
runs the engine's operation. Nothing here calls back into the API or the runtime.

A request is not changed once queued (plain slotted classes, not frozen ones: a frozen dataclass's
construction costs about a microsecond more, on every call). Every request holds already-validated
arguments: ``buf`` is the tensor the op works on (the API cloned
it where the caller's tensor must stay untouched), ``check`` says whether the members' records are
compared before data moves (``RINGLET_CHECK`` or the call's ``check=``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms import AUTO
from ..group import Group
from ..types import Reduction
from . import a2a_counts, agree, ops
from .allreduce import Compressed, allreduce_
from .channel import Channel
from .compressed import describe
from .meta import Kind, Meta

__all__ = ["AllreduceRequest", "RootedRequest", "AllgatherRequest", "ReduceScatterRequest", "AlltoallRequest",
           "BarrierRequest"]

_METAS: dict[tuple, Meta] = {}  # dense all-reduce records by (dtype, shape, device, op, algorithm, scales)
_METAS_MAX = 256


def _dense_meta(buf: torch.Tensor, op: int, algo: str, pre: float, post: float) -> Meta:
    """The record of a dense all-reduce of ``buf``; the same object for the same call (a training loop's
    calls repeat a few shapes, and a record encodes once)."""
    key = (buf.dtype, buf.shape, buf.device, op, algo, pre, post)
    meta = _METAS.get(key)
    if meta is None:
        if len(_METAS) >= _METAS_MAX:
            _METAS.clear()
        forced = "" if algo == AUTO else algo
        meta = _METAS[key] = Meta.of("", Kind.ALLREDUCE, buf, op=op, algorithm=forced, pre=pre, post=post)
    return meta


def _compressed_meta(buf: torch.Tensor, op: int, algo: str, pre: float, post: float, spec: Compressed) -> Meta:
    """The record of a compressed all-reduce of ``buf``: the compression described (compressor, strategy,
    payload size) so that members compressing differently disagree."""
    return Meta.of(spec.name, Kind.ALLREDUCE, buf, op=op, pre=pre, post=post,
                   algorithm="" if algo == AUTO else algo,
                   compression=describe(spec.compressor, buf.numel(), spec.strategy))


@dataclass(slots=True)
class AllreduceRequest:
    """One all-reduce: ``buf`` reduced in place over ``group`` and returned, with the reduction, the
    requested algorithm (:func:`ringlet.tuning.select.requested`'s name), the scale factors and the
    compression (None: dense), through the engine's one entry (:func:`ringlet.engine.allreduce.allreduce_`).
    ``ran``: what ran, once run (that function's answer)."""

    group: Group
    buf: torch.Tensor
    red: Reduction
    algorithm: str
    pre: float
    post: float
    check: bool
    compressed: Compressed | None = None
    ran: str = ""

    def run(self, ch: Channel) -> torch.Tensor:
        buf, red, algo, pre, post, spec = self.buf, self.red, self.algorithm, self.pre, self.post, self.compressed
        if spec is None:
            meta = _dense_meta(buf, red.op, algo, pre, post) if self.check else None
            self.ran = allreduce_(ch, buf if buf.dim() == 1 else buf.view(-1), red, algo, pre, post, meta)
        else:
            meta = _compressed_meta(buf, red.op, algo, pre, post, spec) if self.check else None
            self.ran = allreduce_(ch, buf.view(-1), red, algo, pre, post, meta, spec)
        return buf


@dataclass(slots=True)
class RootedRequest:
    """A broadcast (``kind`` BROADCAST: every member's ``buf`` becomes group rank ``root``'s) or a reduce
    (REDUCE: ``root``'s ``buf`` becomes the reduction; other members get their input back). Returns
    ``buf``."""

    group: Group
    buf: torch.Tensor
    kind: Kind
    root: int
    red: Reduction
    check: bool

    def run(self, ch: Channel) -> torch.Tensor:
        buf, g = self.buf, self.group
        if self.check:
            agree.agree(ch, Meta.of("", self.kind, buf, op=self.red.op if self.kind == Kind.REDUCE else 0,
                                    root=g.ranks[self.root]))
        if self.kind == Kind.BROADCAST:
            ops.broadcast_(ch, buf.view(-1), self.root)
        else:
            # Interior tree ranks accumulate partial results: off the root, work on a copy and return the input.
            ops.reduce_(ch, buf.view(-1) if ch.rank == self.root else buf.reshape(-1).clone(), self.root, self.red)
        return buf


@dataclass(slots=True)
class AllgatherRequest:
    """A ragged all-gather of ``tensor`` along dim 0 with ``algorithm`` (a name of
    :func:`ringlet.tuning.select.allgather`). ``sizes``: every member's first dimension as the caller
    gave them (None: exchanged); with ``check`` False they are trusted and nothing is exchanged first.
    ``verify``: the records are compared where they are exchanged (``RINGLET_CHECK``)."""

    group: Group
    tensor: torch.Tensor
    algorithm: str
    sizes: tuple[int, ...] | None
    check: bool
    verify: bool

    def run(self, ch: Channel) -> torch.Tensor:
        tensor, sizes = self.tensor, self.sizes
        own = tensor.shape[0] if tensor.dim() else 1
        if sizes is not None and not self.check:
            dim0s = list(sizes)  # the caller vouches for every member's first dimension
        else:
            metas = agree.agree(ch, Meta.of("", Kind.ALLGATHER, tensor, algorithm=self.algorithm), check=self.verify)
            # No records: every member's record equals this one, first dimension included.
            dim0s = [own] * self.group.size if metas is None else [m.shape[0] if m.shape else 1 for m in metas]
        out = ops.allgather_rows(ch, tensor, dim0s, self.algorithm)
        if sizes is not None and dim0s != list(sizes):
            # Raised after the data moved by the exchanged sizes, so that members whose lists were right
            # are not left waiting for this one.
            raise ValueError(f"allgather: sizes={list(sizes)} given, but the members' first dimensions are {dim0s}")
        return out


@dataclass(slots=True)
class ReduceScatterRequest:
    """Horovod's reduce-scatter of ``buf`` (consumed as scratch): a new tensor of this member's rows."""

    group: Group
    buf: torch.Tensor
    red: Reduction
    pre: float
    post: float
    check: bool

    def run(self, ch: Channel) -> torch.Tensor:
        if self.check:
            agree.agree(ch, Meta.of("", Kind.REDUCESCATTER, self.buf, op=self.red.op, pre=self.pre, post=self.post))
        return ops.reduce_scatter_rows(ch, self.buf, self.red, self.pre, self.post)


@dataclass(slots=True)
class AlltoallRequest:
    """An all-to-all of ``tensor``'s rows, ``splits[d]`` of them to member ``d``, by ``algorithm`` (a
    name of :func:`ringlet.tuning.select.alltoall`): ``(output, received splits)``. ``recv_splits``: the
    rows this member receives from each (None: unknown). With them, ``"auto"`` and ``"pairwise"`` run the
    pairwise exchange without exchanging counts (checked, when ``check``, in the one round every checked
    op makes: :func:`ringlet.engine.a2a_counts.check_known`); a schedule that needs the whole count matrix
    exchanges it (:func:`ringlet.engine.a2a_counts.exchange`, which checks the receive counts too)."""

    group: Group
    tensor: torch.Tensor
    splits: tuple[int, ...]
    check: bool
    algorithm: str = AUTO
    recv_splits: tuple[int, ...] | None = None

    def run(self, ch: Channel) -> tuple[torch.Tensor, list[int]]:
        algo, t, send, recv = self.algorithm, self.tensor, self.splits, self.recv_splits
        forced = "" if algo == AUTO else algo
        if recv is not None and algo in (AUTO, "pairwise"):
            if self.check:
                a2a_counts.check_known(ch, t, forced, send, recv)
            return ops.alltoall_rows(ch, t, None, algorithm=algo, send=send, recv=recv)
        matrix = a2a_counts.exchange(ch, t, forced, send, recv, self.check)
        return ops.alltoall_rows(ch, t, matrix, algorithm=algo)


@dataclass(slots=True)
class BarrierRequest:
    """A barrier over ``group``; returns None."""

    group: Group
    check: bool

    def run(self, ch: Channel) -> None:
        if self.check:
            agree.agree(ch, Meta("", Kind.BARRIER))
        ops.barrier(ch)
