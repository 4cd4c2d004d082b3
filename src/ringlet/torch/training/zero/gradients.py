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
  copy); buckets launch in one fixed order on every rank (a bucket ready early waits
  for those before it), at most ``max_inflight`` of them unfinished: launching one more first waits for the
  oldest and adds its block into the gradient shard. An autograd-engine callback at the end of backward
  launches what is left (parameters without a gradient count as zero, on every rank alike) and waits for
  everything; the shards then hold the sum over backwards of the averages until :meth:`StreamedGradients.zero`.

Working buffers (what exists only while gradients move; :class:`Working` tracks the bytes): stage 1 none
when the gradients travel in the parameters' dtype, else one cast buffer per bucket in flight (at most
``max_inflight``); stages 2-3 at most ``max_inflight`` flat buckets in the travelling dtype.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Sequence

import torch

from .layout import Layout

__all__ = ["LocalGradients", "StreamedGradients", "Working"]


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


class _Pipeline:
    """Reduce-scatters in flight, at most ``limit``; ``fold(b, block)`` runs for each, oldest first, when a
    new launch needs room or at :meth:`drain`."""

    def __init__(self, reducer, layout: Layout, prefix: str, states: list[dict],
                 fold: Callable[[int, torch.Tensor], None], limit: int, working: Working):
        self._reducer, self._layout, self._prefix, self._states = reducer, layout, prefix, states
        self._fold, self._limit, self._working = fold, limit, working
        self._queue: deque = deque()

    def launch(self, b: int, flat: torch.Tensor, owned: bool) -> None:
        """Reduce-scatter ``flat`` (bucket ``b``); ``owned``: a working buffer, released when folded."""
        while len(self._queue) >= self._limit:
            self._finish_one()
        if owned:
            self._working.add(flat)
        fut = self._reducer.reduce_scatter_(flat, self._layout.buckets[b].counts, f"{self._prefix}.rs{b}",
                                            self._states[b])
        self._queue.append((b, flat, owned, fut))

    def drain(self) -> None:
        while self._queue:
            self._finish_one()

    def _finish_one(self) -> None:
        b, flat, owned, fut = self._queue.popleft()
        try:
            self._fold(b, fut.wait())
        finally:
            if owned:
                self._working.release(flat)


