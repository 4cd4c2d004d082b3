"""The model state one rank holds under ZeRO, described by parameter name and element range, so that it
can be saved by every rank, stitched into an ordinary ``state_dict``, and loaded by any world size.

:class:`ShardState` is what :meth:`ZeroOptimizer.shard_state` returns and what checkpoints store: for
every :class:`PieceState` (elements ``[start, end)`` of the flattened parameter ``name``) the float32
master values and the optimizer's per-element state for those elements (1-D, ``end - start`` long),
plus the optimizer's per-parameter scalars (``step``) and the param groups' hyperparameters.
:meth:`ZeroOptimizer.load_shard_state` takes a :data:`Fetch` — ``fetch(name, start, end)`` returns the
values and state for any element range of any parameter, whoever saved them — so loading into another
world size is the same call as loading into the same one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["PieceState", "ShardState", "Fetch", "CheckpointMismatch"]


@dataclass
class PieceState:
    """Elements ``[start, end)`` of parameter ``name`` (full ``shape``, model ``dtype``) in optimizer param
    group ``group``: ``master`` float32 values (1-D), ``state`` the optimizer's state for them — tensors
    with one value per element are 1-D slices (``exp_avg``, ``momentum_buffer``), anything else (``step``,
    a scalar tensor or number) is the parameter's and repeated in every piece of it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    group: int
    start: int
    end: int
    master: torch.Tensor
    state: dict = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return self.end - self.start


@dataclass
class ShardState:
    """One rank's ZeRO state: ``pieces`` (see :class:`PieceState`), ``groups`` the param groups'
    hyperparameters (``params`` left out) in order, ``stage``, ``world`` and ``rank`` it was taken at, and
    ``extra``: anything else the optimizer keeps (its step count, a loss scaler's state), plain values."""

    stage: int
    world: int
    rank: int
    pieces: list[PieceState]
    groups: list[dict]
    extra: dict = field(default_factory=dict)


# fetch(name, start, end) -> (float32 master values, per-element state slices and scalars) for those elements
Fetch = Callable[[str, int, int], "tuple[torch.Tensor, dict]"]


class CheckpointMismatch(ValueError):
    """A checkpoint that does not fit the model it is loaded into; the message names the parameter (a
    missing or unexpected name, another shape) and what differs."""
