"""Post-local SGD: synchronous steps first, then local steps with the model averaged every ``period`` steps.

Lin et al., "Don't use large mini-batches, use local SGD" (2020); torch's ``PeriodicModelAverager``.
``LocalSGD(model, optimizer, period=k, warmup_steps=w)`` replaces ``optimizer.step()`` in the loop::

    ddp = ringlet.torch.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    local = ringlet.torch.training.LocalSGD(ddp, opt, period=4, warmup_steps=100)
    for x, y in data:
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        local.step()          # opt.step(), then the schedule below

Step ``t`` (counted from 1 by :meth:`LocalSGD.after_step`):

* ``t <= w``: **synchronous**; DDP averages the gradients in backward as usual;
* ``t > w``: **local**; the backward reduces nothing (this object sets DDP's
  ``require_backward_grad_sync``, which ``no_sync()`` toggles, before each forward), each rank steps on its
  own gradients, and after the optimizer step of every ``t`` with ``(t - w) % k == 0`` the model is
  averaged over the DDP's group: trainable parameters and floating-point buffers (BatchNorm's running
  statistics) by one flat all-reduce per dtype, other buffers taken from the first rank
  (:mod:`.averaging`). Right after an averaging, every rank's state is bitwise identical.

So ``k`` local steps separate two averagings (the first comes ``k`` steps after the warm-up); ``k = 1``
averages the parameters after every step. Optimizer state (momentum) stays local, as in torch. A DDP
with ``broadcast_buffers=True`` (the default) still broadcasts buffers from the first rank before every
forward, local ones too: pass ``broadcast_buffers=False`` to let them run locally until the next
averaging. With a :class:`~ringlet.torch.training.master_weights.MasterWeights` optimizer the float32
masters are averaged (and copied into the model). A plain module (not DDP) is allowed with
``warmup_steps=0``: its state is broadcast from the first rank of ``group`` at construction, then it
trains locally with periodic averaging over ``group``.

With a skipping :class:`~ringlet.torch.training.amp.GradScaler`, step through the scaler and call
:meth:`LocalSGD.after_step` yourself: ``scaler.step(opt); scaler.update(); local.after_step()`` (skipped
steps count; every rank skips the same ones).
"""
from __future__ import annotations

from typing import Any

import torch

from .averaging import average_module_, check_count, group_comm, next_name, unwrap

__all__ = ["LocalSGD"]


class LocalSGD:
    """Post-local SGD over a ringlet ``DistributedDataParallel`` (or a plain module, see the module doc).

    ``period``: steps between two averagings after the warm-up (an int >= 1); ``warmup_steps``: the
    synchronous steps first (an int >= 0). ``ValueError`` for other values, for a warm-up with a plain
    module, or for ``group=`` with a DDP (the DDP's group is used). Every rank must call :meth:`step` or
    :meth:`after_step` once per optimizer step.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, period: int,
                 warmup_steps: int = 0, *, group=None):
        check_count("period", period, 1)
        check_count("warmup_steps", warmup_steps, 0)
        self.module, self._ddp = unwrap(model)
        self.optimizer = optimizer
        self.period, self.warmup_steps = int(period), int(warmup_steps)
        self._name = next_name("localsgd")
        if self._ddp is not None:
            if group is not None:
                raise ValueError("LocalSGD: group= is the DistributedDataParallel's own group; leave it out")
            self._comm = self._ddp._comm
        elif self.warmup_steps:
            raise ValueError("LocalSGD: warmup_steps > 0 needs a ringlet DistributedDataParallel to average "
                             "the gradients of the warm-up steps")
        else:
            self._comm = group_comm(self.module, group, self._name, optimizer)
        self.steps = 0
        self.averagings = 0
        self._apply_phase()

    @property
    def synchronous(self) -> bool:
        """Whether the coming step averages gradients (the warm-up) rather than stepping locally."""
        return self.steps < self.warmup_steps

    def step(self, closure=None):
        """``optimizer.step(closure)``, then :meth:`after_step`; returns the optimizer's return value."""
        out = self.optimizer.step() if closure is None else self.optimizer.step(closure)
        self.after_step()
        return out

    def after_step(self) -> bool:
        """Count one optimizer step; average the model when this step ends a period after the warm-up.
        Returns True when it averaged."""
        self.steps += 1
        local = self.steps - self.warmup_steps
        averaged = local > 0 and local % self.period == 0
        if averaged:
            self.average()
        self._apply_phase()
        return averaged

    def average(self) -> None:
        """Average the model over the group now (see the module doc); every rank must call it together."""
        average_module_(self._comm, self.module, f"{self._name}.avg", self.optimizer)
        self.averagings += 1

    def _apply_phase(self) -> None:
        if self._ddp is not None:
            self._ddp.require_backward_grad_sync = self.synchronous

    def state_dict(self) -> dict[str, Any]:
        """The step count (the schedule's position); save it beside the model and optimizer."""
        return {"steps": self.steps, "averagings": self.averagings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps, self.averagings = int(state["steps"]), int(state["averagings"])
        self._apply_phase()

