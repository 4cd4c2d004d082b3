"""``none``: the buffer as it is, in float32 — the uncompressed reference every compressor is measured
against. Its payload is linear in the input, so a compressed all-reduce with it is a plain float32 SUM."""
from __future__ import annotations

from typing import Any

import torch

from ._common import typed
from .base import Compressor, check_input

__all__ = ["NoCompression"]


class NoCompression(Compressor):
    """The identity on float32 (other floating dtypes are widened to float32 on the wire)."""

    name = "none"
    reduces_by = "sum"
    lossless = True

    def compress(self, flat: torch.Tensor, state: dict | None = None) -> tuple[torch.Tensor, Any]:
        check_input(flat, self.name)
        return flat.float().contiguous().view(torch.uint8), flat.numel()

    def decompress(self, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        return typed(payload, torch.float32)

    def wire_bytes(self, numel: int) -> int:
        return 4 * numel
