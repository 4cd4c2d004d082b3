"""Gradient reductions launched in one fixed order on ringlet's core queue, not matched by name.

``DistributedOptimizer`` reduces gradients in one of two ways. Matched by name (Horovod's way, through
the coordinator: ranks whose hooks fire in different orders still meet, at the price of a negotiation
round before each fused all-reduce), or in *units* launched in one order that every rank shares: the
reverse of the optimizer's parameter order (about the order backward produces the gradients). A unit
starts as soon as its gradients and those of every unit before it are final; ``synchronize()`` launches
the rest, a gradient that was never produced as zeros. A unit whose gradient comes late holds back the
units after it. Every rank runs the same sequence of units each step, so no round is needed: the
all-reduce starts from the autograd hook, as in torch's DDP.

:class:`OrderedGradients` is that launching discipline; its subclasses say what a unit is and how it
travels: :class:`FusedGradients` (here) fuses the parameters of a bucket into one plain all-reduce,
:class:`~ringlet.torch.compressed_grads.CompressedGradients` sends each gradient through a ringlet
compressor.
"""
from __future__ import annotations

from typing import Callable

import torch

from ringlet.types import ReduceOp

from .comm import Comm, CommFuture, session_key
from .fused_factors import FusedFactors
from .training.buckets import is_view_of, layout_buckets, take_into, tensors_sharing

__all__ = ["OrderedGradients", "FusedGradients", "serve_join", "start_header"]

GradOf = Callable[[torch.Tensor], torch.Tensor]


class OrderedGradients:
    """Launch ``units`` (lists of parameters) in their order as they become complete (see the module
    doc). Subclasses define ``_launch(i, grad_of)`` (start unit ``i``, returning what ``_deliver`` needs)
    and ``_deliver(pending)`` (wait for it and leave the result in ``.grad``)."""

    def __init__(self, units: list[list[torch.Tensor]]):
        self._set_units(units)

    def _set_units(self, units: list[list[torch.Tensor]]) -> None:
        """Launch ``units`` from now on (between steps only)."""
        self.units = units
        self.unit_of = {p: i for i, u in enumerate(units) for p in u}
        self._ready: list[set] = [set() for _ in units]
        self._pending: list = [None] * len(units)
        self._next = 0

    def ready(self, p: torch.Tensor, grad_of: GradOf) -> None:
        """``p``'s gradient of this step is final: launch every unit, in order, that is now complete."""
        i = self.unit_of[p]
        self._ready[i].add(p)
        while self._next < len(self.units) and len(self._ready[self._next]) == len(self.units[self._next]):
            self._pending[self._next] = self._launch(self._next, grad_of)
            self._next += 1

    def finish(self, grad_of: GradOf) -> None:
        """Launch what is left (``grad_of`` gives zeros for a gradient never produced), wait for every
        unit and leave the reduced gradients in ``.grad``; raises the first error after waiting for all."""
        while self._next < len(self.units):
            self._pending[self._next] = self._launch(self._next, grad_of)
            self._next += 1
        error = None
        for pending in self._pending:
            try:
                self._deliver(pending)
            except BaseException as exc:  # noqa: BLE001 - keep waiting so nothing is left in flight
                error = error or exc
        self.reset()
        if error is not None:
            raise error

    def reset(self) -> None:
        """Forget this step (what subclasses keep across steps stays)."""
        self._ready = [set() for _ in self.units]
        self._pending = [None] * len(self.units)
        self._next = 0

    def _launch(self, i: int, grad_of: GradOf):
        raise NotImplementedError

    def _deliver(self, pending) -> None:
        raise NotImplementedError


