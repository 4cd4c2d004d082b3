"""``int8``: every element as a signed byte, scaled per chunk.

The input is cut into chunks of ``chunk`` elements (the last may be shorter). Each chunk ``c`` gets a
float32 scale ``s_c = max|x| / 127`` and each element the integer ``q = round(x / s_c)`` in
``[-127, 127]``; decompression returns ``q * s_c`` in float32. With round-to-nearest the error is at
most ``s_c / 2`` per element (plus float32 rounding); with ``stochastic=True`` ``q`` is ``floor(x / s_c + u)``
with ``u`` uniform in ``[0, 1)``, so that ``E[decompress(compress(x))] == x`` (unbiased; the clamp to
127 and float32 rounding aside).

Payload layout (``wire_bytes(n) = n + 4 * ceil(n / chunk)`` bytes)::

    [ scales: ceil(n / chunk) float32 | values: n int8 ]

The scales come first so that they sit 4-byte aligned whenever the payload does.

Special values: an all-zero chunk has scale 0 and decompresses to zeros. A chunk holding any Inf or NaN
gets a NaN scale and decompresses to all NaN, so a loss scaler checking the reduced gradient sees the
overflow (a compressor never turns a non-finite input into finite values).

Stochastic rounding draws from a ``torch.Generator`` kept in the caller's ``state`` (key
``"generator"``, made on first use on the input's device and seeded with ``state["seed"]`` when the
caller put one there, else with the compressor's ``seed``): the same state seed gives the same payloads.
Callers that want ranks or buckets to round independently put a distinct ``"seed"`` in each state
before first use. With ``state=None`` stochastic rounding draws from torch's default generator.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ._common import check_int, check_payload, state_generator, typed
from .base import Compressor, check_input

__all__ = ["Int8"]


def _workspace(state: dict | None, n: int, device: torch.device) -> torch.Tensor:
    """A float32 buffer of ``n`` elements for the scaled values, kept in ``state["work"]`` when there is a
    state (no new bucket-sized tensor each step)."""
    if state is None:
        return torch.empty(n, dtype=torch.float32, device=device)
    buf = state.get("work")
    if buf is None or buf.numel() != n or buf.device != device:
        buf = state["work"] = torch.empty(n, dtype=torch.float32, device=device)
    return buf

_QMAX = 127.0
_PIECE = 4096  # chunks decompressed at a time by accumulate_


class Int8(Compressor):
    """Per-chunk scaled int8 (see the module doc).

    ``chunk``: elements per scale (integer >= 1). ``stochastic``: stochastic instead of nearest rounding.
    ``seed``: the generator seed when the state carries none. ``ValueError`` for a bad parameter.
    """

    reduces_by = "scatter"

    def __init__(self, chunk: int = 256, stochastic: bool = False, seed: int = 0):
        self.chunk = check_int(chunk, "Int8 chunk", 1)
        if not isinstance(stochastic, bool):
            raise ValueError(f"Int8 stochastic must be a bool, got {stochastic!r}")
        self.stochastic = stochastic
        self.seed = check_int(seed, "Int8 seed", 0)
        self.name = "int8:stochastic" if stochastic else "int8"

    def _chunks(self, numel: int) -> int:
        return -(-numel // self.chunk)

    def wire_bytes(self, numel: int) -> int:
        return numel + 4 * self._chunks(numel)

    def compress(self, flat: torch.Tensor, state: dict | None = None) -> tuple[torch.Tensor, Any]:
        check_input(flat, self.name)
        n, c = flat.numel(), self._chunks(flat.numel())
        payload = torch.empty(n + 4 * c, dtype=torch.uint8, device=flat.device)
        if n == 0:
            return payload, 0
        x = flat if flat.dtype == torch.float32 else flat.float()
        full = n // self.chunk
        scales = payload[:4 * c].view(torch.float32)
        vals = _workspace(state, n, flat.device)
        if full:
            self._scale_rows(x[:full * self.chunk].view(full, self.chunk), scales[:full],
                             vals[:full * self.chunk].view(full, self.chunk))
        if full < c:  # the shorter last chunk
            self._scale_rows(x[full * self.chunk:].view(1, -1), scales[full:], vals[full * self.chunk:].view(1, -1))
        if self.stochastic:
            gen = None if state is None else state_generator(state, flat.device, self.seed)
            vals.add_(torch.rand(vals.shape, generator=gen, device=vals.device)).floor_()
        else:
            vals.round_()
        payload[4 * c:].view(torch.int8).copy_(vals.clamp_(-_QMAX, _QMAX))
        return payload, n

    @staticmethod
    def _scale_rows(rows: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> None:
        """``out = rows * 127 / max|row|`` (0 for all-zero and non-finite rows); ``scales = max|row| / 127``
        (NaN for a row holding Inf or NaN)."""
        lo, hi = rows.amin(dim=1), rows.amax(dim=1)  # two passes beat aminmax's one on a CPU
        amax = torch.maximum(hi, lo.neg())
        bad = ~torch.isfinite(lo) | ~torch.isfinite(hi)
        ok = (amax > 0) & ~bad
        # x * (127 / amax) stays finite even when amax / 127 would underflow to 0.
        torch.mul(rows, torch.where(ok, _QMAX / amax, 0.0).unsqueeze(1), out=out)
        if bool(bad.any()):
            out[bad] = 0.0  # Inf * 0 is NaN; the NaN scale carries the news instead
        scales.copy_(torch.where(bad, math.nan, amax / _QMAX))

    def decompress(self, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        n = int(ctx)
        return self.accumulate_(torch.zeros(n, dtype=torch.float32, device=payload.device), payload, ctx)

    def accumulate_(self, acc: torch.Tensor, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        """``acc += decompress(payload, ctx)``, a piece of :data:`_PIECE` chunks at a time, so the
        float32 copy of the values stays small."""
        n, c = int(ctx), self._chunks(int(ctx))
        check_payload(payload, n + 4 * c, self.name)
        scales = typed(payload[:4 * c], torch.float32)
        values = payload[4 * c:].view(torch.int8)
        step = _PIECE * self.chunk
        for at in range(0, n, step):
            q = values[at:at + step].to(torch.float32)
            first, m = at // self.chunk, q.numel()
            full = m // self.chunk
            if full:
                q[:full * self.chunk].view(full, self.chunk).mul_(scales[first:first + full].unsqueeze(1))
            if full * self.chunk < m:
                q[full * self.chunk:].mul_(scales[first + full])
            acc[at:at + m].add_(q)
        return acc

    def __repr__(self) -> str:
        return f"Int8(chunk={self.chunk}, stochastic={self.stochastic}, seed={self.seed})"
