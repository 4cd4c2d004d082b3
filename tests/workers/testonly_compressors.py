"""Small compressors for tests only, one per strategy the built-in ones do not exercise: a top-k-like
sparse one (``reduces_by="gather"``), a custom one with its own schedule of all-reduces
(``reduces_by="custom"``), and an error-feedback wrapper that checks its per-input state lines up.
Also imported by the multi-process workers (they sit beside it in tests/workers)."""
from __future__ import annotations

import math
from typing import Any

import torch

from ringlet.compression import FP16, Compressor, check_input


class FakeTopK(Compressor):
    """The ``ceil(fraction * n)`` largest magnitudes as ``[int32 indices | float32 values]``; accumulated
    with ``index_add_`` (never densified)."""

    reduces_by = "gather"

    def __init__(self, fraction: float = 0.25):
        self.fraction = fraction
        self.name = f"fake-topk:{fraction:g}"

    def k(self, n: int) -> int:
        return 0 if n == 0 else max(1, math.ceil(self.fraction * n))

    def wire_bytes(self, numel: int) -> int:
        return 8 * self.k(numel)

    def compress(self, flat: torch.Tensor, state: dict | None = None) -> tuple[torch.Tensor, Any]:
        check_input(flat, self.name)
        k = self.k(flat.numel())
        idx = torch.topk(flat.float().abs(), k, sorted=True).indices
        payload = torch.empty(8 * k, dtype=torch.uint8)
        payload[:4 * k].view(torch.int32).copy_(idx)
        payload[4 * k:].view(torch.float32).copy_(flat.float()[idx])
        return payload, flat.numel()

    def _split(self, payload: torch.Tensor, n: int):
        k = self.k(n)
        raw = payload.clone()  # a slice of a gathered buffer may sit at any offset
        return raw[:4 * k].view(torch.int32).long(), raw[4 * k:].view(torch.float32)

    def decompress(self, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        idx, vals = self._split(payload, ctx)
        return torch.zeros(ctx, dtype=torch.float32).index_put_((idx,), vals)

    def accumulate_(self, acc: torch.Tensor, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        idx, vals = self._split(payload, ctx)
        return acc.index_add_(0, idx, vals)


class FakeCustom(Compressor):
    """Runs its own schedule: rounds the buffer to float16 precision and sums it with one all-reduce,
    then all-reduces one more small tensor (the count of tensors in ``shapes``), recording in ``state``
    how often it ran and what it saw."""

    name = "fake-custom"
    reduces_by = "custom"

    def wire_bytes(self, numel: int) -> int:
        return 2 * numel

    def allreduce_(self, flat, state, allreduce, shapes=None):
        flat.copy_(flat.half().float())
        allreduce(flat)
        count = torch.tensor([float(len(shapes) if shapes is not None else 1)])
        allreduce(count)
        state["calls"] = state.get("calls", 0) + 1
        state["shapes"] = shapes
        state["count_sum"] = float(count)
        return flat


class FakeEF(Compressor):
    """float16 with error feedback in ``state["residual"]``; raises if a state meets another size (the
    per-block states of a compressed all-reduce must line up step after step)."""

    name = "fake-fp16+ef"
    reduces_by = "scatter"

    def wire_bytes(self, numel: int) -> int:
        return 2 * numel

    def compress(self, flat, state=None):
        res = state.get("residual")
        if res is None:
            res = state["residual"] = torch.zeros(flat.numel())
        if res.numel() != flat.numel():
            raise ValueError(f"state of {res.numel()} elements given an input of {flat.numel()}")
        corrected = flat.float() + res
        payload, ctx = FP16.compress(corrected)
        state["residual"] = corrected - FP16.decompress(payload, ctx)
        return payload, ctx

    def decompress(self, payload, ctx):
        return FP16.decompress(payload, ctx)
