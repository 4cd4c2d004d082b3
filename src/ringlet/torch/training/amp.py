"""``ringlet.torch.GradScaler``: torch's dynamic loss scaling, with the overflow decision agreed by the group.

A drop-in for ``torch.amp.GradScaler`` (same methods, same state dict, same scale sequence for the same
pattern of overflows) that does not depend on CUDA and that keeps the ranks in step:

* :meth:`GradScaler.unscale_` multiplies the optimizer's gradients by ``1/scale`` (in place) and checks
  them for inf/NaN, as torch does; then one tiny all-reduce (MAX of a found-inf flag, through
  :class:`~ringlet.torch.comm.Comm`) makes the verdict the group's. So when any rank's gradients
  overflowed, **every** rank skips :meth:`GradScaler.step` and backs off its scale in
  :meth:`GradScaler.update`; the ranks' scales never diverge. Every rank must therefore call
  ``unscale_`` (or ``step``, which calls it) for the same optimizers in the same order.
* The arithmetic is torch's: the scale is a float32 value; ``inv_scale = float32(1 / float64(scale))``;
  after an overflow ``scale *= backoff_factor`` and the growth tracker restarts; after ``growth_interval``
  consecutive clean steps ``scale *= growth_factor`` (unless that overflows float32).
* Unscaling before clipping works as in torch: ``scaler.unscale_(opt); clip_grad_norm_(...);
  scaler.step(opt)``.
* :meth:`GradScaler.on_scale_change` registers ``fn(old, new)``, called on every rank when
  :meth:`GradScaler.update` changes the scale (backoff, growth or an explicit ``new_scale``): the hook
  for state kept in scaled units, such as error-feedback residuals of compressed gradients (rescale them by
  ``new / old``); :meth:`GradScaler.rescale_residuals_of` does that for a ringlet DDP or a hooks' state.

Optimizer protocols honoured (duck-typed, so this module imports neither):

* ``sync_master_grads()`` (:class:`~ringlet.torch.training.master_weights.MasterWeights`): called before
  the gradients are read, so the low-precision gradients are unscaled and checked in float32 on the masters;
* ``synchronize()`` / ``skip_synchronize()`` (the Horovod-style ``DistributedOptimizer``): ``unscale_``
  waits for the gradient reductions first unless the script already did, and ``step`` then steps inside
  ``skip_synchronize()``, so ``scaler.step(opt)`` alone unscales the reduced gradients.

Differences from torch: the constructor's ``device`` defaults to ``"cpu"`` (it only names where scale
tensors for :meth:`GradScaler.scale` go when no output says otherwise; gradients on any device are
handled); bad factors raise ``ValueError``; an optimizer with no gradients at all takes part in the
agreement (found nothing) instead of raising, so no rank is left waiting.
"""
from __future__ import annotations

import contextlib
from collections import OrderedDict, abc
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch.utils.hooks import RemovableHandle

from ringlet.types import ReduceOp

from ..comm import Comm, ensure_initialized, session_key

__all__ = ["GradScaler"]

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


def _f32(x: float) -> float:
    """``x`` rounded to float32, as torch stores the scale."""
    return float(np.float32(x))


class _OptState:
    __slots__ = ("stage", "found_inf", "synchronized")

    def __init__(self) -> None:
        self.stage = _READY
        self.found_inf: bool | None = None  # the group's verdict, once unscale_ ran
        self.synchronized = False           # unscale_ synchronized a DistributedOptimizer itself


