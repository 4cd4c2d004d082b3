"""``ringlet.torch.MasterWeights``: float32 master copies for a model held in float16 or bfloat16.

``MasterWeights(optimizer)`` takes an optimizer built over a low-precision model's parameters and
replaces, in its parameter groups, every float16/bfloat16 parameter by a float32 **master** copy
(float32 parameters stay, as their own masters). Then, per step:

1. :meth:`MasterWeights.sync_master_grads` copies the model's gradients into float32 ``.grad`` of the
   masters (``GradScaler.unscale_`` calls it, so unscaling and the inf check run in float32; otherwise
   :meth:`MasterWeights.step` does);
2. the wrapped optimizer steps on the masters, with float32 arithmetic and float32 state;
3. the masters are copied back into the model's parameters (rounded to their dtype).

So the model computes in low precision while the weights accumulate small updates in float32 (a
bfloat16 weight loses any update below about 2^-8 of its size). Contracts:

* wrap after the model's parameters agree across ranks (after ``DistributedDataParallel``'s
  construction or ``broadcast_parameters``) and before the optimizer's first step (its state must be
  empty); add parameter groups before wrapping;
* ``param_groups`` and ``state`` are the wrapped optimizer's (an LR scheduler on the wrapper drives it);
  the groups hold the masters: clip those, e.g. ``clip_grad_norm_(opt.master_params(), 1.0)``, after
  ``scaler.unscale_(opt)``;
* :meth:`MasterWeights.state_dict` holds the wrapped optimizer's state dict and the masters' values, so a
  checkpoint restores the float32 weights, not their rounded copies in the model;
* with float16 gradients use ringlet's :class:`~ringlet.torch.training.amp.GradScaler` (torch's does not
  know to call :meth:`~MasterWeights.sync_master_grads`, and refuses to unscale float16 gradients).
"""
from __future__ import annotations

from typing import Any, Iterator

import torch

__all__ = ["MasterWeights"]

_LOW = (torch.float16, torch.bfloat16)


class MasterWeights(torch.optim.Optimizer):
    """Step ``optimizer`` on float32 masters of its low-precision parameters (see the module doc).
    ``ValueError`` when ``optimizer`` has state already (wrap it before its first step)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        if any(optimizer.state.values()):
            raise ValueError("MasterWeights: wrap the optimizer before its first step (its state is not empty).")
        self.optimizer = optimizer
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (model parameter, float32 master)
        for group in optimizer.param_groups:
            group["params"] = [self._master_of(p) for p in group["params"]]
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.param_groups = optimizer.param_groups  # shared: schedulers and the wrapped optimizer see one
        self.state = optimizer.state
        self._grads_ready = False

    def _master_of(self, p: torch.Tensor) -> torch.Tensor:
        if p.dtype not in _LOW:
            return p
        master = p.detach().to(torch.float32).requires_grad_(p.requires_grad)
        self._pairs.append((p, master))
        return master

    def master_params(self) -> Iterator[torch.Tensor]:
        """The parameters the wrapped optimizer steps: float32 masters and the model's float32 parameters."""
        for group in self.param_groups:
            yield from group["params"]

    @property
    def pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(model parameter, float32 master)`` for every low-precision parameter."""
        return list(self._pairs)

    @torch.no_grad()
    def sync_master_grads(self) -> None:
        """Copy the model's gradients into the masters' float32 ``.grad`` (None stays None). Until the next
        :meth:`step` or :meth:`zero_grad`, :meth:`step` uses these (possibly unscaled, clipped) gradients
        instead of copying again."""
        for p, m in self._pairs:
            if p.grad is None:
                m.grad = None
            elif m.grad is None or m.grad.shape != p.grad.shape:
                m.grad = p.grad.detach().to(torch.float32)
            else:
                m.grad.copy_(p.grad)
        self._grads_ready = True

    def step(self, closure=None):
        """``closure`` (with grad) if given, then the wrapped optimizer's step on the masters with the
        model's gradients (see :meth:`sync_master_grads`), then the masters copied into the model."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            self._grads_ready = False
        if not self._grads_ready:
            self.sync_master_grads()
        self._grads_ready = False
        self.optimizer.step()
        self._copy_to_model()
        return loss

    @torch.no_grad()
    def _copy_to_model(self) -> None:
        for p, m in self._pairs:
            p.copy_(m)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero (or drop) the gradients of the model's low-precision parameters and of the masters."""
        self._grads_ready = False
        for p, _ in self._pairs:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """``{"optimizer": the wrapped optimizer's state dict, "master": [float32 masters, in order]}``."""
        return {"optimizer": self.optimizer.state_dict(),
                "master": [m.detach().clone() for _, m in self._pairs]}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the wrapped optimizer's state, the masters, and the model's
        parameters from them. ``ValueError`` when the number of masters differs."""
        masters = state_dict["master"]
        if len(masters) != len(self._pairs):
            raise ValueError(f"MasterWeights: the state dict has {len(masters)} masters, this wrapper "
                             f"{len(self._pairs)}")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state
        for (_, m), saved in zip(self._pairs, masters):
            m.copy_(saved)
        self._copy_to_model()

    def __repr__(self) -> str:
        return f"MasterWeights({self.optimizer!r})"
