"""``DistributedOptimizer``'s gradients on the training layer's bucket reducer, by default launched in one
fixed order.

Horovod matches reductions by name (ranks whose hooks fire in different orders still meet, at the price
of a negotiation round); ``DistributedOptimizer`` does so where it must (``groups``, ops other than
Average/Sum, ``RINGLET_HVD_GRADIENTS=named``): the same reducer then gets a communicator with the
name-matched scheduler, one bucket per parameter or group, each launched as soon as it is full. By
default ``DistributedOptimizer`` instead feeds the one bucket reducer of
ringlet's training layer (:class:`~ringlet.torch.training.reducer.BucketReducer`, the DDP's) from its
per-parameter hooks: buckets in the reverse of the optimizer's parameter order (about the order backward
produces the gradients), each started by the first-in-first-out launcher as soon as it and every bucket
before it are complete, on ringlet's ordered core queue. Every rank runs the same sequence of buckets
each step, so no round is needed: the all-reduce starts from the autograd hook, as in torch's DDP.
``synchronize()`` launches the rest, a gradient that was never produced as zeros.

What is Horovod's here: the delivery (``.grad`` keeps its identity and takes the average's memory,
:mod:`~ringlet.torch.training.take_reduction`), the op (Average or Sum) with the predivide factor's
scales, Horovod's ``Compression`` as the wire dtype of the buckets, a ringlet compressor as the
compressed strategy (one bucket per parameter or group, each with its compressor state), sparse
gradients reduced by name beside the buckets, and ``hvd.join()`` (the step header, :func:`serve_join`).
"""
from __future__ import annotations

from typing import Callable

import torch

from ringlet.types import ReduceOp

from .comm import Comm, CommFuture, session_key
from .fused_factors import FusedFactors
from .training.buckets import BucketSet, layout_buckets
from .training.launch_fifo import EagerLaunch, FifoLaunch
from .training.reducer import BucketReducer
from .training.reduction import ReductionContext
from .training.take_reduction import TakeCompressed, TakeDense, TakeFactors

__all__ = ["FusedGradients", "serve_join", "start_header"]

GradOf = Callable[[torch.Tensor], torch.Tensor]


