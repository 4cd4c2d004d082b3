"""Error feedback: what a lossy compressor dropped this step is added to the next step's input.

:class:`ErrorFeedback` wraps any compressor whose ``reduces_by`` is not ``"custom"``::

    corrected = flat + state["residual"]                 # zeros on first use
    payload, ctx = inner.compress(corrected, state["inner"])
    state["residual"] = corrected - inner.decompress(payload, ctx)

so over ``T`` steps the values sent add up to the inputs' sum minus the last residual (they telescope):
nothing is lost, only delayed. The residual is float32 (float64 for a float64 input, so that the sum
telescopes to float64 precision). Residual entries that come out non-finite (an input holding Inf or
NaN, which the payload still carries so that a loss scaler sees the overflow) are reset to zero: the
step that produced them is one a loss scaler skips, and a NaN kept would poison every later step.

The residual is a multiple of the input's scale: when a loss scaler changes the loss scale from ``old`` to
``new`` it calls :func:`rescale_residuals_` with ``new / old`` on the bucket states (it finds every
residual in nested state dicts, PowerSGD's included); :func:`reset_residuals_` drops them all.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import Compressor, check_input

__all__ = ["ErrorFeedback", "rescale_residuals_", "reset_residuals_"]

RESIDUAL = "residual"


def _residual_dicts(state: dict):
    """``state`` and every dict nested in it (through dicts, lists and tuples) that holds a residual."""
    stack, seen = [state], set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            if isinstance(item.get(RESIDUAL), torch.Tensor):
                yield item
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def rescale_residuals_(state: dict, factor: float) -> int:
    """Multiply in place every residual found in ``state`` (nested dicts included) by ``factor``;
    returns how many were scaled. ``ValueError`` for a non-finite or non-positive ``factor``."""
    factor = float(factor)
    if not (factor > 0 and factor != float("inf")):
        raise ValueError(f"rescale_residuals_: factor must be finite and > 0, got {factor!r}")
    dicts = list(_residual_dicts(state))
    for d in dicts:
        d[RESIDUAL].mul_(factor)
    return len(dicts)


def reset_residuals_(state: dict) -> int:
    """Drop every residual found in ``state`` (nested dicts included); the next step starts from zeros.
    Returns how many were dropped."""
    dicts = list(_residual_dicts(state))
    for d in dicts:
        del d[RESIDUAL]
    return len(dicts)


class ErrorFeedback(Compressor):
    """``inner`` with error feedback (see the module doc). The wrapper's ``state`` holds ``"residual"``
    and ``"inner"`` (the inner compressor's own state dict; a ``"seed"`` in the wrapper's state is copied
    into it when it is made). ``reduces_by``, ``wire_bytes``, ``decompress`` and ``accumulate_`` are the
    inner compressor's.

    Errors: ``TypeError`` if ``inner`` is not a :class:`Compressor`, ``ValueError`` if it runs its own
    schedule (``reduces_by == "custom"``: PowerSGD keeps its error feedback itself), ``ValueError`` from
    :meth:`compress` when the input's size differs from the residual's, and :meth:`compress` needs a
    state (``TypeError`` for ``None``).
    """

    def __init__(self, inner: Compressor):
        if not isinstance(inner, Compressor):
            raise TypeError(f"ErrorFeedback wraps a ringlet.compression.Compressor, got {type(inner).__name__}")
        if inner.reduces_by == "custom":
            raise ValueError(f"ErrorFeedback cannot wrap {inner.name!r}: it runs its own schedule "
                             "(and keeps its own error feedback)")
        self.inner = inner
        self.name = f"{inner.name}+ef"
        self.reduces_by = inner.reduces_by
        self.lossless = inner.lossless

    def compress(self, flat: torch.Tensor, state: dict | None = None) -> tuple[torch.Tensor, Any]:
        check_input(flat, self.name)
        if state is None:
            raise TypeError(f"{self.name}: error feedback keeps its residual in the caller's state; pass a dict")
        dtype = torch.promote_types(flat.dtype, torch.float32)
        residual = state.get(RESIDUAL)
        if residual is not None and residual.shape != flat.shape:
            raise ValueError(f"{self.name}: input has {flat.numel()} elements but the residual kept in this "
                             f"state has {residual.numel()}; use one state per input position")
        if residual is None or residual.dtype != dtype:
            corrected = flat.to(dtype, copy=True) if residual is None else residual.to(dtype) + flat
        else:
            corrected = residual.add_(flat)  # the residual's memory becomes this step's corrected input
        inner_state = state.get("inner")
        if inner_state is None:
            inner_state = state["inner"] = {"seed": state["seed"]} if "seed" in state else {}
        payload, ctx = self.inner.compress(corrected, inner_state)
        if corrected.dtype != torch.float32 or \
                payload.untyped_storage().data_ptr() == corrected.untyped_storage().data_ptr():
            # accumulate_ adds into float32 only; and a payload that is ``corrected`` itself (``none``)
            # must stay intact.
            state[RESIDUAL] = corrected - self.inner.decompress(payload, ctx)
        else:  # corrected - decompressed, in place (a sparse payload adds only its k values)
            state[RESIDUAL] = self.inner.accumulate_(corrected.neg_(), payload, ctx).neg_()
        state[RESIDUAL].nan_to_num_(0.0, 0.0, 0.0)
        return payload, ctx

    def decompress(self, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        return self.inner.decompress(payload, ctx)

    def wire_bytes(self, numel: int) -> int:
        return self.inner.wire_bytes(numel)

    def accumulate_(self, acc: torch.Tensor, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        return self.inner.accumulate_(acc, payload, ctx)

    @staticmethod
    def rescale_(state: dict, factor: float) -> int:
        """:func:`rescale_residuals_`."""
        return rescale_residuals_(state, factor)

    @staticmethod
    def reset_(state: dict) -> int:
        """:func:`reset_residuals_`."""
        return reset_residuals_(state)

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.inner!r})"
