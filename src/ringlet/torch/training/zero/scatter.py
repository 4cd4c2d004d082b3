"""ZeRO's strategy for the one bucket reducer (:mod:`ringlet.torch.training.reducer`): a bucket's gradients
reduce-scattered (average) into this rank's float32 gradient shard.

:class:`ScatterReduction` (stages 2 and 3) follows the reducer's
:class:`~ringlet.torch.training.reduction.Reduction` protocol per bucket of a
:class:`~ringlet.torch.training.zero.layout.Layout` (reducer bucket ``k`` is layout bucket ``k``):

* :meth:`~ScatterReduction.accept` takes a parameter's gradient by reference (it stays in ``.grad``
  until the launch); ``accept_bucket`` takes the bucket's whole gradient (stage 3: one fresh 1-D tensor
  per unit, model dtype, ZeRO's from then on);
* :meth:`~ScatterReduction.launch` makes the travelling buffer (``options.reduce_dtype``, else the
  bucket's dtype): the parameters' gradients copied into a fresh flat buffer and their ``.grad`` set to
  None, zeros where none arrived (a bucket of one parameter sends autograd's own tensor when it already
  has the travelling dtype: no copy); a whole bucket is sent as it came, cast when the dtypes differ. The
  buffer is a working buffer (:class:`Working`) until finished; the launch calls the ZeRO reducer's
  ``reduce_scatter_`` (:class:`~ringlet.torch.training.zero.reduce.Reducer` or any reducer with its
  interface: compressed, hierarchical) under the name ``{prefix}.rs{bucket}``;
* :meth:`~ScatterReduction.finish` adds the block into the gradient shard (the shards accumulate over
  backwards until the caller zeros them) and releases the buffer;
* :meth:`~ScatterReduction.deliver` writes nothing: the gradients live in the shards, ``.grad`` stays None.

:class:`StepScatter` (stage 1) sends the persistent flat gradient buffers handed over whole at the step:
only a cast copy is a working buffer, and the block is copied into the shard (nothing at all when the shard
is that block of the flat buffer).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from ..buckets import BucketSet

if TYPE_CHECKING:
    from ..buckets import Bucket
    from ..reduction import StepMarks
    from .layout import Layout

__all__ = ["Working", "ScatterReduction", "StepScatter", "travel_dtype", "bucket_set"]


class Working:
    """Bytes of working buffers held now (``current``) and at most so far (``peak``)."""

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0

    def add(self, t: torch.Tensor) -> None:
        self.current += t.numel() * t.element_size()
        self.peak = max(self.peak, self.current)

    def release(self, t: torch.Tensor) -> None:
        self.current -= t.numel() * t.element_size()


def travel_dtype(options, dtype: torch.dtype) -> torch.dtype:
    """The dtype a bucket of ``dtype`` travels in under ``options`` (a ZeroOptions)."""
    return options.reduce_dtype if options.reduce_dtype is not None else dtype


def bucket_set(layout: Layout, params: Sequence[torch.Tensor], reduction) -> BucketSet:
    """The reducer's bucket set of ``layout`` (bucket ``k`` = layout bucket ``k``), every bucket reduced by
    ``reduction``; ``params[i]``: the tensor of the layout's slot index ``i`` (a key only: its storage may
    be released, as in stage 3)."""
    lists = [[params[s.index] for s in b.slots] for b in layout.buckets]
    spaces = [([s.offset for s in b.slots], b.numel) for b in layout.buckets]
    return BucketSet(lists, lambda ps: reduction, lambda _lists, _reductions: spaces)


class ScatterReduction:
    """Reduce-scatter of ZeRO buckets into the float32 gradient shards (see the module doc): ``reducer``
    (ZeRO's), ``layout``, ``shards[k]`` (bucket ``k``'s shard of this rank), ``states[k]`` (bucket ``k``'s
    state for the reducer, the same dict every step), ``options`` (a ZeroOptions), ``prefix`` (of the
    collectives' names), ``working`` (the :class:`Working` counter)."""

    factored = False

    def __init__(self, reducer, layout: Layout, shards: Sequence[torch.Tensor], states: Sequence[dict], options,
                 prefix: str, working: Working):
        self.reducer, self.layout, self.shards, self.states = reducer, layout, shards, states
        self.options, self.prefix, self.working = options, prefix, working
        self._grads: dict[int, list[torch.Tensor | None]] = {}
        self._given: dict[int, torch.Tensor] = {}
        self._held: dict[int, tuple[torch.Tensor, bool]] = {}

    def new_buffer(self, params: list[torch.nn.Parameter], numel: int) -> torch.Tensor:
        return torch.empty(0)  # no persistent buffer: one is made at each launch

    def prepare(self, b: Bucket) -> None:
        self._grads[b.index] = [None] * len(b.params)
        self._given.pop(b.index, None)
        held = self._held.pop(b.index, None)  # a buffer left by a backward that failed half-way
        if held is not None and held[1]:
            self.working.release(held[0])

    def accept(self, b: Bucket, j: int, grad: torch.Tensor | None) -> None:
        if grad is not None and grad.is_sparse:
            name = self.layout.buckets[b.index].slots[j].name
            raise ValueError(f"ZeroOptimizer: parameter {name} has a sparse gradient; ZeRO needs dense "
                             "gradients (use sparse=False in its embedding)")
        self._grads[b.index][j] = grad

    def accept_bucket(self, b: Bucket, grad: torch.Tensor) -> None:
        """Bucket ``b``'s whole gradient (1-D, slot order); ``ValueError`` for the wrong size."""
        numel = self.layout.buckets[b.index].numel
        if grad.dim() != 1 or grad.numel() != numel:
            raise ValueError(f"ZeroOptimizer: bucket {b.index}'s gradient has shape {tuple(grad.shape)}, "
                             f"expected ({numel},)")
        self._given[b.index] = grad

    @torch.no_grad()
    def launch(self, b: Bucket, timed: bool) -> Any:
        lb = self.layout.buckets[b.index]
        dtype = travel_dtype(self.options, lb.dtype)
        given = self._given.pop(b.index, None)
        if given is None:
            flat, owned = self._flatten(b, dtype), True
        else:
            flat, owned = self._travelling(given, dtype)
        if owned:
            self.working.add(flat)
        self._held[b.index] = (flat, owned)
        return self.reducer.reduce_scatter_(flat, lb.counts, f"{self.prefix}.rs{b.index}", self.states[b.index])

    def _travelling(self, given: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
        """A whole bucket as it travels, and whether that is a working buffer (here: always)."""
        return (given if given.dtype == dtype else given.to(dtype)), True

    def _flatten(self, b: Bucket, dtype: torch.dtype) -> torch.Tensor:
        """Bucket ``b``'s accepted gradients in one buffer (zeros where none arrived); their ``.grad`` dropped."""
        lb = self.layout.buckets[b.index]
        grads = self._grads.pop(b.index)
        g = grads[0] if len(grads) == 1 else None
        if g is not None and g.dtype == dtype and g.is_contiguous():  # one parameter: autograd's own tensor
            b.params[0].grad = None
            return g.detach().view(-1)
        flat = torch.empty(lb.numel, dtype=dtype)
        for j, (s, g) in enumerate(zip(lb.slots, grads)):
            part = flat[s.offset:s.offset + s.numel]
            if g is None:
                part.zero_()
                continue
            part.copy_(g.reshape(-1))
            b.params[j].grad = None
        return flat

    @torch.no_grad()
    def finish(self, b: Bucket, result: torch.Tensor) -> None:
        flat, owned = self._held.pop(b.index)
        try:
            self._fold(b.index, result)
        finally:
            if owned:
                self.working.release(flat)

    def _fold(self, k: int, block: torch.Tensor) -> None:
        self.shards[k].add_(block)

    def deliver(self, b: Bucket, marks: StepMarks) -> None:
        pass  # the gradients live in the shards; .grad stays None


class StepScatter(ScatterReduction):
    """Stage 1 (see the module doc): whole buckets are the persistent flat gradient buffers (model dtype);
    the block replaces the shard's values instead of adding to them."""

    def _travelling(self, given: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
        return (given, False) if given.dtype == dtype else (given.to(dtype), True)

    def _fold(self, k: int, block: torch.Tensor) -> None:
        shard = self.shards[k]
        if block.dtype != shard.dtype or block.data_ptr() != shard.data_ptr() or block.numel() != shard.numel():
            shard.copy_(block)
