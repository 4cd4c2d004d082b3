"""Communication overlapping the next forward: the optimizer update of each parameter moves from
``optimizer.step()`` to the forward pre-hook of the module that registers it
(:meth:`ringlet.torch.training.ddp.DistributedDataParallel.overlap_optimizer`).

After a reduced backward the averages are still in flight (priority scheduling sends the front layers'
first). :class:`OptimizerOverlap` then holds every parameter of the DDP as *pending*; a pending
parameter is *released* — its pieces waited for, its average delivered into ``.grad``, the optimizer
steps recorded since the backward applied to it, then the ``zero_grad`` recorded — by the first of:

* a forward pre-hook of a module that registers it (so each layer's forward waits for its own update
  only, while the pieces of the layers after it are still on the wire; the pending parameters whose
  pieces have arrived already land with it, in the same optimizer call);
* the end of the DDP's forward (parameters of modules that did not run);
* :meth:`OptimizerOverlap.flush` (``ddp.synchronize()``, ``state_dict()`` of the module or optimizer).

The patched ``optimizer.step()`` records the update: it snapshots the param groups' settings
(learning rate etc., so a scheduler stepping in between does not change this update), updates at once
the parameters that are not pending, and returns None. Released later, a group of parameters is
stepped by the optimizer class's own ``step`` with each param group narrowed to them and its settings
set to the snapshot. Every parameter is stepped exactly once per recorded step with exactly the
gradient and settings of a synchronous step, so the result is bit for bit that of the synchronous DDP
for optimizers whose update of a parameter depends only on that parameter's gradient and state and its
group's settings (SGD, Adam, AdamW, RMSprop, Adagrad, ... — not LBFGS).

Calls that cannot be deferred exactly make everything land first, then run as usual: ``step(closure)``,
a second ``step()`` on the same gradients, and ``zero_grad()`` before ``step()``.
"""
from __future__ import annotations

import functools
import types
from typing import Any, Callable

import torch

from ringlet import timeline

from .graph import params_reached

__all__ = ["OptimizerOverlap", "TRACK"]

TRACK = "forward"  # the WAIT and UPDATE spans nest in the DDP's FORWARD spans


class _Deferred:
    """One optimizer's recorded ``step`` (its groups' settings, or None) and ``zero_grad`` (its
    ``set_to_none``, or None) for the parameters still pending."""

    __slots__ = ("opt", "params", "ids", "groups", "zero")

    def __init__(self, opt: torch.optim.Optimizer):
        self.opt = opt
        self.params = [p for g in opt.param_groups for p in g["params"]]
        self.ids = {id(p) for p in self.params}
        self.groups: list[dict] | None = None
        self.zero: bool | None = None

    def record_groups(self) -> None:
        self.groups = [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in g.items() if k != "params"}
                       for g in self.opt.param_groups]

    def narrowed(self, params: list[torch.Tensor], fn: Callable[[], Any], settings: bool) -> None:
        """Run ``fn`` with every param group narrowed to ``params`` (and set to the snapshot when
        ``settings``); restores the groups afterwards."""
        ids = {id(p) for p in params if id(p) in self.ids}
        if not ids:
            return
        saved = []
        for g, snap in zip(self.opt.param_groups, self.groups if settings else [None] * len(self.opt.param_groups)):
            saved.append((g["params"], {k: g[k] for k in snap} if snap else None))
            g["params"] = [p for p in g["params"] if id(p) in ids]
            if snap:
                g.update(snap)
        try:
            fn()
        finally:
            for g, (ps, hyper) in zip(self.opt.param_groups, saved):
                g["params"] = ps
                if hyper:
                    g.update(hyper)

    def apply(self, params: list[torch.Tensor]) -> None:
        """The recorded step, then the recorded zeroing, for ``params`` (those of this optimizer)."""
        if self.groups is not None:
            self.narrowed(params, lambda: type(self.opt).step(self.opt), True)
        if self.zero is not None:
            zero_grads([p for p in params if id(p) in self.ids], self.zero)


def zero_grads(params: list[torch.Tensor], set_to_none: bool) -> None:
    """``Optimizer.zero_grad`` for ``params`` only (the same steps as torch's, without its per-call cost)."""
    for p in params:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
            continue
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        p.grad.zero_()