class GradScaler:
    """Dynamic loss scaling whose skip/backoff decision is the same on every rank of ``group``.

    ``group``: a :class:`ringlet.Group` or ``ringlet.torch`` ProcessSet (default: the world); the agreement
    runs over it, so it must hold the ranks that train together. ringlet must be initialised by the first
    :meth:`unscale_` (``ringlet.init()``, ``ringlet.torch.init()``, or ``torch.distributed`` for
    :func:`~ringlet.torch.comm.ensure_initialized`). ``ValueError`` when ``growth_factor <= 1``,
    ``backoff_factor`` not in (0, 1) or ``growth_interval < 1``. With ``enabled=False`` every method is a
    pass-through, as in torch.
    """

    def __init__(self, device: str = "cpu", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True, *,
                 group=None):
        if growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be > 1.0, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if int(growth_interval) != growth_interval or growth_interval < 1:
            raise ValueError(f"growth_interval must be a positive integer, got {growth_interval}")
        self._device = device
        self._enabled = bool(enabled)
        self._scale = _f32(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._tracker = 0
        self._per_opt: dict[int, _OptState] = {}
        self._scale_tensors: dict[torch.device, torch.Tensor] = {}
        self._callbacks: OrderedDict[int, Callable[[float, float], None]] = OrderedDict()
        self._group = group
        self._comm: Comm | None = None
        self._comm_key = None
        # One name for every scaler: the agreement is waited for at once, so no two are ever in flight.
        self._name = "ringlet.grad_scaler.found_inf"

    # ---- scaling ---------------------------------------------------------------------------------------
    def scale(self, outputs: torch.Tensor | Iterable[torch.Tensor]):
        """``outputs`` (a tensor, or nested lists/tuples/iterables of tensors) multiplied by the scale, as a
        float32 0-dim tensor on each output's device (so a bfloat16 loss stays bfloat16, as in torch).
        Returned unchanged when disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs * self._scale_on(outputs.device)
        if isinstance(outputs, abc.Iterable):
            scaled = map(self.scale, outputs)
            return type(outputs)(scaled) if isinstance(outputs, (list, tuple)) else scaled
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    def _scale_on(self, device: torch.device) -> torch.Tensor:
        t = self._scale_tensors.get(device)
        if t is None:
            t = self._scale_tensors[device] = torch.full((), self._scale, dtype=torch.float32, device=device)
        return t

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale in place, check them for inf/NaN, and agree on the
        verdict with the group (one all-reduce). Optional before :meth:`step` (which calls it), e.g. to clip
        the unscaled gradients. ``RuntimeError`` when called twice before :meth:`update`, or after
        :meth:`step`; ``ValueError`` for float16 gradients (hold float32 masters: ``MasterWeights``)."""
        if not self._enabled:
            return
        state = self._per_opt.setdefault(id(optimizer), _OptState())
        if state.stage == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state.stage == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        state.synchronized = _synchronize(optimizer)
        prepare = getattr(optimizer, "sync_master_grads", None)
        if callable(prepare):
            prepare()
        local = _unscale_grads_(optimizer, _f32(1.0 / self._scale))
        state.found_inf = self._agree(local)
        state.stage = _UNSCALED

    def _agree(self, found: bool) -> bool:
        """True when any rank of the group found an inf/NaN (MAX of one flag)."""
        comm = self._get_comm()
        if comm.size == 1:
            return found
        flag = torch.tensor([1.0 if found else 0.0], dtype=torch.float32)
        comm.allreduce_(flag, ReduceOp.MAX, self._name).wait()
        return bool(flag.item() > 0)

    def _get_comm(self) -> Comm:
        ensure_initialized()
        key = session_key()
        if self._comm is None or key != self._comm_key:
            self._comm, self._comm_key = Comm(self._group), key
        return self._comm

    # ---- stepping ---------------------------------------------------------------------------------------
    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any):
        """:meth:`unscale_` (unless already called for ``optimizer``), then ``optimizer.step(*args,
        **kwargs)`` unless some rank found inf/NaN; returns what ``step`` returned (None when skipped).
        ``RuntimeError`` for a ``closure`` keyword or a second call before :meth:`update`."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        state = self._per_opt.setdefault(id(optimizer), _OptState())
        if state.stage == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state.stage == _READY:
            self.unscale_(optimizer)
        out = None
        if not state.found_inf:
            skip = optimizer.skip_synchronize() if state.synchronized else contextlib.nullcontext()
            with skip:
                out = optimizer.step(*args, **kwargs)
        elif hasattr(optimizer, "skip_synchronize") and hasattr(optimizer, "_synchronized"):
            optimizer._synchronized = False  # as its skipped step() would have: the next one synchronises anew
        state.stage = _STEPPED
        return out

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """End of the iteration: back off the scale if any optimizer's step was skipped (on every rank
        alike), grow it after ``growth_interval`` clean iterations; or set ``new_scale`` (a float or a
        one-element tensor without grad; the growth tracker is kept). Calls the :meth:`on_scale_change`
        callbacks when the scale changed. ``AssertionError`` (as torch) when no optimizer was unscaled since
        the last update and no ``new_scale`` is given."""
        if not self._enabled:
            return
        old = self._scale
        if new_scale is not None:
            self._scale = _f32(_scalar(new_scale))
        else:
            verdicts = [s.found_inf for s in self._per_opt.values() if s.found_inf is not None]
            if not verdicts:
                raise AssertionError("No inf checks were recorded prior to update.")
            self._advance(any(verdicts))
        self._per_opt.clear()
        if self._scale != old:
            self._scale_tensors.clear()
            for fn in list(self._callbacks.values()):
                fn(old, self._scale)

    def _advance(self, found_inf: bool) -> None:
        """torch's ``_amp_update_scale_``: products in float64, stored as float32."""
        if found_inf:
            self._scale = _f32(self._scale * self._backoff_factor)
            self._tracker = 0
            return
        self._tracker += 1
        if self._tracker == self._growth_interval:
            grown = _f32(self._scale * self._growth_factor)
            if not np.isinf(grown):
                self._scale = grown
            self._tracker = 0

    def on_scale_change(self, fn: Callable[[float, float], None]) -> RemovableHandle:
        """Call ``fn(old_scale, new_scale)`` whenever :meth:`update` changes the scale (the same calls on
        every rank). Returns a handle whose ``remove()`` unregisters ``fn``. Use it to rescale state held
        in scaled units, e.g. ``lambda old, new: rescale_(residual_state, new / old)``."""
        handle = RemovableHandle(self._callbacks)
        self._callbacks[handle.id] = fn
        return handle

    def rescale_residuals_of(self, owner: Any) -> RemovableHandle:
        """Keep the error-feedback residuals of ``owner``'s compressed gradients in step with the scale:
        ``owner`` is a ringlet ``DistributedDataParallel`` or a comm hooks' ``HookState`` (anything with
        ``compression_states``, a property or a method, listing per-bucket compressor states). The
        gradients they compress are still scaled, so their residuals are too: on every change they are
        multiplied by ``new / old``. Returns the callback's handle."""
        from ringlet.compression.error_feedback import rescale_residuals_

        def rescale(old: float, new: float) -> None:
            states = owner.compression_states
            for state in states() if callable(states) else states:
                rescale_residuals_(state, new / old)

        return self.on_scale_change(rescale)

    # ---- state ------------------------------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def _get_growth_tracker(self) -> int:
        return self._tracker if self._enabled else 0

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """torch's keys (``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
        ``_growth_tracker``), so checkpoints move between this scaler and torch's; empty when disabled.
        Take it after :meth:`update`."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values (no scale-change callbacks: state saved beside the scaler is
        already in its units). A no-op when disabled; ``RuntimeError`` for an empty dict."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._scale = _f32(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._tracker = int(state_dict["_growth_tracker"])
        self._scale_tensors.clear()

    def __getstate__(self) -> dict[str, Any]:
        if self._per_opt:
            raise AssertionError("A GradScaler instance may only be pickled at the beginning "
                                 "of an iteration, or at the end after scaler.update().")
        state = self.__dict__.copy()
        state.update(_scale_tensors={}, _comm=None, _comm_key=None, _callbacks=OrderedDict())
        return state


def _scalar(new_scale: float | torch.Tensor) -> float:
    if isinstance(new_scale, torch.Tensor):
        if new_scale.numel() != 1 or new_scale.requires_grad:
            raise ValueError("new_scale must be a float or a one-element tensor with requires_grad=False.")
        return float(new_scale.item())
    return float(new_scale)


def _synchronize(optimizer) -> bool:
    """Wait for a Horovod-style ``DistributedOptimizer``'s reductions unless the script did; True when
    this call did (the step must then skip its own synchronize)."""
    if not (callable(getattr(optimizer, "synchronize", None)) and hasattr(optimizer, "skip_synchronize")):
        return False
    if getattr(optimizer, "_synchronized", False):
        return False
    optimizer.synchronize()
    return True


@torch.no_grad()
def _unscale_grads_(optimizer: torch.optim.Optimizer, inv_scale: float) -> bool:
    """Multiply every gradient of ``optimizer`` by ``inv_scale`` (a float32 value) in place; True when
    any held inf/NaN before (torch's ``_amp_foreach_non_finite_check_and_unscale_``, in plain ops)."""
    bad: dict[torch.device, list[torch.Tensor]] = {}
    invs: dict[torch.device, torch.Tensor] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.dtype == torch.float16:
                raise ValueError("Attempting to unscale FP16 gradients (keep float32 master weights: "
                                 "ringlet.torch.MasterWeights).")
            g = p.grad._values() if p.grad.is_sparse else p.grad
            bad.setdefault(g.device, []).append((~torch.isfinite(g)).any())
            inv = invs.get(g.device)
            if inv is None:
                inv = invs[g.device] = torch.full((), inv_scale, dtype=torch.float32, device=g.device)
            g.mul_(inv)
    # One device-to-host transfer per device, after every kernel was queued.
    return any(bool(torch.stack(flags).any()) for flags in bad.values())