class FusedGradients(OrderedGradients):
    """The plain all-reduces of ``DistributedOptimizer``'s gradients, fused per bucket and launched in a
    fixed order (module doc). Buckets are filled from the end of ``params`` (the last layers' gradients
    come first in backward), one dtype per bucket, closed at ``first_cap`` bytes for the first and
    ``cap`` for the others (torch DDP's layout). ``compression``: Horovod's stateless ``compress`` /
    ``decompress`` pair, applied per gradient; wire tensors of several dtypes in one bucket go as one
    all-reduce per dtype. ``op``: ``ReduceOp.AVG`` or ``SUM`` (``ValueError`` otherwise), with
    ``prescale``/``postscale`` applied by the collective. ``sparse_reduce(p, grad)`` starts the
    name-matched reduction of a sparse gradient and returns a callable giving its result. ``register``
    records the optimizer where ``hvd.join()`` finds it and returns its serial number; it is called again
    in each new ringlet session (an elastic reset).

    Each step starts with a *header*, a two-element all-reduce ``[1, serial]`` launched with the step's first
    gradient (so it overlaps the rest of backward): a rank inside ``hvd.join()`` takes part with ``[0, 0]``
    and learns from the sum whether any member still steps, and which optimizer (``serial``: numbered in
    creation order, the same on every rank), then mirrors that step with zeros (:func:`serve_join`).
    Each unit's first all-reduce checks its layout across ranks (``MismatchError``), later ones do not.

    ``factors``: the sufficient-factor strategy (:class:`~ringlet.torch.fused_factors.FusedFactors`) or
    None; when it is active, the ranks vote at the end of the first step (stepped or served) and each
    weight it then factors is a unit of its own from the next step on."""

    def __init__(self, comm: Comm, params: list[torch.Tensor], names: dict, op: ReduceOp, compression,
                 sparse_reduce: Callable[[torch.Tensor, torch.Tensor], Callable[[], torch.Tensor]],
                 prescale: float = 1.0, postscale: float = 1.0, cap: int = 25 << 20, first_cap: int = 1 << 20,
                 register: Callable[["FusedGradients"], int] = lambda fused: 0, factors: FusedFactors | None = None):
        if op not in (ReduceOp.AVG, ReduceOp.SUM):
            raise ValueError(f"fused gradient reductions average or sum, got {op!r}")
        self.params, self._names, self._caps = params, names, (cap, first_cap)
        self.factors = factors if factors is not None and factors.active else None
        self._steps = 0  # steps of this session, stepped or served
        self._layouts: dict[frozenset, tuple] = {}
        self._use({})
        self.comm, self.op, self.compression = comm, op, compression
        self.sparse_reduce = sparse_reduce
        self.prescale, self.postscale = prescale, postscale
        self._register = register
        self._session = session_key()
        self.serial = register(self)
        self._header: tuple[CommFuture, torch.Tensor] | None = None
        self._take = take_into  # how a reduced gradient reaches .grad

    def _use(self, factored: dict) -> None:
        """Launch units with the weights in ``factored`` (ids) reduced from factors, the rest fused into
        buckets. Each layout is built once and kept with its own buffers and checked flags (the factor
        trial switches between two every step); a unit's first all-reduce checks its layout."""
        key = frozenset(factored)
        lay = self._layouts.get(key)
        if lay is None:
            units = layout_buckets(self.params, key, *self._caps)
            flags = [len(u) == 1 and id(u[0]) in key for u in units]
            names = [f"{self._names[u[0]]}.{'factors' if f else 'fused'}" for u, f in zip(units, flags)]
            lay = self._layouts[key] = (units, flags, names, [False] * len(units), [{} for _ in units])
        units, self._factored, self.names, self._checked, self._keep = lay
        self._set_units(units)

    def _between_steps(self) -> None:
        """Before a step (stepped or served): after an elastic reset (a new ringlet session) forget the
        layouts (their checked flags), register again (a replacement rank starts with a fresh optimizer)
        and go back to dense units until the session's first step decides again."""
        key = session_key()
        if key != self._session:
            self._session = key
            self._steps = 0
            if self.factors is not None:
                self.factors.reset()
            self._layouts.clear()
            self._use({})
            self.serial = self._register(self)

    def _after_step(self, stepping: bool) -> None:
        """After a step (stepped or served): at the end of the session's first, the ranks' one vote on
        the factored weights; then the factor trial's timing; then the next step's layout."""
        self._steps += 1
        f = self.factors
        if f is None:
            return
        if not f.decided and self._steps == 1:
            votes = f.vote(stepping, self.comm.live_size)
            self.comm.allreduce_(votes, ReduceOp.SUM, "fused.factor_vote", check=False).wait()
            f.decide(votes)
            f.start_trial(self._sum_across_ranks)
        else:
            f.step_ended()
        self._use(f.in_use())

    def _sum_across_ranks(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        self.comm.allreduce_(t, ReduceOp.SUM, "fused.factor_trial", check=False).wait()
        return t.tolist()

    def _start_step(self) -> None:
        """The step's header (after :meth:`_between_steps`)."""
        self._between_steps()
        self._header = start_header(self.comm, 1.0, self.serial)

    # ---- one step ---------------------------------------------------------------------------------
    def ready(self, p: torch.Tensor, grad_of: GradOf) -> None:
        if self._header is None:
            self._start_step()
        super().ready(p, grad_of)

    def finish(self, grad_of: GradOf) -> None:
        if self._header is None:
            self._start_step()
        header = self._header
        try:
            super().finish(grad_of)
        finally:
            header[0].wait()
        self._after_step(True)

    def reset(self) -> None:
        super().reset()
        self._header = None

    # ---- one unit ---------------------------------------------------------------------------------
    def _launch(self, i: int, grad_of: GradOf):
        """Start unit ``i``: its gradients' wire tensors fused per dtype. A sparse gradient goes through
        ``sparse_reduce`` instead (name-matched) and holds zeros in the bucket, which keeps the bucket's
        layout the same on a rank that serves a join. A factored weight's unit gathers its factors."""
        if self._factored[i]:
            return self.factors.launch(self.units[i][0], self.comm, self.names[i])
        wires, ctxs, sparse = [], [], []
        for p in self.units[i]:
            g = grad_of(p)
            if g.is_sparse:
                sparse.append((p, self.sparse_reduce(p, g)))
                g = torch.zeros(g.shape, dtype=g.dtype, device=g.device)
            w, ctx = self.compression.compress(g)
            wires.append((p, w))
            ctxs.append(ctx)
        flats = self._flats([w for _, w in wires], self._keep[i])
        return self._reduce(i, flats), flats, wires, ctxs, sparse

    @staticmethod
    def _flats(wires: list[torch.Tensor], keep: dict | None = None) -> list[tuple[torch.Tensor, list[int]]]:
        """One flat buffer per wire dtype (in order of first appearance) with the indices of the wires it
        holds. A lone contiguous wire is its own buffer (an uncompressed gradient is reduced in place).
        Other buffers are kept in ``keep`` (by dtype) and reused while their size fits and nothing but
        the gradients they lend (:meth:`_deliver`) holds their memory: a fresh buffer of tens of MiB
        every step costs its page faults. A wire that already is its place in the buffer (a lent
        gradient that backward accumulated into) is not copied."""
        by_dtype: dict[torch.dtype, list[int]] = {}
        for k, w in enumerate(wires):
            by_dtype.setdefault(w.dtype, []).append(k)
        out = []
        for dtype, ks in by_dtype.items():
            if len(ks) == 1 and wires[ks[0]].is_contiguous():
                out.append((wires[ks[0]].view(-1), ks))
                continue
            n = sum(wires[k].numel() for k in ks)
            flat = None if keep is None else keep.get(dtype)
            if flat is None or flat.numel() != n or flat.device != wires[ks[0]].device or _held(flat, wires, ks):
                flat = torch.empty(n, dtype=dtype, device=wires[ks[0]].device)
                if keep is not None:
                    keep[dtype] = flat
            at = 0
            for k in ks:
                w = wires[k]
                dst = flat[at:at + w.numel()]
                if not is_view_of(w, dst):
                    dst.copy_(w.reshape(-1))
                at += w.numel()
            out.append((flat, ks))
        return out

    def _reduce(self, i: int, flats) -> list[CommFuture]:
        check = None if not self._checked[i] else False
        self._checked[i] = True
        return [self.comm.allreduce_(flat, self.op, self.names[i], prescale=self.prescale,
                                     postscale=self.postscale, check=check) for flat, _ in flats]

    def _deliver(self, pending) -> None:
        if callable(pending):  # a factored unit's
            pending()
            return
        futs, flats, wires, ctxs, sparse = pending
        for fut in futs:
            fut.wait()
        skip = {id(p) for p, _ in sparse}
        for flat, ks in flats:
            at = 0
            for k in ks:
                p, w = wires[k]
                out = flat[at:at + w.numel()].view_as(w)
                at += w.numel()
                if id(p) in skip:
                    continue
                self._take(p.grad, self.compression.decompress(out, ctxs[k]))
        for p, handle in sparse:
            p.grad = handle()

    def serve_step(self) -> None:
        """Mirror one step of the members with zero gradients (this rank has joined)."""
        self._between_steps()
        for i in range(len(self.units)):
            if self._factored[i]:
                self.factors.serve(self.units[i][0], self.comm, self.names[i])
                continue
            zeros = [self.compression.compress(torch.zeros_like(p))[0] for p in self.units[i]]
            for fut in self._reduce(i, self._flats(zeros, self._keep[i])):
                fut.wait()
        self._after_step(False)


def _held(flat: torch.Tensor, wires: list[torch.Tensor], ks: list[int]) -> bool:
    """Whether anything besides ``flat`` and the wires ``ks`` (lent gradients) holds ``flat``'s memory: a
    gradient of an earlier step kept by the caller, which reusing the buffer would overwrite."""
    sharing = tensors_sharing(flat)
    if sharing is None:
        return True
    ptr = flat.untyped_storage().data_ptr()
    lent = sum(1 for k in ks if wires[k].untyped_storage().data_ptr() == ptr)
    return sharing > 1 + lent


def start_header(comm: Comm, flag: float, serial: int) -> tuple[CommFuture, torch.Tensor]:
    """The two-element header all-reduce (sum) of one step: ``[flag, flag * serial]``."""
    h = torch.tensor([flag, flag * serial], dtype=torch.float64)
    return comm.allreduce_(h, ReduceOp.SUM, "fused.header", check=False), h


def serve_join(live: dict[int, FusedGradients]) -> None:
    """``hvd.join()``'s part for ``live`` (serial -> the live world optimizers of this rank): until no
    member steps, answer each step's header with ``[0, 0]`` and mirror the step of the optimizer it names
    with zeros. ``RuntimeError`` if the others step an optimizer this rank does not hold."""
    if not live:
        return
    comm = next(iter(live.values())).comm
    while True:
        fut, h = start_header(comm, 0.0, 0)
        fut.wait()
        stepping = round(float(h[0]))
        if stepping == 0:
            return
        serial = round(float(h[1]) / stepping)
        fused = live.get(serial)
        if fused is None:
            raise RuntimeError(f"join(): the other ranks step DistributedOptimizer #{serial}, which this rank does "
                               f"not hold (it holds #{sorted(live)}); every rank must build the same optimizers")
        fused.serve_step()
