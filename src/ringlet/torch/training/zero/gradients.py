"""How gradients reach this rank's float32 gradient shards, per stage.

* :class:`LocalGradients` (stage 1): backward leaves every rank's full local gradients in ``param.grad``,
  which are views of one persistent flat gradient buffer per bucket (model dtype), so accumulation over
  several backwards happens in place and the reduce-scatter needs no copy. :meth:`LocalGradients.sync`
  (at ``step()``, or earlier through ``sync_master_grads``) reduce-scatters every bucket (average over the
  data-parallel ranks) and leaves this rank's block in the gradient shard. When the parameters are float32
  and travel as float32 the shard *is* the flat buffer's block (nothing copied, nothing allocated).
  ``sync`` consumes the gradients: the rest of each flat buffer is scratch until :meth:`LocalGradients.zero`.
* :class:`StreamedGradients` (stages 2 and 3): as soon as every gradient of a bucket is in, the bucket is
  copied into a fresh flat buffer (the parameters' ``.grad`` set to None: the full gradients are freed) and
  its reduce-scatter launched (a bucket of one parameter reduces the tensor autograd made, in place: no
  copy). Stage 2's buckets fill from per-parameter post-accumulate-grad hooks and launch in one fixed order
  on every rank (a bucket full early waits for those before it, its gradients still in ``.grad``); stage
  3's arrive whole, one per unit, and launch as they arrive. At most ``max_inflight`` are unfinished:
  launching one more first waits for the oldest and adds its block into the gradient shard. An
  autograd-engine callback at the end of backward launches what is left (parameters without a gradient
  count as zero, on every rank alike) and waits for everything; the shards then hold the sum over
  backwards of the averages until :meth:`StreamedGradients.zero`.

Both run on the one bucket reducer (:class:`~ringlet.torch.training.reducer.BucketReducer`) with ZeRO's
strategy (:mod:`.scatter`: :class:`~.scatter.ScatterReduction`, stage 1 :class:`~.scatter.StepScatter`)
and the bounded launcher (:class:`~ringlet.torch.training.launch_bounded.BoundedLaunch`), so every
reduce-scatter goes out in the same order on every rank.

Working buffers (what exists only while gradients move; :class:`~.scatter.Working` tracks the bytes):
stage 1 none when the gradients travel in the parameters' dtype, else one cast buffer per bucket in flight
(at most ``max_inflight``); stages 2-3 at most ``max_inflight`` flat buckets in the travelling dtype, a
stage-3 bucket counted from its arrival (it is launched then, after the oldest in flight was finished
when ``max_inflight`` were), so the count is a bound whatever the order in which the units arrive.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Sequence

import torch

from ringlet import straggler
from ..launch_bounded import BoundedLaunch
from ..reducer import BucketReducer
from .layout import Layout
from .scatter import ScatterReduction, StepScatter, Working, bucket_set, travel_dtype

__all__ = ["LocalGradients", "StreamedGradients", "Working"]


class LocalGradients:
    """Stage 1 (see the module doc). ``params[i]``: the parameter of the layout's slot index ``i``."""

    def __init__(self, layout: Layout, params: Sequence[torch.Tensor], shard_rank: int, reducer, options,
                 prefix: str, working: Working):
        self.layout, self.params, self.reducer, self.options = layout, params, reducer, options
        self.prefix, self.working = prefix, working
        self.flats: list[torch.Tensor] = []
        self.views: list[list[torch.Tensor]] = []
        self.shards: list[torch.Tensor] = []
        self.separate: list[bool] = []
        with torch.no_grad():
            for b in layout.buckets:
                flat = torch.zeros(b.numel, dtype=b.dtype, device=params[b.slots[0].index].device)
                views = [flat[s.offset:s.offset + s.numel].view(s.shape) for s in b.slots]
                lo, hi = b.shard(shard_rank)
                alias = b.dtype == torch.float32 and travel_dtype(options, b.dtype) == torch.float32
                self.shards.append(flat[lo:hi] if alias else torch.zeros(hi - lo, dtype=torch.float32,
                                                                         device=flat.device))
                self.separate.append(not alias)
                self.flats.append(flat)
                self.views.append(views)
                for s, v in zip(b.slots, views):
                    g = params[s.index].grad
                    if g is not None and not g.is_sparse:
                        v.copy_(g)
                    params[s.index].grad = v
        self.states: list[dict] = [{} for _ in layout.buckets]
        casts = any(travel_dtype(options, b.dtype) != b.dtype for b in layout.buckets)
        limit = options.max_inflight if casts else max(1, len(layout.buckets))
        self._set = bucket_set(layout, params, StepScatter(reducer, layout, self.shards, self.states, options,
                                                           prefix, working))
        self._bucket_reducer = BucketReducer(BoundedLaunch(range(len(layout.buckets)), limit), _namer(layout, params),
                                      "ZeroOptimizer (stage 1)")
        self.synced = False
        self.consumed = False

    def shard(self, b: int) -> torch.Tensor:
        return self.shards[b]

    @torch.no_grad()
    def sync(self) -> None:
        """Reduce-scatter every bucket into the gradient shards (once per step). ``RuntimeError`` when the
        gradients were consumed by a step and not zeroed since; ``ValueError`` for a sparse gradient."""
        if self.consumed:
            raise RuntimeError("ZeroOptimizer (stage 1): step() consumed the gradients (they were reduce-scattered "
                               "in place); call zero_grad() between step() and the next backward.")
        if self.synced:
            return
        reducer, buckets = self._bucket_reducer, self._set.buckets  # the one bucket reducer, not ZeRO's
        reducer.start(self._set, [False] * len(self._set.params))
        try:
            for b in range(len(buckets)):
                self._collect(b)
                reducer.ready_bucket(buckets[b], self.flats[b])
            reducer.complete()
        except BaseException:
            with contextlib.suppress(BaseException):
                reducer.wait()  # what was launched finishes; the first error is the one to report
            raise
        reducer.wait()
        self.synced = True

    def _collect(self, b: int) -> None:
        """Make every ``.grad`` of bucket ``b`` its view of the flat buffer (copying one autograd made anew)."""
        for s, view in zip(self.layout.buckets[b].slots, self.views[b]):
            p = self.params[s.index]
            g = p.grad
            if g is None:
                view.zero_()
            elif g.is_sparse:
                raise ValueError(f"ZeroOptimizer: parameter {s.name} has a sparse gradient; ZeRO needs dense "
                                 "gradients (use sparse=False in its embedding)")
            elif g.data_ptr() != view.data_ptr() or g.shape != view.shape:
                view.copy_(g)
            p.grad = view

    def stepped(self) -> None:
        """The inner optimizer stepped on the shards: the flat buffers hold scratch until :meth:`zero`."""
        self.consumed = True

    @torch.no_grad()
    def zero(self) -> None:
        """Zero the flat buffers and the shards; every ``.grad`` is its view again."""
        for b, bucket in enumerate(self.layout.buckets):
            self.flats[b].zero_()
            if self.separate[b]:
                self.shards[b].zero_()
            for s, view in zip(bucket.slots, self.views[b]):
                self.params[s.index].grad = view
        self.synced = False
        self.consumed = False

    def nbytes(self) -> int:
        """Full gradient buffers plus the shards that are not views of them."""
        flats = sum(f.numel() * f.element_size() for f in self.flats)
        return flats + sum(s.numel() * 4 for s, sep in zip(self.shards, self.separate) if sep)

    def close(self) -> None:
        pass


