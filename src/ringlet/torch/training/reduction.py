"""How one bucket of the bucket reducer (:mod:`~ringlet.torch.training.reducer`: ringlet's
DistributedDataParallel, ``DistributedOptimizer``, and per torch bucket the comm hooks) is reduced: the
:class:`Reduction` interface, chosen per bucket, and :class:`DenseReduction`, the all-reduce of the
bucket's flat buffer (the context's op, AVG for the DDP, and scales). The other strategies: a
compressor's all-reduce (:class:`~ringlet.torch.training.compressed_reduction.CompressedReduction`) and
a weight averaged from gathered sufficient factors
(:class:`~ringlet.torch.training.factor_reduction.FactorReduction`); Horovod's delivery of each
(:mod:`~ringlet.torch.training.take_reduction`).

Per reduced backward the reducer calls, for each bucket: :meth:`Reduction.prepare` at the forward,
:meth:`Reduction.accept` once per parameter as its gradient is ready (``None``: it gets none),
:meth:`Reduction.launch` when every parameter was accepted (by the DDP's launcher: first in, first
out, or priority-scheduled pieces), :meth:`Reduction.finish` with what the launched work returned, and
:meth:`Reduction.deliver` to write the average into ``.grad`` (under ``torch.no_grad``). A reduction may
also offer ``stage(bucket)``: the launch's work as a function to run on the communication thread later
(priority scheduling calls it where it would launch, and runs the function when the bucket's turn comes),
and ``accept_bucket(bucket, grad)``: the bucket's gradient whole, one flat tensor in slot order, instead of
one :meth:`Reduction.accept` per parameter
(:meth:`~ringlet.torch.training.reducer.BucketReducer.ready_bucket`; ZeRO's
:class:`~ringlet.torch.training.zero.scatter.ScatterReduction`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

from ringlet.types import ReduceOp

from .buckets import is_view_of

if TYPE_CHECKING:
    from ..comm import Comm, CommFuture
    from .buckets import Bucket

__all__ = ["Reduction", "ReductionContext", "StepMarks", "DenseReduction"]


@dataclass(slots=True)
class ReductionContext:
    """What the reductions of one front end share: where collectives go and under which names, the
    reduction (``op`` AVG or SUM, ``prescale`` before and ``postscale`` after it), how averages reach
    ``.grad``, and counters (for tests and reports). ``label(bucket, kind)``, when given, names a
    bucket's collectives (``kind``: ``"bucket"``, ``"compressed"`` or ``"factors"``); else
    :meth:`name` derives them from ``prefix``. ``fell_back(layer)``, when given, is told of a weight whose
    factors some rank could not use (it was all-reduced densely)."""

    comm: Comm
    prefix: str
    gradient_as_bucket_view: bool
    lend_gradients: bool = True   # False: copy averages into .grad instead of lending bucket memory
    op: ReduceOp = ReduceOp.AVG
    prescale: float = 1.0
    postscale: float = 1.0
    label: Callable[[Any, str], str] | None = None
    fell_back: Callable[[Any], None] | None = None
    gather_algorithm: str = "ring"  # all-gather algorithm of the sufficient factors
    fresh_buffers: int = 0        # buckets replaced because their memory was still held
    factored: int = 0             # weight averages computed from factors
    fallbacks: int = 0            # ... and all-reduced densely because a rank's factors did not match
    # Told of every dense all-reduce of gradients once it ran: (algorithm requested, bytes, its span), on
    # the communication thread (dynamic adjustment, ringlet.torch.training.adapt); None: nobody listens.
    observe: Callable[[str, int, tuple[float, float] | None], None] | None = None

    def name(self, b: Bucket, kind: str) -> str:
        """The name of bucket ``b``'s collectives of ``kind`` (see the class doc)."""
        if self.label is not None:
            return self.label(b, kind)
        if kind == "compressed":  # matched by order; the bucket's index is what every rank shares
            return f"ddp.bucket{b.index}"
        return f"{self.prefix}.{kind}{b.index}"


@dataclass(slots=True)
class StepMarks:
    """The backward being reduced, per flat index of the active bucket set: in the bucket already
    (``ready``), a real gradient and not zeros for an unused parameter (``got_grad``), ``.grad`` was None
    at the forward (``fresh``); ``usage``: ranks with a real gradient (``find_unused_parameters`` only)."""

    ready: list[bool]
    got_grad: list[bool]
    fresh: list[bool]
    usage: list[int] | None = None

    def used(self, k: int) -> bool:
        """Whether some rank produced a gradient for flat index ``k``."""
        return self.got_grad[k] or (self.usage is not None and self.usage[k] != 0)


