"""What crosses the boundary between two neighbouring stages, over :mod:`ringlet.p2p`.

Per step, the stage before sends one small header before its first activation: the activation's shape
and dtype, whether a gradient travels back, and the first stage's batch rows (so the last stage can check
its targets). Every micro-batch's activation of that step must have that shape (the sender checks); a
later step may send another (a smaller last batch): the receiver then allocates new buffers. Receive
buffers are pooled and reused across micro-batches and steps while the shape stays.

Tags (point-to-point tags are per ordered pair of ranks): the header ``HEADER_TAG``; micro-batch ``i``'s
activation ``act_tag(i)`` (forward direction) and its gradient ``grad_tag(i)`` (backward direction).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ringlet.types import DTYPE_CODE, SUPPORTED_DTYPES

__all__ = ["Header", "HEADER_TAG", "act_tag", "grad_tag", "Pool", "MAX_MICROBATCHES"]

_BASE = 1 << 23  # the upper half of the point-to-point tags; user code is free below it
HEADER_TAG = _BASE
MAX_MICROBATCHES = ((1 << 24) - _BASE - 1) // 2
_WORDS = 16
_MAGIC = 0x51DE


def act_tag(i: int) -> int:
    return _BASE + 1 + 2 * i


def grad_tag(i: int) -> int:
    return _BASE + 2 + 2 * i


@dataclass(frozen=True, slots=True)
class Header:
    """One step's boundary tensor: ``shape``, ``dtype``, ``needs_grad`` (a gradient travels back), and
    ``rows``: the first stage's batch rows (the whole batch of this replica)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    needs_grad: bool
    rows: int

    @staticmethod
    def of(t: torch.Tensor, rows: int) -> "Header":
        """The header of boundary tensor ``t``; ``ValueError`` for what cannot cross a boundary."""
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"a pipeline stage must return one tensor to the next stage, got {type(t).__name__}.")
        if t.dtype not in DTYPE_CODE:
            raise ValueError(f"a stage's output of dtype {t.dtype} cannot travel to the next stage.")
        if t.dim() > _WORDS - 5:
            raise ValueError(f"a stage's output has {t.dim()} dimensions; at most {_WORDS - 5} can travel.")
        return Header(tuple(t.shape), t.dtype, bool(t.requires_grad and t.is_floating_point()), int(rows))

    def encode(self) -> torch.Tensor:
        words = [_MAGIC, DTYPE_CODE[self.dtype], int(self.needs_grad), self.rows, len(self.shape), *self.shape]
        return torch.tensor(words + [0] * (_WORDS - len(words)), dtype=torch.int64)

    @staticmethod
    def empty() -> torch.Tensor:
        return torch.zeros(_WORDS, dtype=torch.int64)

    @staticmethod
    def decode(t: torch.Tensor) -> "Header":
        w = t.tolist()
        if w[0] != _MAGIC:
            raise ValueError("the previous stage sent something that is not a pipeline header (another "
                             "pipeline or point-to-point traffic on its tags?).")
        return Header(tuple(w[5:5 + w[4]]), SUPPORTED_DTYPES[w[1]], bool(w[2]), w[3])

    def check(self, t: torch.Tensor, stage: int, i: int) -> None:
        """``t`` (micro-batch ``i``'s output on ``stage``) matches this step's header."""
        if tuple(t.shape) != self.shape or t.dtype != self.dtype:
            raise ValueError(f"stage {stage}: micro-batch {i}'s output has shape {tuple(t.shape)} {t.dtype}, "
                             f"but this step's first had {self.shape} {self.dtype}; every micro-batch of a "
                             "step must send the same shape.")


class Pool:
    """Reusable tensors of one shape and dtype (receive buffers); :meth:`reset` for another shape."""

    def __init__(self) -> None:
        self.shape: tuple[int, ...] | None = None
        self.dtype: torch.dtype | None = None
        self._free: list[torch.Tensor] = []

    def reset(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        if (shape, dtype) != (self.shape, self.dtype):
            self.shape, self.dtype, self._free = shape, dtype, []

    def take(self) -> torch.Tensor:
        return self._free.pop() if self._free else torch.empty(self.shape, dtype=self.dtype)

    def give(self, t: torch.Tensor) -> None:
        if tuple(t.shape) == self.shape and t.dtype == self.dtype:
            self._free.append(t)
