"""DiLoCo: local inner steps, and every ``period`` of them an outer step on the averaged parameter deltas.

Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models" (2023). Every rank
keeps the parameters of the last outer step, ``θ_start`` (float32, identical on every rank). Every
``period`` = H inner steps::

    Δ = mean over ranks of (θ_start - θ_now)       one flat float32 all-reduce (op AVG) through Comm
    θ_start ← OuterSGD(θ_start, grad=Δ)            Nesterov momentum: lr 0.7, momentum 0.9 by default
    θ_now ← θ_start                                 on every rank: the parameters agree bitwise

Usage (``opt`` steps locally; ``DiLoCo.step`` replaces ``opt.step()``)::

    diloco = ringlet.torch.training.DiLoCo(net, torch.optim.AdamW(net.parameters()), period=500)
    for x, y in data:
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        diloco.step()

Contracts:

* ``model``: a plain module (its inner steps are local; its state is broadcast from the first rank of
  ``group`` at construction), or a ringlet ``DistributedDataParallel`` whose inner steps average gradients
  over its own group (DiLoCo then averages across ``group``, e.g. the world while the DDP covers one host);
* floating-point buffers (BatchNorm's running statistics) travel in the same flat all-reduce and are
  replaced by their mean; other buffers are taken from the group's first rank;
* with a ``MasterWeights`` inner optimizer, ``θ`` is its float32 masters (copied into the model after
  every outer step);
* the inner optimizer's state stays local, as in the paper; the outer state (``θ_start``, momentum) is
  in :meth:`DiLoCo.state_dict`;
* with ``outer_lr=1, outer_momentum=0`` the outer step is plain parameter averaging;
* ``compression``: None (float32 deltas) or a name or object for :func:`ringlet.compression.get`
  (``"fp16"``, ``"bf16"``, ``"int8+ef"``, ...): the deltas (and floating buffers) then travel compressed
  through ``Comm.allreduce_compressed_``, with the compressor's state (residuals) kept by this object.
"""
from __future__ import annotations

from typing import Any

import torch

from ringlet import compression as _compression
from ringlet.types import ReduceOp

from .averaging import check_count, copy_to_model_, group_comm, next_name, split_buffers, stepped, unwrap
from .broadcast import broadcast_coalesced

__all__ = ["DiLoCo"]


class DiLoCo:
    """The DiLoCo outer loop around an inner optimizer (see the module doc).

    ``period``: inner steps per outer step (an int >= 1); ``outer_lr`` > 0; ``0 <= outer_momentum < 1``;
    ``nesterov``: Nesterov momentum (when ``outer_momentum > 0``); ``group``: the ranks that average (a
    :class:`ringlet.Group` or ProcessSet; default the world). ``ValueError`` for bad values or an unknown
    compressor. Every rank must call :meth:`step` or :meth:`after_step` once per inner step.
    """

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer, period: int,
                 outer_lr: float = 0.7, outer_momentum: float = 0.9, nesterov: bool = True,
                 compression=None, *, group=None):
        self.period = check_count("period", period, 1)
        if not outer_lr > 0:
            raise ValueError(f"outer_lr must be > 0, got {outer_lr!r}")
        if not 0 <= outer_momentum < 1:
            raise ValueError(f"outer_momentum must be in [0, 1), got {outer_momentum!r}")
        self.module, self._ddp = unwrap(model)
        self.optimizer = inner_optimizer
        self._name = next_name("diloco")
        self._comm = group_comm(self.module, group, self._name, inner_optimizer)
        self._compressor = _lossy(compression)
        self._compression_state: dict = {}
        self._pairs = stepped(self.module, inner_optimizer)  # (parameter, its float32 master or itself)
        self._floats, self._others = split_buffers(self.module)
        self.anchor = [t.detach().to(torch.float32, copy=True).requires_grad_() for _, t in self._pairs]
        self.outer = torch.optim.SGD(self.anchor, lr=outer_lr, momentum=outer_momentum,
                                     nesterov=bool(nesterov and outer_momentum > 0))
        self.steps = 0
        self.outer_steps = 0

    def step(self, closure=None):
        """The inner optimizer's ``step(closure)``, then :meth:`after_step`; returns its return value."""
        out = self.optimizer.step() if closure is None else self.optimizer.step(closure)
        self.after_step()
        return out

    def after_step(self) -> bool:
        """Count one inner step; run the outer step when ``period`` inner steps are done. True when it did."""
        self.steps += 1
        if self.steps % self.period:
            return False
        self.outer_step()
        return True

    @torch.no_grad()
    def outer_step(self) -> None:
        """Average the deltas over the group, step ``θ_start`` and reset the model to it (every rank
        together)."""
        flat = torch.cat([(a - t.detach().to(torch.float32)).reshape(-1) for a, (_, t) in zip(self.anchor, self._pairs)]
                         + [b.detach().to(torch.float32).reshape(-1) for b in self._floats])
        if self._comm.size > 1:
            self._reduce(flat)
        off = 0
        for a in self.anchor:
            a.grad = flat[off:off + a.numel()].view_as(a)
            off += a.numel()
        self.outer.step()
        for a, (_, t) in zip(self.anchor, self._pairs):
            t.copy_(a)
            a.grad = None
        copy_to_model_(self._pairs)
        for b in self._floats:
            b.copy_(flat[off:off + b.numel()].view_as(b))
            off += b.numel()
        if self._others and self._comm.size > 1:
            broadcast_coalesced(self._comm, self._others, f"{self._name}.int")
        self.outer_steps += 1

    def _reduce(self, flat: torch.Tensor) -> None:
        name = f"{self._name}.delta"
        if self._compressor is None:
            self._comm.allreduce_(flat, ReduceOp.AVG, name).wait()
        else:
            self._comm.allreduce_compressed_(flat, self._compressor, self._compression_state, name,
                                             average=True).wait()

    def state_dict(self) -> dict[str, Any]:
        """The step count, ``θ_start`` (float32) and the outer optimizer's state."""
        return {"steps": self.steps, "outer_steps": self.outer_steps,
                "anchor": [a.detach().clone() for a in self.anchor], "outer": self.outer.state_dict()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the model's own parameters are restored by its own state dict)."""
        if len(state["anchor"]) != len(self.anchor):
            raise ValueError(f"DiLoCo: the state dict has {len(state['anchor'])} tensors, this model "
                             f"{len(self.anchor)}")
        for a, saved in zip(self.anchor, state["anchor"]):
            a.copy_(saved)
        self.outer.load_state_dict(state["outer"])
        self.steps, self.outer_steps = int(state["steps"]), int(state["outer_steps"])


def _lossy(spec):
    """The compressor for ``spec``, or None when the deltas travel as float32 (None or a lossless one)."""
    if spec is None:
        return None
    comp = _compression.get(spec)
    return None if comp.lossless else comp