class Reduction(Protocol):
    """One bucket's reduction strategy (see the module doc for the call order)."""

    factored: bool  # the bucket's weight is averaged from sufficient factors

    def new_buffer(self, params: list[torch.nn.Parameter], numel: int) -> torch.Tensor:
        """The bucket's flat buffer for ``params`` (``numel`` elements together)."""

    def prepare(self, b: Bucket) -> None:
        """Before a reduced backward: forget the last one's state."""

    def accept(self, b: Bucket, j: int, grad: torch.Tensor | None) -> None:
        """Parameter ``j``'s local gradient of this backward (None: it got none)."""

    def launch(self, b: Bucket, timed: bool) -> CommFuture:
        """Start the reduction with algorithm ``b.algo``; ``timed``: record its span for the timeline."""

    def finish(self, b: Bucket, result: Any) -> None:
        """The launched work's result, after waiting for it."""

    def deliver(self, b: Bucket, marks: StepMarks) -> None:
        """Write the average into the parameters' ``.grad``."""


class DenseReduction:
    """All-reduce (AVG) of the bucket's flat buffer. Gradients are copied into the buffer unless autograd
    accumulated straight into it (``.grad`` is the view the bucket lent); averages reach ``.grad`` as
    views of the buffer where allowed (see the DDP's module doc), else as copies."""

    factored = False
    __slots__ = ("ctx",)

    def __init__(self, ctx: ReductionContext):
        self.ctx = ctx

    def new_buffer(self, params: list[torch.nn.Parameter], numel: int) -> torch.Tensor:
        return torch.zeros(numel, dtype=params[0].dtype, device=params[0].device)

    def prepare(self, b: Bucket) -> None:
        ctx = self.ctx
        if not ctx.gradient_as_bucket_view and ctx.lend_gradients and b.reclaim():
            ctx.fresh_buffers += 1

    def accept(self, b: Bucket, j: int, grad: torch.Tensor | None) -> None:
        p, slot = b.params[j], b.slot(j)
        if grad is None:
            if p.grad is not None and is_view_of(p.grad, slot):
                p.grad = p.grad.clone()  # an unused parameter keeps its gradient, apart from the bucket
            slot.zero_()
        else:
            if grad.is_sparse:
                raise ValueError("DistributedDataParallel does not reduce sparse gradients.")
            if not is_view_of(grad, slot):  # autograd accumulated straight into the bucket otherwise
                slot.copy_(grad.reshape(-1))

    def launch(self, b: Bucket, timed: bool) -> CommFuture:
        ctx = self.ctx
        fut = ctx.comm.allreduce_(b.buffer, ctx.op, ctx.name(b, "bucket"), ctx.prescale, timed,
                                  None if b.algo not in b.validated else False, b.algo, ctx.postscale)
        observe = ctx.observe
        if observe is not None:
            algo, nbytes = b.algo, b.buffer.numel() * b.buffer.element_size()
            fut.add_done_callback(lambda f: observe(algo, nbytes, f.span()))
        return fut

    def finish(self, b: Bucket, result: Any) -> None:
        pass  # the average is in the buffer

    def deliver(self, b: Bucket, marks: StepMarks) -> None:
        for j in range(len(b.params)):
            self.deliver_slot(b, j, marks)

    def deliver_slot(self, b: Bucket, j: int, marks: StepMarks) -> None:
        """Parameter ``j``'s average into its ``.grad`` (as :meth:`deliver` does for every parameter)."""
        p, k = b.params[j], b.start + j
        avg = b.slot(j).view_as(p)
        if not marks.used(k):
            return  # no rank used it: leave .grad as it was, like torch
        if p.grad is not None and is_view_of(p.grad, avg):
            return  # autograd accumulated into the bucket: the average is in place
        if self.ctx.gradient_as_bucket_view or (self.ctx.lend_gradients and marks.fresh[k] and p.is_contiguous()):
            p.grad = avg
            b.lent = True
        elif p.grad is None:
            p.grad = avg.clone()
        else:
            p.grad.copy_(avg)
