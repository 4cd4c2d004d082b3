"""Helpers shared by the compressors: typed views of payload bytes, checks, per-state generators."""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["typed", "check_payload", "check_int", "state_generator"]


def typed(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``raw`` (1-D uint8) read as ``dtype``: a view when its offset is aligned, else a view of a copy
    (a payload may be a slice of a larger receive buffer at any byte offset)."""
    if raw.storage_offset() % dtype.itemsize or not raw.is_contiguous():
        raw = raw.clone()
    return raw.view(dtype)


def check_payload(payload: torch.Tensor, expected: int, who: str) -> None:
    """``TypeError`` unless ``payload`` is a 1-D uint8 tensor; ``ValueError`` unless it holds
    ``expected`` bytes."""
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8 or payload.dim() != 1:
        raise TypeError(f"{who}: a payload is a 1-D torch.uint8 tensor, got "
                        f"{getattr(payload, 'dtype', type(payload).__name__)} {tuple(getattr(payload, 'shape', ()))}")
    if payload.numel() != expected:
        raise ValueError(f"{who}: payload holds {payload.numel()} bytes, expected {expected}")


def check_int(value: Any, what: str, low: int) -> int:
    """``value`` if it is an integer >= ``low``, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what} must be an integer >= {low}, got {value!r}")
    return value


def state_generator(state: dict, device: torch.device, default_seed: int) -> torch.Generator:
    """The generator kept under ``state["generator"]``, made on ``device`` and seeded with
    ``state.get("seed", default_seed)`` on first use."""
    gen = state.get("generator")
    if gen is None:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(state.get("seed", default_seed)))
        state["generator"] = gen
    return gen