def _travel_dtype(options, dtype: torch.dtype) -> torch.dtype:
    return options.reduce_dtype if options.reduce_dtype is not None else dtype


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
                alias = b.dtype == torch.float32 and _travel_dtype(options, b.dtype) == torch.float32
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
        casts = [_travel_dtype(self.options, b.dtype) != b.dtype for b in self.layout.buckets]
        limit = self.options.max_inflight if any(casts) else max(1, len(self.layout.buckets))
        pipe = _Pipeline(self.reducer, self.layout, self.prefix, self.states, self._fold, limit, self.working)
        for b, bucket in enumerate(self.layout.buckets):
            self._collect(b)
            flat = self.flats[b]
            pipe.launch(b, flat.to(_travel_dtype(self.options, bucket.dtype)) if casts[b] else flat, casts[b])
        pipe.drain()
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

    def _fold(self, b: int, block: torch.Tensor) -> None:
        shard = self.shards[b]
        if block.dtype != shard.dtype or block.data_ptr() != shard.data_ptr() or block.numel() != shard.numel():
            shard.copy_(block)

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
    """Stages 2 and 3 (see the module doc). ``params`` (stage 2): the parameters by the layout's slot index,
    whose post-accumulate-grad hooks drive the launches; None (stage 3): buckets arrive whole through
    :meth:`on_bucket`. ``order``: the bucket indices in launch order, the same on every rank."""

    def __init__(self, layout: Layout, params: Sequence[torch.Tensor] | None, shard_rank: int, reducer, options,
                 prefix: str, working: Working, order: Sequence[int]):
        self.layout, self.params, self.reducer, self.options = layout, params, reducer, options
        self.prefix, self.working, self.order = prefix, working, list(order)
        self.shards = [torch.zeros(b.counts[shard_rank], dtype=torch.float32) for b in layout.buckets]
        self.states: list[dict] = [{} for _ in layout.buckets]
        self._lock = threading.Lock()
        self._in_backward = False
        self._where: dict[int, int] = {}
        self._hooks = []
        if params is not None:
            for b in layout.buckets:
                for s in b.slots:
                    self._where[id(params[s.index])] = b.index
            self._hooks = [params[s.index].register_post_accumulate_grad_hook(self._on_param)
                           for b in layout.buckets for s in b.slots]

    def shard(self, b: int) -> torch.Tensor:
        return self.shards[b]

    # ---- backward ------------------------------------------------------------------------------------------
    def _begin(self) -> None:
        if self._in_backward:
            return
        self._in_backward = True
        n = len(self.layout.buckets)
        self._pending = [len(b.slots) for b in self.layout.buckets]
        self._ready = [False] * n
        self._seen: set[int] = set()
        self._given: dict[int, torch.Tensor] = {}
        self._pos = 0
        self._pipe = _Pipeline(self.reducer, self.layout, self.prefix, self.states, self._fold,
                               self.options.max_inflight, self.working)
        torch.autograd.Variable._execution_engine.queue_callback(self._finalize)

    def _on_param(self, p: torch.Tensor) -> None:
        with self._lock:
            self._begin()
            if id(p) in self._seen:
                raise RuntimeError("ZeroOptimizer (stage 2): a parameter received its gradient twice in one backward "
                                   "(reentrant backward is not supported)")
            self._seen.add(id(p))
            b = self._where[id(p)]
            self._pending[b] -= 1
            if self._pending[b] == 0:
                self._ready[b] = True
                self._advance()

    def on_bucket(self, b: int, flat: torch.Tensor) -> None:
        """Stage 3: bucket ``b``'s full gradient (1-D, slot order, model dtype; ours from now on)."""
        with self._lock:
            self._begin()
            if self._ready[b]:
                raise RuntimeError(f"ZeroOptimizer (stage 3): bucket {b}'s gradient arrived twice in one backward")
            self._given[b] = flat
            self._ready[b] = True
            self._advance()

    def _advance(self) -> None:
        while self._pos < len(self.order) and self._ready[self.order[self._pos]]:
            self._launch(self.order[self._pos])
            self._pos += 1

    @torch.no_grad()
    def _launch(self, b: int) -> None:
        bucket = self.layout.buckets[b]
        dtype = _travel_dtype(self.options, bucket.dtype)
        flat = self._given.pop(b, None)
        if flat is None:
            flat = self._flatten(b, dtype)
        elif flat.dtype != dtype:
            flat = flat.to(dtype)
        self._pipe.launch(b, flat, True)

    def _flatten(self, b: int, dtype: torch.dtype) -> torch.Tensor:
        """Bucket ``b``'s gradients in a fresh buffer (zeros where none arrived); their ``.grad`` dropped."""
        bucket = self.layout.buckets[b]
        if len(bucket.slots) == 1 and self.params is not None:  # one parameter: reduce autograd's own tensor
            p = self.params[bucket.slots[0].index]
            g = p.grad
            if g is not None and not g.is_sparse and g.dtype == dtype and g.is_contiguous():
                p.grad = None
                return g.detach().view(-1)
        flat = torch.empty(bucket.numel, dtype=dtype)
        for s in bucket.slots:
            part = flat[s.offset:s.offset + s.numel]
            p = self.params[s.index] if self.params is not None else None
            g = p.grad if p is not None else None
            if g is None:
                part.zero_()
                continue
            if g.is_sparse:
                raise ValueError(f"ZeroOptimizer: parameter {s.name} has a sparse gradient; ZeRO needs dense "
                                 "gradients (use sparse=False in its embedding)")
            part.copy_(g.reshape(-1))
            p.grad = None
        return flat

    def _finalize(self) -> None:
        """End of backward: launch what is left in order, wait for every bucket."""
        with self._lock:
            try:
                for b in range(len(self._ready)):
                    self._ready[b] = True
                self._advance()
                self._pipe.drain()
            finally:
                self._in_backward = False
                self._given = {}

    def _fold(self, b: int, block: torch.Tensor) -> None:
        self.shards[b].add_(block)

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
