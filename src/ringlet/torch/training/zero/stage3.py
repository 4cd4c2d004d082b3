"""ZeRO stage 3: every rank keeps only its shard of the parameters; a module's parameters are all-gathered
just before its forward and its backward, and freed after.

**Units.** :func:`units_of` cuts the parameters into units — by default every module that directly owns
trainable parameters is one unit of those parameters, in registration order (``named_modules()`` order;
a parameter registered by several modules, a tied weight, belongs to the first). The layout has one
bucket per unit (bucket index = unit index); :class:`ShardedParameters` works on any layout whose buckets
hold every parameter once: a module needs the buckets that hold the parameters it registers.

**Forward.** A forward pre-hook of each such module gathers its buckets (on demand, or already in flight
from the prefetch) and binds views of the gathered buffer as the module's parameters; a forward hook
frees them when no running forward uses them any more (a module used twice, or nested in a module that
shares its unit, keeps them while any use is live). Outside, the modules hold
:class:`~ringlet.torch.training.zero.placeholder.ShardedPlaceholder` objects: using one outside a forward
raises :class:`~ringlet.torch.training.zero.placeholder.ShardedParameterError`, which says how to gather
it. Used inside a forward of the model, but not by its own module's (a parent reading ``child.weight``,
``nn.MultiheadAttention`` reading ``out_proj.weight``), a placeholder has its unit gathered on that first
use, held until the innermost running stage-3 module's forward (or the model's) ends.

**Backward.** The parameter views autograd saves are packed with their unit (saved-tensor hooks pushed
for the forward of each hooked module); unpacking one in backward gathers the unit again if it is not
gathered. When autograd has accumulated a unit's gradient — one tensor per unit, the gradients of its
parameters concatenated in slot order, zeros for parameters that got none — ``on_gradient(bucket,
flat_grad)`` receives that fresh 1-D tensor (model dtype; the caller's from then on) and the unit is
freed. A unit whose parameters got no gradient in a backward is not reported (its gradient is zero).
Every backward reports its own gradients (accumulation over several backwards is the caller's sum).

**Order and prefetch.** All-gathers run on ringlet's core queue in submission order, so every rank must
issue the same gathers in the same order: ranks must run the same modules in the same order (the same
graph), as any data-parallel training must. In the first forward every rank announces each gather (the unit)
and the forward's end in a small checked all-gather before it, so ranks whose forwards differ get the same
:class:`~ringlet.types.MismatchError` naming the units, not a hang. Each later forward prefetches in the
order of the previous forward (:mod:`.stage3_schedule`), each backward in the reverse order of the last
forward run with grad enabled: while one unit computes, the next one's all-gather is in flight.

**Working-buffer bound.** Gathered at once: the units in use — in a forward the units of the modules
whose forward is running, in a backward the units whose saved views were read and whose gradient is not
complete — plus at most one unit gathered ahead. For a model whose parameter-owning modules neither nest
nor share parameters that is at most one computing unit plus two more (one ahead, and in a backward one
whose gradient is still being completed): :meth:`ShardedParameters.bound_bytes` = 3 × the largest
bucket. Tied weights and modules used several times add the units whose gradient waits on a later use.

Not supported: activation checkpointing and caller saved-tensor hooks inside stage-3 modules (the
stage's own hooks take precedence there); a custom autograd Function that keeps a parameter on ``ctx`` without
``save_for_backward``; keeping a tensor that shares a parameter's storage (``module.weight``, a view or
``detach()`` of it) beyond the forward of its module: its storage is released there (copy it, or read
the parameters in ``gathered()``, whose tensors stay valid).
"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Sequence

import torch

from ringlet import straggler
from ringlet.types import MismatchError

from .layout import Layout
from .stage3_schedule import Walk
from .stage3_unit import FREE, Unit
from .stage3_units import bindings_of, unit_name, units_of, where_of

__all__ = ["units_of", "ShardedParameters"]

OnGradient = Callable[[int, torch.Tensor], None]


class _Saved:
    """A saved parameter view, packed with its unit."""

    __slots__ = ("unit", "tensor")

    def __init__(self, unit: int, tensor: torch.Tensor):
        self.unit = unit
        self.tensor = tensor


class ShardedParameters:
    """The parameters ``named`` of ``module``, sharded by ``layout`` (one bucket per unit) over the
    group of ``reducer`` (a :class:`~ringlet.torch.training.zero.reduce.Reducer`: this rank keeps block
    ``reducer.shard_rank`` of every bucket). See the module doc for the protocol; ``on_gradient(bucket,
    flat_grad)`` receives each unit's gradient in backward. ``prefetch=False`` gathers on demand only.

    Construction keeps this rank's block of the current values (every rank must already hold the same
    values) and releases the parameters' storage: afterwards the tensors in ``named`` are empty and the
    module holds placeholders. The module's frozen parameters (not in ``named``) and buffers are untouched.
    ``ValueError`` when the layout does not hold every parameter of ``named`` exactly once, is built for
    another group size, or ``named`` lists a tensor the module does not register."""

    def __init__(self, module: torch.nn.Module, named: Sequence[tuple[str, torch.Tensor]], layout: Layout,
                 reducer, on_gradient: OnGradient, *, prefetch: bool = True):
        if layout.world != reducer.shard_size:
            raise ValueError(f"the layout is for {layout.world} ranks, the reducer shards over {reducer.shard_size}")
        where = where_of(layout, len(named))
        self.module, self.layout, self.reducer, self.on_gradient = module, layout, reducer, on_gradient
        self.prefetch = prefetch
        self._meter = straggler.meter()  # gathers waited for in forward and backward count as waits
        bindings, self._needs = bindings_of(module, named, layout, where)
        self.units = [Unit(b, reducer.shard_rank, [named[s.index][1] for s in b.slots], bindings[b.index],
                           unit_name(b), self._resolve) for b in layout.buckets]
        self._refs = [0] * len(self.units)
        self._frames: list[list] = []
        self._fwd: Walk | None = None
        self._bwd: Walk | None = None
        self._bwd_use: set[int] = set()
        self._done: set[int] = set()
        self._plan_fwd: list[int] = []
        self._plan_bwd: list[int] = []
        self._recorded = False
        self._grad_fwd = False
        self._depth = 0
        self._ptr: dict[int, int] = {}
        self._live = self._peak = 0
        self._in_gathered = self._closed = False
        self._saved = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._handles = self._hook()

    # ---- public ---------------------------------------------------------------------------------------
    def shard(self, bucket: int) -> torch.Tensor:
        """This rank's 1-D block of bucket ``bucket`` (model dtype); write updated values into it in
        place — the next gather sends them."""
        self._check_open()
        return self.units[bucket].shard

    @contextlib.contextmanager
    def gathered(self, writeback: bool = False):
        """Every parameter full, as the module's original ``nn.Parameter`` objects, inside the block
        (evaluation, inspection, consolidation). Collective: every rank must enter it. ``writeback``:
        on a normal exit the values then held (written in place, or assigned to ``p.data`` with the same
        shape) go back into the shards; otherwise changes are dropped. A backward run inside does not
        reach ZeRO (gradients land in the parameters' ``.grad`` and are cleared on exit).
        ``RuntimeError`` inside a forward, a backward, another ``gathered()``, or after :meth:`close`."""
        self._check_idle("gathered()")
        self._in_gathered = True
        try:
            self._copy_all()
            for u in self.units:
                u.bind_originals()
            yield self.module
            if writeback:
                for u in self.units:
                    u.write_back()
        finally:
            for u in self.units:
                u.drop_originals()
                u.bind_placeholders()
            self._in_gathered = False

    def close(self) -> None:
        """Gather every parameter, give the module back its original parameters with their full values,
        remove every hook and release the buffers and shards. Collective; calling it again does nothing."""
        if self._closed:
            return
        self._check_idle("close()")
        self._copy_all()
        for h in self._handles:
            h.remove()
        for u in self.units:
            u.bind_originals()
            u.drop_originals(keep=True)
            u.shard = torch.empty(0, dtype=u.shard.dtype, device=u.shard.device)
        self._closed = True

    def memory(self) -> dict[str, int]:
        """Bytes of this rank: ``shards`` (the parameter shards), ``gathered`` (full buffers of forward and
        backward held now), ``peak_gathered`` (most held at once since construction or :meth:`reset_peak`),
        ``bound`` (the declared working-buffer bound, :meth:`bound_bytes`). The full copies of
        ``gathered()`` (the whole model, by definition) are not counted."""
        return {"shards": sum(u.shard.numel() * u.shard.element_size() for u in self.units), "gathered": self._live,
                "peak_gathered": self._peak, "bound": self.bound_bytes()}

    def bound_bytes(self) -> int:
        """The declared working-buffer bound: 3 × the largest bucket (see the module doc)."""
        return 3 * max((u.nbytes for u in self.units), default=0)

    def reset_peak(self) -> None:
        self._peak = self._live

    # ---- buffers --------------------------------------------------------------------------------------
    def _issue(self, b: int) -> None:
        u = self.units[b]
        u.issue(self.reducer)
        self._live += u.nbytes
        self._peak = max(self._peak, self._live)
        if u.data_ptr():
            self._ptr[u.data_ptr()] = b

    def _free(self, b: int) -> None:
        u = self.units[b]
        if u.state == FREE:
            u.bind_placeholders()
            return
        self._ptr.pop(u.data_ptr(), None)
        self._live -= u.nbytes
        u.free()

    def _copy_all(self) -> None:
        """Every bucket gathered into a fresh copy (:meth:`Unit.gather_copy`), in bucket order."""
        futures = [u.gather_copy(self.reducer) for u in self.units]
        for f in futures:
            f.wait()

    def _prefetch(self, walk: Walk) -> None:
        b = walk.next_prefetch(lambda u: self.units[u].state == FREE and u not in self._done)
        if b is not None:
            self._issue(b)

    # ---- forward --------------------------------------------------------------------------------------
    def _hook(self) -> list:
        handles = []
        for m in self.module.modules():
            if id(m) in self._needs:
                handles.append(m.register_forward_pre_hook(self._pre, prepend=True))
                handles.append(m.register_forward_hook(self._post, always_call=True))
        handles.append(self.module.register_forward_pre_hook(self._begin, prepend=True))
        handles.append(self.module.register_forward_hook(self._end, always_call=True))
        for u in self.units:
            handles.append(u.flat.register_post_accumulate_grad_hook(lambda _, b=u.index: self._gradient(b)))
        return handles

    def _begin(self, module, args) -> None:
        if self._in_gathered:
            return
        self._depth += 1
        if self._depth > 1:
            return
        if self._bwd is not None:
            self._end_backward()
        self._fwd = Walk(self._plan_fwd, self.prefetch and self._recorded)
        self._grad_fwd = torch.is_grad_enabled()
        self._frames.append([module, True, []])
        self._saved.__enter__()
        self._prefetch(self._fwd)

    def _end(self, module, args, output) -> None:
        if self._in_gathered or self._depth == 0:
            return
        self._depth -= 1
        if self._depth:
            return
        walk, self._fwd = self._fwd, None
        self._post(module, args, output)
        for u in self.units:
            if self._refs[u.index] == 0:
                self._free(u.index)
        if sys.exc_info()[1] is not None:
            return
        if not self._recorded:
            self._agree_first_forward(len(walk.events))
        self._plan_fwd = walk.events
        if self._grad_fwd:
            self._plan_bwd = walk.events[::-1]

    def _agree_first_forward(self, n: int) -> None:
        self._agree_order(-1, n)
        self._recorded = True

    def _agree_order(self, b: int, k: int) -> None:
        """The first forward's check: before its ``k``-th gather (unit ``b``; -1: the forward ended) every
        rank all-gathers what it is about to do and compares: ``MismatchError`` on every rank alike."""
        if not self.units or self.reducer.shard_size == 1:
            return
        p, r = self.reducer.shard_size, self.reducer.shard_rank
        row = torch.zeros(2 * p, dtype=torch.int64, device=self.units[0].shard.device)
        row[2 * r], row[2 * r + 1] = b, k
        self.reducer.allgather_(row, [2] * p, "zero3/first forward", check=True).wait()
        rows = [tuple(x) for x in row.view(p, 2).tolist()]
        odd = next((i for i in range(p) if rows[i] != rows[0]), None)
        if odd is not None:
            raise MismatchError(
                f"ZeRO stage 3: the ranks' forwards differ: at gather {k} of the first forward rank 0 "
                f"{self._what(rows[0][0])} but rank {odd} {self._what(rows[odd][0])}; every rank must call the "
                f"same modules in the same order")

    def _what(self, b: int) -> str:
        return "ended its forward" if b < 0 else f"gathers unit {b} ({self.units[b].name})"

    def _pre(self, module, args) -> None:
        frame = [module, False, []]
        self._frames.append(frame)
        if self._in_gathered or self._closed:
            return
        fresh = []
        for b in self._needs[id(module)]:
            self._refs[b] += 1
            frame[2].append(b)
            if self._refs[b] == 1:
                fresh.append(b)
        for b in fresh:
            self._acquire_forward(b)
        for b in fresh:
            with self._meter.waiting():
                self.units[b].wait()
            self.units[b].bind_views()
        self._saved.__enter__()
        frame[1] = True

    def _resolve(self, b: int, k: int) -> torch.Tensor | None:
        """A placeholder of slot ``k`` of unit ``b`` used in a forward outside its module's own (a parent
        reading ``child.weight``, ``nn.MultiheadAttention`` reading ``out_proj.weight``): the unit is
        gathered on this first use and held until the innermost running stage-3 forward ends. None
        outside forwards (the placeholder raises)."""
        if self._closed or self._in_gathered or not self._frames or torch._C._current_graph_task_id() != -1:
            return None
        u = self.units[b]
        if self._refs[b] == 0:
            self._refs[b] += 1
            self._frames[-1][2].append(b)
            self._acquire_forward(b)
            u.wait()
            u.bind_views()
        return u.current[k]

    def _post(self, module, args, output) -> None:
        if not self._frames or self._frames[-1][0] is not module:
            return
        _, pushed, acquired = self._frames.pop()
        if pushed:
            self._saved.__exit__(None, None, None)
        for b in acquired:
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free(b)

    def _acquire_forward(self, b: int) -> None:
        walk = self._fwd
        if walk is not None:
            for s in walk.advance(b):
                if self._refs[s] == 0:
                    self._free(s)
        if walk is not None and not self._recorded:
            self._agree_order(b, len(walk.events) - 1)
        if self.units[b].state == FREE:
            self._issue(b)
        if walk is not None:
            self._prefetch(walk)

    # ---- backward -------------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor):
        if self._ptr and t.layout == torch.strided and not t.is_meta:
            try:
                b = self._ptr.get(t.untyped_storage().data_ptr())
            except (RuntimeError, NotImplementedError):
                return t
            if b is not None:
                return _Saved(b, t)
        return t

    def _unpack(self, x):
        if type(x) is _Saved:
            self._acquire_backward(x.unit)
            return x.tensor
        return x

    def _acquire_backward(self, b: int) -> None:
        walk = self._backward()
        for s in walk.advance(b):
            if s not in self._bwd_use and self._refs[s] == 0:
                self._free(s)
        u = self.units[b]
        if u.state == FREE:
            self._issue(b)
        self._bwd_use.add(b)
        self._prefetch(walk)
        with self._meter.waiting():
            u.wait()

    def _gradient(self, b: int) -> None:
        walk = self._backward()
        u = self.units[b]
        grad, u.flat.grad = u.flat.grad, None
        self._done.add(b)
        self._bwd_use.discard(b)
        walk.drop(b)
        if self._refs[b] == 0:
            self._free(b)
        if grad is not None:
            self.on_gradient(b, grad)

    def _backward(self) -> Walk:
        if self._bwd is None:
            self._bwd = Walk(self._plan_bwd, self.prefetch)
            self._bwd_use, self._done = set(), set()
            if torch._C._current_graph_task_id() != -1:
                torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        return self._bwd

    def _end_backward(self) -> None:
        self._bwd = None
        self._bwd_use, self._done = set(), set()
        for u in self.units:
            if self._refs[u.index] == 0:
                self._free(u.index)

    # ---- checks ---------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("ZeRO stage 3: these parameters were closed (close() gave the module its "
                               "parameters back)")

    def _check_idle(self, what: str) -> None:
        self._check_open()
        if self._in_gathered:
            raise RuntimeError(f"ZeRO stage 3: {what} inside gathered()")
        if self._frames or self._depth:
            raise RuntimeError(f"ZeRO stage 3: {what} inside a forward of the model")
        if torch._C._current_graph_task_id() != -1:
            raise RuntimeError(f"ZeRO stage 3: {what} inside a backward")
        if self._bwd is not None:
            self._end_backward()