class StreamedGradients:
    """Stages 2 and 3 (see the module doc). ``params``: the tensors by the layout's slot index. ``whole``
    False (stage 2): their post-accumulate-grad hooks hand each gradient to the bucket reducer; True (stage
    3): buckets arrive whole through :meth:`on_bucket` (the tensors are keys only). ``order``: the bucket
    indices in launch order, the same on every rank."""

    def __init__(self, layout: Layout, params: Sequence[torch.Tensor], shard_rank: int, reducer, options,
                 prefix: str, working: Working, order: Sequence[int], *, whole: bool):
        self.layout, self.options, self.working = layout, options, working
        self.shards = [torch.zeros(b.counts[shard_rank], dtype=torch.float32) for b in layout.buckets]
        self.states: list[dict] = [{} for _ in layout.buckets]
        self._set = bucket_set(layout, params, ScatterReduction(reducer, layout, self.shards, self.states, options,
                                                                prefix, working))
        self._bucket_reducer = BucketReducer(BoundedLaunch(order, options.max_inflight), _namer(layout, params),
                                      f"ZeroOptimizer (stage {3 if whole else 2})")
        self._lock = threading.Lock()
        self._in_backward = False
        self._hooks = [] if whole else [p.register_post_accumulate_grad_hook(self._on_param) for p in self._set.params]

    def shard(self, b: int) -> torch.Tensor:
        return self.shards[b]

    # ---- backward ------------------------------------------------------------------------------------------
    def _begin(self) -> None:
        if self._in_backward:
            return
        self._bucket_reducer.start(self._set, [False] * len(self._set.params))
        self._in_backward = True
        torch.autograd.Variable._execution_engine.queue_callback(self._finalize)

    def _on_param(self, p: torch.Tensor) -> None:
        with self._lock:
            self._begin()
            self._bucket_reducer.ready(p, p.grad)

    def on_bucket(self, b: int, flat: torch.Tensor) -> None:
        """Stage 3: bucket ``b``'s full gradient (1-D, slot order, model dtype; ours from now on), launched at
        once (see :class:`~ringlet.torch.training.launch_bounded.BoundedLaunch`)."""
        with self._lock:
            self._begin()
            self._bucket_reducer.ready_bucket(self._set.buckets[b], flat)

    def _finalize(self) -> None:
        """End of backward: launch what is left in order, wait for every bucket."""
        with self._lock:
            try:
                self._bucket_reducer.complete()
                with straggler.meter().waiting():  # the end of backward waits for the last buckets
                    self._bucket_reducer.wait()
                self._bucket_reducer.deliver()
            finally:
                self._in_backward = False

    # ---- step --------------------------------------------------------------------------------------------------
    def sync(self) -> None:
        """Nothing to wait for after backward; ``RuntimeError`` inside one."""
        if self._in_backward:
            raise RuntimeError("ZeroOptimizer: step() called while a backward's reductions are unfinished")

    def stepped(self) -> None:
        pass

    @torch.no_grad()
    def zero(self) -> None:
        for s in self.shards:
            s.zero_()

    def nbytes(self) -> int:
        return sum(s.numel() * 4 for s in self.shards)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _namer(layout: Layout, params: Sequence[torch.Tensor]):
    """The parameter's name in the layout, for the bucket reducer's error messages."""
    names = {id(params[s.index]): s.name for b in layout.buckets for s in b.slots}
    return lambda p: names.get(id(p), "?")
