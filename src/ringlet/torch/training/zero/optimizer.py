"""``ringlet.torch.ZeroOptimizer``: any torch optimizer, its model state sharded over the data-parallel group.

::

    zero = ringlet.torch.ZeroOptimizer(torch.optim.AdamW, model, stage=2, lr=1e-3)
    for x, y in data:
        loss_fn(model(x), y).backward()
        zero.step()
        zero.zero_grad()

The model is *not* wrapped: every rank runs its own forward and backward on its own batch; the
optimizer averages the gradients over the group and keeps the ranks' parameters equal.

* **Stage 1** (optimizer state sharded): backward leaves local gradients in ``param.grad``;
  :meth:`ZeroOptimizer.step` reduce-scatters them bucket by bucket (average), steps the inner optimizer
  on this rank's float32 shard, and all-gathers the updated parameters.
* **Stage 2** (gradients sharded too): buckets are reduce-scattered during backward as their gradients
  complete and the full gradients freed (``param.grad`` is None after backward); the shards accumulate
  over several backwards until :meth:`ZeroOptimizer.zero_grad`.
* **Stage 3** (parameters sharded too): the module keeps only this rank's shard of every parameter;
  ``zero.stage3.ShardedParameters`` gathers each unit for its forward and backward and hands its
  gradient over, which is reduce-scattered as in stage 2; the step writes the updated shard, no gather.

Every rank must construct, step and zero in the same order (the collectives run in submission order).
See ``docs/zero.md`` for the memory model and the working-buffer bounds.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any

import torch

from ringlet import straggler
from ...comm import Comm
from .clip import clip_shards_
from .flat_params import FlatParameters
from .gradients import LocalGradients, StreamedGradients, Working
from .layout import Layout
from .options import ZeroOptions, partition_for
from .piece_state import check_own_state_dict, load_pieces, own_state_dict, shard_state
from .reduce import Reducer
from .shards import Shards
from .state import Fetch, ShardState

__all__ = ["ZeroOptimizer"]

_ids = itertools.count()


class ZeroOptimizer(torch.optim.Optimizer):
    """``optimizer_class`` (a ``torch.optim.Optimizer`` subclass, built with ``**defaults``) stepping only
    this rank's shard of ``params``.

    ``params``: an ``nn.Module`` (its trainable ``named_parameters()``; the names are the checkpoint keys),
    or, for stages 1 and 2, an iterable of parameters or of param-group dicts (names ``"{group}.{index}"``).
    ``stage``: 1, 2 or 3 (3 needs a module). ``options``: :class:`~.options.ZeroOptions`.

    Construction broadcasts the parameters (and a module's buffers) from the group's first rank. Parameters
    become views of flat buffers (stages 1-2) or shards (stage 3): keep using the same Parameter objects.
    ``param_groups`` and ``state`` are the inner optimizer's (its params are views of this rank's shard),
    so LR schedulers and ``zero.param_groups[0]["lr"] = ...`` work; :class:`~ringlet.torch.GradScaler` works
    with ``scaler.step(zero)`` (its overflow verdict is agreed by the group: each rank checks its shard).

    ``TypeError``: ``optimizer_class`` not an optimizer class, parameters that are not floating tensors,
    ``params`` of the wrong kind (stage 3 without a module); ``ValueError``: stage not in 1..3, LBFGS (its
    closure re-evaluates the whole model: it cannot step a shard), sparse embeddings, a parameter given
    twice, no trainable parameter, parameters on several devices, an empty or mixed ``params`` list.
    """

    def __init__(self, optimizer_class: type, params, *, stage: int = 1, options: ZeroOptions | None = None,
                 **defaults: Any):
        options = ZeroOptions() if options is None else options
        _check_class(optimizer_class, stage, options)
        module, named, gidx, groups = _collect(params, stage)
        self._stage, self._options, self._module = stage, options, module
        self._comm = Comm(options.group)
        self._reducer = options.reducer if options.reducer is not None else Reducer(self._comm)
        self._prefix = f"zero{next(_ids)}"
        self._meter = straggler.meter()  # this rank's step times, for straggler detection
        self._working = Working()
        partition = partition_for(optimizer_class, options)
        if stage < 3:
            self._build_flat(named, gidx, partition)
        else:
            self._build_stage3(module, named, gidx, partition)
        self._shards = Shards(self._layout, self.shard_rank, self._block, self._grads.shard, optimizer_class,
                              groups, defaults)
        inner = self._shards.optimizer
        self._open = True  # torch.optim.Optimizer.__init__ registers the inner groups through add_param_group
        super().__init__(inner.param_groups, inner.defaults)
        self._open = False
        self._bind_inner()

    # ---- construction -----------------------------------------------------------------------------------------
    def _build_flat(self, named, gidx, partition) -> None:
        """Stages 1-2: layout in reverse registration order (backward's), flat parameter buffers, broadcast."""
        rev = list(reversed(named))
        rgidx = list(reversed(gidx))
        params = [p for _, p in rev]
        self._layout = Layout.bucketed(rev, rgidx, self._reducer.shard_size, self._options.bucket_bytes, partition)
        self._flat = FlatParameters(self._layout, params, self.shard_rank)
        if self._comm.size > 1:
            self._flat.broadcast(self._comm, self._prefix)
            self._broadcast_rest({id(p) for p in params})
        self._block = self._flat.block
        if self._stage == 1:
            self._grads = LocalGradients(self._layout, params, self.shard_rank, self._reducer, self._options,
                                         self._prefix, self._working)
        else:
            self._grads = StreamedGradients(self._layout, params, self.shard_rank, self._reducer, self._options,
                                            self._prefix, self._working, range(len(self._layout.buckets)),
                                            whole=False)
        self._store = None

    def _build_stage3(self, module, named, gidx, partition) -> None:
        """Stage 3: one bucket per unit; ``zero.stage3.ShardedParameters`` keeps the shards."""
        try:
            from .stage3 import ShardedParameters, units_of
        except ImportError as exc:  # pragma: no cover - depends on the stage-3 module being present
            raise ValueError(f"ZeroOptimizer(stage=3) needs ringlet.torch.training.zero.stage3: {exc}") from exc
        if self._comm.size > 1:
            self._broadcast_rest(set())
        self._flat = None
        self._layout = Layout.units(named, gidx, self._reducer.shard_size, _units(units_of, module, named, gidx),
                                    partition)
        n = len(self._layout.buckets)
        self._grads = StreamedGradients(self._layout, [p for _, p in named], self.shard_rank, self._reducer,
                                        self._options, self._prefix, self._working, range(n - 1, -1, -1), whole=True)
        self._store = ShardedParameters(module, named, self._layout, self._reducer, self._grads.on_bucket,
                                        prefetch=self._options.prefetch)
        self._block = self._store.shard

    def _broadcast_rest(self, done: set[int]) -> None:
        """The module's parameters not broadcast yet (frozen ones; all in stage 3) and its buffers."""
        from ..broadcast import broadcast_coalesced

        if self._module is None:
            return
        rest = [p.data for p in self._module.parameters() if id(p) not in done]
        broadcast_coalesced(self._comm, rest + list(self._module.buffers()), f"{self._prefix}.state")

    def _bind_inner(self) -> None:
        inner = self._shards.optimizer
        self.param_groups = inner.param_groups
        self.state = inner.state
        self.defaults = inner.defaults

    # ---- properties -----------------------------------------------------------------------------------------
    @property
    def stage(self) -> int:
        return self._stage

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def reducer(self):
        return self._reducer

    @property
    def world(self) -> int:
        """The number of shards (ranks sharing one copy of the model state: ``reducer.shard_size``)."""
        return self._reducer.shard_size

    @property
    def shard_rank(self) -> int:
        """This rank's place among the :attr:`world` shards."""
        return self._reducer.shard_rank

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The inner optimizer (on piece views of this rank's master shard)."""
        return self._shards.optimizer

    @property
    def options(self) -> ZeroOptions:
        return self._options

    # ---- training -------------------------------------------------------------------------------------------
    def sync_master_grads(self) -> None:
        """Bring the averaged gradients into the float32 gradient shards now (stage 1: the reduce-scatter;
        stages 2-3: already there after backward). :class:`~ringlet.torch.GradScaler` calls it before it
        unscales; :meth:`step` calls it when nobody did."""
        self._grads.sync()

    def step(self, closure=None):
        """``closure`` (with grad) if given, then :meth:`sync_master_grads`, the inner optimizer's step on
        this rank's shard, and the parameters refreshed from the masters (stages 1-2: all-gathered; stage 3:
        written into the shard). Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._meter.grads_ready()
        with self._meter.waiting():
            self._grads.sync()
        self._shards.optimizer.step()
        self._grads.stepped()
        with self._meter.waiting():
            self._refresh()
        self._meter.end_step()
        return loss

    def _refresh(self) -> None:
        if self._flat is not None:
            self._flat.gather(self._reducer, self._prefix, self._shards.write_back)
        else:
            for b in range(len(self._layout.buckets)):
                self._shards.write_back(b)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients (``set_to_none`` is accepted for compatibility): stage 1 zeros the flat gradient
        buffers (``param.grad`` stays their view), stages 2-3 the gradient shards."""
        self._grads.zero()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradient by the norm of the whole model, as ``torch.nn.utils.clip_grad_norm_``
        on an unsharded model would (:mod:`.clip`: one all-reduce of a partial norm); returns that norm
        before clipping, the same on every rank. Call it between backward and :meth:`step` (after
        ``scaler.unscale_(zero)`` with a loss scaler), on every rank."""
        self._grads.sync()
        shards = [self._grads.shard(b) for b in range(len(self._layout.buckets))]
        replicas = max(1, self._reducer.world // self._reducer.shard_size)
        return clip_shards_(shards, max_norm, norm_type, self._comm, replicas, f"{self._prefix}.clip")

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_open", False):
            return super().add_param_group(param_group)
        raise NotImplementedError("ZeroOptimizer: parameter groups are fixed at construction (the layout shards "
                                  "them); build a new ZeroOptimizer with every group instead")

    def gathered(self, writeback: bool = False):
        """Stage 3: a context manager with every parameter full (see ``ShardedParameters.gathered``); stages
        1-2: the parameters already are full (a context that does nothing)."""
        return self._store.gathered(writeback=writeback) if self._store is not None else contextlib.nullcontext()

    def close(self) -> None:
        """Remove the hooks (stage 2) and, in stage 3, leave full parameters in the module."""
        self._grads.close()
        if self._store is not None:
            self._store.close()

    # ---- memory ---------------------------------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """Bytes this rank holds, from the tensors it owns: ``parameters`` (stages 1-2: the full flat buffers;
        stage 3: the shards), ``gradients`` (stage 1: the full flat gradient buffers plus float32 shards that are
        not views of them; stages 2-3: the float32 shards), ``optimizer`` (every tensor of the inner
        optimizer's state), ``master`` (float32 master shards that are copies; none for float32 parameters),
        ``buffers`` (the most working-buffer bytes held at once so far), ``buffers_now`` (held now) and
        ``buffers_bound`` (the declared bound, :meth:`working_bound`)."""
        if self._flat is not None:
            params = self._flat.nbytes()
        else:
            params = sum(self._store.shard(b).numel() * self._store.shard(b).element_size()
                         for b in range(len(self._layout.buckets)))
        return {"parameters": params, "gradients": self._grads.nbytes(),
                "optimizer": self._shards.state_bytes(), "master": self._shards.master_bytes(),
                "buffers": self._working.peak, "buffers_now": self._working.current,
                "buffers_bound": self.working_bound()}

    def working_bound(self) -> int:
        """The declared bound on the bytes this rank holds beyond the model state while it trains (see
        ``docs/zero.md``): the stage's own buffers — stage 1: ``max_inflight`` cast buffers when gradients
        travel in another dtype, else none; stage 2: ``max_inflight`` flat buckets in the travelling dtype
        plus two buckets of ``.grad`` (model dtype); stage 3: ``max_inflight`` flat buckets plus the gathered
        units of ``ShardedParameters.bound_bytes()`` — plus the transients of every step: the inner
        optimizer's temporaries (two float32 tensors of this rank's largest piece, as torch's elementwise
        optimizers make) and, in stage 1, autograd's fresh gradient of a parameter before it is added into
        ``.grad`` (the largest parameter, model dtype)."""
        buckets = self._layout.buckets
        travel = max((b.numel * (self._options.reduce_dtype or b.dtype).itemsize for b in buckets), default=0)
        model = max((b.numel * b.dtype.itemsize for b in buckets), default=0)
        k = self._options.max_inflight
        temps = 2 * 4 * max((p.numel for p in self._shards.pieces), default=0)
        if self._stage == 1:
            casts = any((self._options.reduce_dtype or b.dtype) != b.dtype for b in buckets)
            fresh = max((s.numel * b.dtype.itemsize for b in buckets for s in b.slots), default=0)
            return (k * travel if casts else 0) + fresh + temps
        if self._stage == 2:
            return k * travel + 2 * model + temps
        extra = getattr(self._store, "bound_bytes", None) or getattr(self._store, "working_bound", None)
        return k * travel + (extra() if callable(extra) else 0) + temps

    # ---- checkpoints ----------------------------------------------------------------------------------------
    def shard_state(self, extra: dict | None = None) -> ShardState:
        """Copies of this rank's state by parameter name and element range (see ``zero/state.py``)."""
        return shard_state(self._shards, self._stage, self.world, self.shard_rank, extra)

    def load_shard_state(self, fetch: Fetch, groups: list[dict] | None = None) -> None:
        """Fill this rank's masters and optimizer state from ``fetch(name, start, end)`` (any world size saved
        them), then refresh the parameters (stages 1-2: all-gather, so every rank must call it together;
        stage 3: the shards). ``groups``: the param groups' hyperparameters to restore too (a ShardState's
        ``groups``). :class:`~.state.CheckpointMismatch` when the checkpoint does not fit."""
        load_pieces(self._shards, fetch, groups)
        self._refresh()

    def state_dict(self) -> dict:
        """This rank's own shard: the inner optimizer's ``state_dict``, the masters and the layout's identity.
        Loads only into the same world size and rank (:meth:`shard_state` reshards)."""
        return own_state_dict(self._shards, self._stage, self.world, self.shard_rank)

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict` (every rank together: the parameters are refreshed). ``ValueError`` for
        another world size, rank or layout."""
        check_own_state_dict(self._shards, state_dict, self.world, self.shard_rank)
        self._shards.optimizer.load_state_dict(state_dict["optimizer"])
        self._bind_inner()
        for m, saved in zip(self._shards.masters, state_dict["master"]):
            m.copy_(saved)
        self._refresh()

    def __repr__(self) -> str:
        return (f"ZeroOptimizer(stage={self._stage}, {type(self._shards.optimizer).__name__}, world={self.world}, "
                f"shard_rank={self.shard_rank}, buckets={len(self._layout.buckets)})")


def _units(units_of, module, named, gidx) -> list[list[int]]:
    """``units_of(module, named)``, passing the param-group indices too where it takes them (to split a
    module's parameters by dtype and group)."""
    import inspect

    if len(inspect.signature(units_of).parameters) >= 3:
        return units_of(module, named, gidx)
    return units_of(module, named)


def _check_class(optimizer_class, stage, options) -> None:
    if not isinstance(optimizer_class, type) or not issubclass(optimizer_class, torch.optim.Optimizer):
        raise TypeError(f"ZeroOptimizer: optimizer_class must be a torch.optim.Optimizer subclass (the class, not "
                        f"an instance), got {optimizer_class!r}")
    if issubclass(optimizer_class, ZeroOptimizer):
        raise TypeError("ZeroOptimizer: optimizer_class cannot be ZeroOptimizer itself")
    if issubclass(optimizer_class, torch.optim.LBFGS):
        raise ValueError("ZeroOptimizer: LBFGS is not supported: its step re-evaluates the whole model through a "
                         "closure and looks at every parameter at once, which a shard cannot do")
    if isinstance(stage, bool) or stage not in (1, 2, 3):
        raise ValueError(f"ZeroOptimizer: stage must be 1, 2 or 3, got {stage!r}")
    if not isinstance(options, ZeroOptions):
        raise TypeError(f"ZeroOptimizer: options must be a ZeroOptions, got {type(options).__name__}")


def _collect(params, stage: int):
    """``(module or None, [(name, param)], [group index], [group options])`` in registration order."""
    if isinstance(params, torch.nn.Module):
        _refuse_sparse(params)
        named = [(n, p) for n, p in params.named_parameters() if p.requires_grad]
        return params, _checked(named), [0] * len(named), [{}]
    if stage == 3:
        raise TypeError("ZeroOptimizer(stage=3) needs the nn.Module (its forward gathers the parameters), "
                        "not a list of parameters")
    if isinstance(params, torch.Tensor):
        raise TypeError("ZeroOptimizer: params must be an nn.Module or an iterable of parameters or dicts, "
                        "not a single tensor")
    items = list(params)
    if not items:
        raise ValueError("ZeroOptimizer: got an empty parameter list")
    if all(isinstance(g, dict) for g in items):
        groups = items
    elif any(isinstance(g, dict) for g in items):
        raise TypeError("ZeroOptimizer: params mixes param-group dicts and tensors")
    else:
        groups = [{"params": items}]
    named, gidx, opts = [], [], []
    for gi, g in enumerate(groups):
        if "params" not in g:
            raise ValueError(f"ZeroOptimizer: param group {gi} has no 'params'")
        ps = g["params"]
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        named += [(f"{gi}.{i}", p) for i, p in enumerate(ps)]
        gidx += [gi] * len(ps)
        opts.append({k: v for k, v in g.items() if k != "params"})
    return None, _checked(named), gidx, opts


def _checked(named):
    if not named:
        raise ValueError("ZeroOptimizer: no trainable parameters")
    seen: dict[int, str] = {}
    for name, p in named:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"ZeroOptimizer: {name} is a {type(p).__name__}, not a tensor")
        if not p.is_floating_point():
            raise TypeError(f"ZeroOptimizer: parameter {name} has dtype {p.dtype}; only floating parameters shard")
        if not p.is_leaf:
            raise ValueError(f"ZeroOptimizer: parameter {name} is not a leaf tensor")
        if id(p) in seen:
            raise ValueError(f"ZeroOptimizer: a parameter is given twice ({seen[id(p)]} and {name})")
        seen[id(p)] = name
    devices = {p.device for _, p in named}
    if len(devices) > 1:
        raise ValueError(f"ZeroOptimizer: parameters on several devices {sorted(map(str, devices))}")
    return named


def _refuse_sparse(module: torch.nn.Module) -> None:
    for name, m in module.named_modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
            raise ValueError(f"ZeroOptimizer: {name or type(m).__name__} makes sparse gradients (sparse=True); "
                             "ZeRO reduce-scatters dense buckets: use sparse=False")
