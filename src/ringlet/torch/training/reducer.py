"""The one bucket reducer of ringlet's training front ends.

:class:`BucketReducer` runs one reduced backward over a :class:`~ringlet.torch.training.buckets.BucketSet`:
each bucket carries its reduction strategy (:class:`~ringlet.torch.training.reduction.DenseReduction`,
:class:`~ringlet.torch.training.compressed_reduction.CompressedReduction`,
:class:`~ringlet.torch.training.factor_reduction.FactorReduction`, or the variants that hand averages
over Horovod's way, :mod:`~ringlet.torch.training.take_reduction`), and a launcher decides when ready
buckets go out (:class:`~ringlet.torch.training.launch_fifo.FifoLaunch`: in bucket order;
:class:`~ringlet.torch.training.launch_priority.PriorityLaunch`: front pieces first;
:class:`~ringlet.torch.training.launch_bounded.BoundedLaunch`: in a given order, a cap on buckets in flight).

Two front ends feed it from per-parameter hooks: :class:`~ringlet.torch.training.ddp.DistributedDataParallel`
and ``ringlet.torch.DistributedOptimizer`` (:mod:`ringlet.torch.ordered_grads`). ZeRO
(:mod:`ringlet.torch.training.zero.gradients`) reduce-scatters through it with its own strategy
(:class:`~ringlet.torch.training.zero.scatter.ScatterReduction`, the gradients folded into this rank's
shards) and :class:`~ringlet.torch.training.launch_bounded.BoundedLaunch`: stage 2 from per-parameter
hooks, stage 3 one whole bucket per unit, stage 1 every bucket whole at the step. The comm hooks for
torch's DDP, and ZeRO's reducers (:mod:`ringlet.torch.training.zero.reduce`: the collective under each of
its buckets), are single collectives of one bucket each and call the communicator directly
(:class:`~ringlet.torch.comm.Comm`), through the same compressed all-reduce.

Per reduced backward: :meth:`BucketReducer.start`, :meth:`BucketReducer.ready` once per parameter as
its gradient is final (None: it got none), :meth:`BucketReducer.complete` when backward is over (the
parameters never made ready count as None), :meth:`BucketReducer.wait`, then
:meth:`BucketReducer.deliver`. A bucket whose gradient exists as one flat tensor is handed over whole
instead, by :meth:`BucketReducer.ready_bucket` (its strategy must offer ``accept_bucket``). Every rank
makes the same buckets ready in any order but the launcher starts them in one order, so no negotiation
is needed (:class:`~ringlet.torch.training.launch_bounded.BoundedLaunch` launches whole buckets as they
arrive: there the ranks hand them over in one sequence).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from .reduction import StepMarks

if TYPE_CHECKING:
    from .buckets import Bucket, BucketSet

__all__ = ["BucketReducer"]


class BucketReducer:
    """Reduce the gradients of one bucket set per backward with ``launch`` (a launcher, see the module
    doc). ``name_of(p)``: the parameter's name for error messages; ``owner``: the front end's name.
    ``active`` and ``marks``: the bucket set and the marks of the backward in progress."""

    __slots__ = ("launch", "name_of", "owner", "active", "marks")

    def __init__(self, launch, name_of: Callable[[torch.Tensor], str], owner: str):
        self.launch = launch
        self.name_of = name_of
        self.owner = owner
        self.active: BucketSet | None = None
        self.marks = StepMarks([], [], [])

    def start(self, bucket_set: BucketSet, fresh: list[bool]) -> None:
        """A reduced backward over ``bucket_set`` is about to run; ``fresh``: per flat index, ``.grad`` was
        None at the forward (its average may be lent as a view)."""
        self.active = bucket_set
        n = len(bucket_set.params)
        self.marks = StepMarks([False] * n, [False] * n, fresh)
        for b in bucket_set.buckets:
            b.reduction.prepare(b)
            b.pending, b.work = len(b.params), None
        self.launch.start(bucket_set, self.marks)

    def ready(self, p: torch.Tensor, grad: torch.Tensor | None) -> None:
        """``p``'s gradient of this backward is final (None: it got none, zeros take part): into its
        bucket, and the launcher starts what is now ready. ``RuntimeError`` for a second gradient."""
        b, j, k = self.active.where[id(p)]
        marks = self.marks
        if marks.ready[k]:
            raise RuntimeError(f"{self.owner}: parameter {self.name_of(p)} received a gradient twice in one "
                               "backward (reentrant backward or a parameter used in two separate backward "
                               "passes of one forward is not supported).")
        marks.ready[k] = True
        marks.got_grad[k] = grad is not None
        b.reduction.accept(b, j, grad)
        b.pending -= 1
        self.launch.accepted(b, j)

    def ready_bucket(self, b: Bucket, grad: torch.Tensor) -> None:
        """Bucket ``b``'s gradient of this backward arrives whole: ``grad``, 1-D, every parameter's gradient
        in slot order (the strategy's ``accept_bucket(b, grad)`` takes it; the launcher is told with
        ``accepted(b, None)``). ``RuntimeError`` when a parameter of ``b`` was made ready already;
        ``TypeError`` when ``b``'s strategy takes gradients per parameter only."""
        accept = getattr(b.reduction, "accept_bucket", None)
        if accept is None:
            raise TypeError(f"{self.owner}: bucket {b.index}'s reduction ({type(b.reduction).__name__}) takes "
                            "gradients per parameter, not whole buckets")
        marks, flat = self.marks, range(b.start, b.start + len(b.params))
        if any(marks.ready[k] for k in flat):
            raise RuntimeError(f"{self.owner}: bucket {b.index}'s gradient arrived twice in one backward")
        for k in flat:
            marks.ready[k] = marks.got_grad[k] = True
        accept(b, grad)
        b.pending = 0
        self.launch.accepted(b, None)

    def complete(self) -> list[torch.Tensor]:
        """Backward is over: the parameters not made ready take part with zeros (returned, in flat order),
        and the launcher starts everything left."""
        missing = [p for k, p in enumerate(self.active.params) if not self.marks.ready[k]]
        for p in missing:
            self.ready(p, None)
        self.launch.end_backward()
        return missing

    def wait(self) -> None:
        """Wait for every bucket; raise the first error once all are done."""
        self.launch.wait()

    @torch.no_grad()
    def deliver(self) -> None:
        """Write every average into ``.grad`` (each strategy its own way)."""
        self.launch.deliver(self.marks)