class OptimizerOverlap:
    """Pending parameters of one DDP and the optimizers whose updates follow them (see the module doc).

    ``module``: the wrapped module (pre-hooks go on every module registering a parameter of
    ``params``); ``source``: where averages come from — ``deliver_params(params)`` waits for their pieces
    and writes their averages into ``.grad``, ``landable(params)`` says which of them would not wait;
    ``names``: id(param) -> name, for errors.
    """

    def __init__(self, module: torch.nn.Module, params: list[torch.nn.Parameter], source: Any,
                 names: dict[int, str]):
        self._params = params
        self._source = source
        self._names = names
        self._left: dict[int, torch.nn.Parameter] = {}
        self._opts: list[_Deferred] = []
        ids = {id(p) for p in params}
        self._handles = [module.register_state_dict_pre_hook(lambda *_: self.flush())]
        for m in module.modules():
            own = [p for p in m._parameters.values() if p is not None and id(p) in ids]
            if own:
                self._handles.append(m.register_forward_pre_hook(functools.partial(self._pre_hook, own)))

    # ---- optimizers --------------------------------------------------------------------------------------
    def add(self, opt: torch.optim.Optimizer) -> None:
        """Defer ``opt``'s ``step`` and ``zero_grad`` (patched on the instance; ``state_dict`` and
        ``load_state_dict`` flush first). ``TypeError`` for a non-optimizer; ``ValueError`` for LBFGS, an
        optimizer added before, or one sharing parameters with an optimizer added before."""
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"overlap_optimizer needs a torch.optim.Optimizer, got {type(opt).__name__}")
        if isinstance(opt, torch.optim.LBFGS):
            raise ValueError("overlap_optimizer: LBFGS re-evaluates the model inside step(); its update "
                             "cannot be split per parameter.")
        d = _Deferred(opt)
        for other in self._opts:
            if other.opt is opt:
                raise ValueError("overlap_optimizer: this optimizer was added already.")
            if other.ids & d.ids:
                raise ValueError("overlap_optimizer: the optimizer shares parameters with one added before.")
        self._opts.append(d)
        cls = type(opt)
        opt.step = types.MethodType(lambda o, closure=None: self._step(d, closure), opt)
        opt.zero_grad = types.MethodType(lambda o, set_to_none=True: self._zero(d, set_to_none), opt)
        opt.state_dict = types.MethodType(lambda o: (self.flush(), cls.state_dict(o))[1], opt)
        opt.load_state_dict = types.MethodType(lambda o, sd: (self.flush(), cls.load_state_dict(o, sd))[1], opt)

    def _step(self, d: _Deferred, closure):
        cls = type(d.opt)
        if self._left and (closure is not None or d.groups is not None):
            self.flush()  # a closure, or a second step on the same gradients: synchronous semantics
        if not self._left:
            return cls.step(d.opt) if closure is None else cls.step(d.opt, closure)
        d.record_groups()
        d.narrowed([p for p in d.params if id(p) not in self._left], lambda: cls.step(d.opt), True)
        return None

    def _zero(self, d: _Deferred, set_to_none: bool) -> None:
        cls = type(d.opt)
        if self._left and d.groups is None:
            self.flush()  # zero_grad before step discards these gradients: let them land first
        if not self._left:
            cls.zero_grad(d.opt, set_to_none)
            return
        d.zero = set_to_none
        zero_grads([p for p in d.params if id(p) not in self._left], set_to_none)

    # ---- the pending parameters ----------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether some parameter's average or update has not landed yet."""
        return bool(self._left)

    def begin(self) -> None:
        """A reduced backward ended with its averages in flight: every parameter is pending."""
        self._left = {id(p): p for p in self._params}
        for d in self._opts:
            d.groups = d.zero = None

    def release(self, params: list[torch.nn.Parameter]) -> None:
        """Land the pending ones of ``params``: their averages, then the recorded step and zeroing."""
        ps = [p for p in params if id(p) in self._left]
        if not ps:
            return
        t0 = timeline.now_us()
        with torch.no_grad():
            self._source.deliver_params(ps)
            t1 = timeline.now_us()
            for d in self._opts:
                d.apply(ps)
        for p in ps:
            del self._left[id(p)]
        timeline.span(TRACK, "WAIT", t0, t1, {"params": len(ps)})
        timeline.span(TRACK, "UPDATE", t1, timeline.now_us(), {"params": len(ps)})
        if not self._left:
            for d in self._opts:
                d.groups = d.zero = None

    def flush(self) -> None:
        """Land every pending parameter."""
        self.release(list(self._left.values()))

    def finish_forward(self, out: Any) -> None:
        """End of the DDP's forward: land what no module's pre-hook did; ``RuntimeError`` (after landing
        it) when the forward's output depends on such a parameter — it was read with its old value,
        outside the forward of every module that registers it."""
        if not self._left:
            return
        reached = params_reached(out)
        stale = [p for p in self._left.values() if id(p) in reached]
        self.flush()
        if stale:
            names = ", ".join(self._names.get(id(p), "?") for p in stale[:10])
            raise RuntimeError(f"DistributedDataParallel.overlap_optimizer: the forward used parameter(s) {names} "
                               "before their update landed: with overlap_optimizer a parameter must be read "
                               "inside the forward of a module that registers it. Call ddp.synchronize() "
                               "before such a forward, or train without overlap_optimizer.")

    def _pre_hook(self, own: list[torch.nn.Parameter], module: torch.nn.Module, args) -> None:
        if self._left:
            mine = {id(p) for p in own}
            others = [p for p in self._left.values() if id(p) not in mine]
            self.release(own + self._source.landable(others))
