"""``fp16`` and ``bf16``: every element as a 16-bit float, half the bytes of float32.

float16 keeps 10 bits of mantissa but saturates at 65504 (larger magnitudes become ±inf, as a cast
does); bfloat16 keeps float32's range with 7 bits of mantissa. Summing happens after decompression, in
float32 (see :mod:`ringlet.compression.base`), so a sum of many float16 payloads cannot overflow.
"""
from __future__ import annotations

from typing import Any

import torch

from ._common import typed
from .base import Compressor, check_input

__all__ = ["HalfCompressor", "FP16", "BF16"]

_PIECE = 1 << 20


class HalfCompressor(Compressor):
    """Cast to a 16-bit floating ``dtype`` on the wire, back to float32 after."""

    reduces_by = "scatter"

    def __init__(self, dtype: torch.dtype):
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"HalfCompressor takes torch.float16 or torch.bfloat16, got {dtype}")
        self.dtype = dtype
        self.name = "fp16" if dtype == torch.float16 else "bf16"

    def compress(self, flat: torch.Tensor, state: dict | None = None) -> tuple[torch.Tensor, Any]:
        check_input(flat, self.name)
        n = flat.numel()
        payload = state.get("payload") if state is not None else None
        if payload is None or payload.numel() != 2 * n or payload.device != flat.device:
            payload = torch.empty(2 * n, dtype=torch.uint8, device=flat.device)
            if state is not None:
                state["payload"] = payload  # reused by the next call with this state
        payload.view(self.dtype).copy_(flat)
        return payload, n

    def decompress(self, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        return typed(payload, self.dtype).float()

    def accumulate_(self, acc: torch.Tensor, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        """``acc += decompress(payload, ctx)``, :data:`_PIECE` elements at a time (no bucket-sized
        float32 copy)."""
        values = typed(payload, self.dtype)
        for at in range(0, values.numel(), _PIECE):
            acc[at:at + _PIECE].add_(values[at:at + _PIECE])
        return acc

    def wire_bytes(self, numel: int) -> int:
        return 2 * numel

    def __repr__(self) -> str:
        return f"HalfCompressor({self.dtype})"


FP16 = HalfCompressor(torch.float16)
BF16 = HalfCompressor(torch.bfloat16)