class FusedGradients:
    """The gradient reductions of one ``DistributedOptimizer`` (module doc).

    ``params``: its parameters in order; ``names``: param -> name. Buckets are filled from the end of
    ``params``, one dtype per bucket, closed at ``first_cap`` bytes for the first and ``cap`` for the
    others (torch DDP's layout), or the given ``units`` (lists of parameters in launch order, each cut
    by dtype) are the buckets: with ``compressor`` (a :class:`ringlet.compression.Compressor`), or with a
    ``comm`` whose scheduler matches by name (``groups``, other ops: Horovod's name-matched path, each
    bucket named after its first parameter, ``.group`` added for a group, launched as soon as it is full
    and delivered in any order; a sparse gradient in a group is refused). ``compression``: Horovod's
    stateless ``compress``/``decompress`` pair (the buckets' wire dtype). ``op``: ``ReduceOp.AVG`` or
    ``SUM`` (any op on the name-matched path; ``ValueError`` otherwise) with ``prescale``/``postscale``. ``sparse_reduce(p, grad)`` starts
    the name-matched reduction of a sparse gradient and returns a callable giving its result (a ringlet
    compressor refuses sparse gradients: ``ValueError``). ``register`` records the optimizer where
    ``hvd.join()`` finds it and returns its serial number; it is called again in each new ringlet session
    (an elastic reset). ``register=None`` (the name-matched path, whose joins the coordinator serves):
    no header.

    Each step starts with a *header*, a two-element all-reduce ``[1, serial]`` launched with the step's
    first gradient (so it overlaps the rest of backward): a rank inside ``hvd.join()`` takes part with
    ``[0, 0]`` and learns from the sum whether any member still steps, and which optimizer (``serial``:
    numbered in creation order, the same on every rank), then mirrors that step with zeros
    (:func:`serve_join`). Each bucket's first all-reduce checks its layout across ranks
    (``MismatchError``), later ones do not.

    ``factors``: the sufficient-factor strategy (:class:`~ringlet.torch.fused_factors.FusedFactors`) or
    None; when it is active, the ranks vote at the end of the first step (stepped or served) and each
    weight it then factors is a bucket of its own from the next step on."""

    def __init__(self, comm: Comm, params: list[torch.Tensor], names: dict, op: ReduceOp, compression,
                 sparse_reduce: Callable[[torch.Tensor, torch.Tensor], Callable[[], torch.Tensor]],
                 prescale: float = 1.0, postscale: float = 1.0, cap: int = 25 << 20, first_cap: int = 1 << 20,
                 register: Callable[["FusedGradients"], int] = lambda fused: 0, factors: FusedFactors | None = None,
                 compressor=None, units: list[list[torch.Tensor]] | None = None):
        if op not in (ReduceOp.AVG, ReduceOp.SUM) and not comm.coordinated:
            raise ValueError(f"fused gradient reductions average or sum, got {op!r}")
        self.params, self._names, self._caps = params, names, (cap, first_cap)
        self.comm, self.compression, self.compressor = comm, compression, compressor
        self._units = None if units is None else [u for unit in units for u in _by_dtype(unit)]
        self.factors = factors if factors is not None and factors.active and units is None else None
        self.ctx = ReductionContext(comm, "fused", False, False, op=op, prescale=prescale, postscale=postscale,
                                    label=self._label, fell_back=self._fell_back)
        launch = (EagerLaunch if comm.coordinated else FifoLaunch)(lambda: comm.algorithm)
        self.reducer = BucketReducer(launch, lambda p: names[p], "DistributedOptimizer")
        self.sparse_reduce = sparse_reduce
        self._sparse: list[tuple[torch.Tensor, Callable[[], torch.Tensor]]] = []
        self._steps = 0  # steps of this session, stepped or served
        self._sets: dict[frozenset, BucketSet] = {}
        self._use({})
        self._register = register
        self._session = session_key()
        self.serial = register(self) if register is not None else 0
        self._header: tuple[CommFuture, torch.Tensor] | None = None
        self._started = False

    # ---- bucket sets ------------------------------------------------------------------------------------
    def _label(self, b, kind: str) -> str:
        first = self._names[b.params[0]]
        if self._units is not None:
            return first + (".group" if len(b.params) > 1 else "")
        return f"{first}.{'factors' if kind == 'factors' else 'fused'}"

    def _use(self, factored: dict) -> BucketSet:
        """Launch buckets with the weights in ``factored`` (id -> layer) reduced from factors, the rest fused.
        Each set is built once and kept with its own buffers and checked flags (the factor trial switches
        between two every step)."""
        key = frozenset(factored)
        bucket_set = self._sets.get(key)
        if bucket_set is None:
            layout = self._units if self._units is not None else layout_buckets(self.params, key, *self._caps)
            bucket_set = self._sets[key] = BucketSet(layout, lambda ps: self._reduction_for(ps, factored))
        self.active = bucket_set
        return bucket_set

    def _reduction_for(self, ps: list[torch.Tensor], factored: dict):
        layer = factored.get(id(ps[0])) if len(ps) == 1 else None
        if layer is not None:
            return TakeFactors(layer, self.ctx)
        if self.compressor is not None:
            return TakeCompressed(self.ctx, self.compressor)
        return TakeDense(self.ctx, self.compression)

    @property
    def states(self) -> list[dict]:
        """The compressor state of each bucket (with a ringlet compressor), in launch order."""
        return [b.reduction.state for b in self.active.buckets if hasattr(b.reduction, "state")]

    @property
    def names(self) -> list[str]:
        """The name of each bucket's reduction, in launch order."""
        return [self._label(b, _kind(b, self.compressor)) for b in self.active.buckets]

    def _fell_back(self, layer) -> None:
        if self.factors is not None:
            self.factors.fell_back(layer)

    # ---- sessions and steps ---------------------------------------------------------------------------
    def _between_steps(self) -> None:
        """Before a step (stepped or served): after an elastic reset (a new ringlet session) forget the
        bucket sets (their checked flags), register again (a replacement rank starts with a fresh
        optimizer) and go back to dense buckets until the session's first step decides again."""
        key = session_key()
        if key != self._session:
            self._session = key
            self._steps = 0
            if self.factors is not None:
                self.factors.reset()
            self._sets.clear()
            self._use({})
            if self._register is not None:
                self.serial = self._register(self)

    def _after_step(self, stepping: bool) -> None:
        """After a step (stepped or served): at the end of the session's first, the ranks' one vote on
        the factored weights; then the factor trial's timing; then the next step's bucket set."""
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
        """The step's header (where joins are served) and the reducer's start (after :meth:`_between_steps`)."""
        self._between_steps()
        if self._register is not None:
            self._header = start_header(self.comm, 1.0, self.serial)
        self.reducer.start(self.active, [False] * len(self.active.params))
        self._started = True

    # ---- one step ---------------------------------------------------------------------------------------
    def ready(self, p: torch.Tensor, grad_of: GradOf) -> None:
        """``p``'s gradient of this step is final (``grad_of(p)`` gives it): into its bucket; every bucket,
        in order, that is now complete is launched."""
        if not self._started:
            self._start_step()
        self._feed(p, grad_of(p))

    def _feed(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        if grad.is_sparse:
            if self.compressor is not None:
                raise ValueError(f"Parameter {self._names[p]!r} has a sparse gradient, which a ringlet "
                                 "compressor cannot reduce; use sparse_as_dense=True.")
            if self._units is not None and len(self.active.where[id(p)][0].params) > 1:
                raise ValueError(f"Parameter {self._names[p]!r} has a sparse gradient and cannot be reduced in a "
                                 "group; use sparse_as_dense=True or leave it out of groups.")
            self._sparse.append((p, self.sparse_reduce(p, grad)))
            grad = None  # zeros in the bucket keep its layout the same on every rank
        self.reducer.ready(p, grad)

    def finish(self, grad_of: GradOf) -> None:
        """Launch what is left (``grad_of`` gives zeros for a gradient never produced), wait for every
        bucket and leave the reduced gradients in ``.grad``; raises the first error after waiting for all."""
        if not self._started:
            self._start_step()
        header = self._header
        try:
            marks, params = self.reducer.marks, self.active.params
            for p in [q for k, q in enumerate(params) if not marks.ready[k]]:
                self._feed(p, grad_of(p))
            self._complete(deliver=True)
        finally:
            if header is not None:
                header[0].wait()
            self.reset()
        self._after_step(True)

    def _complete(self, deliver: bool) -> None:
        error = None
        try:
            self.reducer.complete()
            self.reducer.wait()
        except BaseException as exc:  # noqa: BLE001 - the sparse reductions are still waited for
            error = exc
        if deliver and error is None:
            self.reducer.deliver()
        for p, handle in self._sparse:
            try:
                p.grad = handle()
            except BaseException as exc:  # noqa: BLE001
                error = error or exc
        if error is not None:
            raise error

    def reset(self) -> None:
        """Forget this step (what is kept across steps stays)."""
        self._header = None
        self._started = False
        self._sparse = []

    def serve_step(self) -> None:
        """Mirror one step of the members with zero gradients (this rank has joined); ``.grad`` is left
        alone, but a weight whose factors some rank could not use is dropped here too."""
        self._between_steps()
        self.reducer.start(self.active, [False] * len(self.active.params))
        self._complete(deliver=True)  # nothing was made ready with a gradient: only the factors' verdicts
        self._after_step(False)


def _by_dtype(unit: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``unit`` cut into one list per dtype (in order of first appearance): a bucket holds one dtype."""
    out: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in unit:
        out.setdefault(p.dtype, []).append(p)
    return list(out.values())


def _kind(b, compressor) -> str:
    if b.reduction.factored:
        return "factors"
    return "compressed" if compressor is not None else "bucket"


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
