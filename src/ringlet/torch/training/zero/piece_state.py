"""This rank's shards as :class:`~.state.ShardState` (by parameter name and element range) and back, and
as the rank's own ``state_dict``.

Per piece view of the inner optimizer, a state tensor of the view's shape (``exp_avg``,
``momentum_buffer``, ...) is per-element: it is saved flattened to 1-D and restored into the view's
shape; anything else (``step``, numbers, a per-parameter tensor of another shape) is the parameter's and
saved as it is. On load, a 1-D tensor with exactly the piece's element count is taken for per-element
state.
"""
from __future__ import annotations

from typing import Any

import torch

from .shards import Shards
from .state import CheckpointMismatch, Fetch, PieceState, ShardState

__all__ = ["shard_state", "load_pieces", "own_state_dict", "check_own_state_dict"]


def _plain(v: Any) -> Any:
    return v.detach().clone() if isinstance(v, torch.Tensor) else v


def _out(v: Any, view: torch.Tensor) -> Any:
    if isinstance(v, torch.Tensor) and view.dim() >= 1 and v.shape == view.shape:
        return v.detach().reshape(-1).clone()
    return _plain(v)


def _in(v: Any, view: torch.Tensor) -> Any:
    if isinstance(v, torch.Tensor):
        if v.dim() == 1 and v.numel() == view.numel() and view.dim() >= 1:
            return v.detach().to(view.device).reshape(view.shape).clone()
        return v.detach().clone()
    return v


def groups_of(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The param groups' hyperparameters (copies, without ``params``)."""
    return [{k: _plain(v) for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def shard_state(shards: Shards, stage: int, world: int, rank: int, extra: dict | None = None) -> ShardState:
    """Copies of this rank's masters and optimizer state, piece by piece (see the module doc)."""
    layout, opt = shards.layout, shards.optimizer
    pieces = []
    for piece, view in zip(shards.pieces, shards.views):
        bucket = layout.buckets[piece.bucket]
        st = opt.state.get(view, {})
        pieces.append(PieceState(piece.slot.name, piece.slot.shape, bucket.dtype, bucket.group, piece.start, piece.end,
                                 view.detach().reshape(-1).clone(), {k: _out(v, view) for k, v in st.items()}))
    return ShardState(stage, world, rank, pieces, groups_of(opt), dict(extra or {}))


@torch.no_grad()
def load_pieces(shards: Shards, fetch: Fetch, groups: list[dict] | None = None) -> None:
    """Fill every piece's master and optimizer state from ``fetch(name, start, end)`` (the optimizer's state
    is created where it does not exist yet, replaced where it does); with ``groups``, the param groups'
    hyperparameters too. :class:`CheckpointMismatch` when the values do not fit a piece or the groups do
    not match. The parameters are not refreshed here."""
    opt = shards.optimizer
    if groups is not None and len(groups) != len(opt.param_groups):
        raise CheckpointMismatch(f"the checkpoint has {len(groups)} param groups, the optimizer {len(opt.param_groups)}")
    for piece, view in zip(shards.pieces, shards.views):
        name = piece.slot.name
        master, st = fetch(name, piece.start, piece.end)
        if not isinstance(master, torch.Tensor) or master.numel() != piece.numel:
            got = master.numel() if isinstance(master, torch.Tensor) else type(master).__name__
            raise CheckpointMismatch(f"parameter {name!r}: elements [{piece.start}, {piece.end}) need {piece.numel} "
                                     f"master values, the checkpoint gives {got}")
        view.copy_(master.reshape(view.shape))
        target = opt.state[view]
        target.clear()
        target.update({k: _in(v, view) for k, v in st.items()})
    if groups is not None:
        for mine, saved in zip(opt.param_groups, groups):
            mine.update({k: _plain(v) for k, v in saved.items() if k != "params"})


def own_state_dict(shards: Shards, stage: int, world: int, rank: int) -> dict:
    """The rank's own shard: the inner optimizer's ``state_dict`` and copies of the masters, with what
    identifies the layout (loadable only into the same layout: same world size and model)."""
    return {"zero": {"stage": stage, "world": world, "rank": rank, "pieces": _signature(shards)},
            "optimizer": shards.optimizer.state_dict(),
            "master": [m.detach().clone() for m in shards.masters]}


def check_own_state_dict(shards: Shards, state_dict: dict, world: int, rank: int) -> None:
    """``ValueError`` unless ``state_dict`` (from :func:`own_state_dict`) was taken for this rank's layout."""
    meta = state_dict.get("zero") if isinstance(state_dict, dict) else None
    if meta is None or "optimizer" not in state_dict or "master" not in state_dict:
        raise ValueError("not a ZeroOptimizer state_dict (keys 'zero', 'optimizer', 'master' expected)")
    if meta["world"] != world or meta["rank"] != rank:
        raise ValueError(f"this state_dict is rank {meta['rank']} of {meta['world']} shards; this optimizer is rank "
                         f"{rank} of {world}: a state_dict loads only into the same world size and rank (use "
                         "shard_state()/load_shard_state(), e.g. through zero.checkpoint, to reshard)")
    if [tuple(p) for p in meta["pieces"]] != _signature(shards):
        raise ValueError("this state_dict was taken for another model or bucket layout (its pieces differ)")
    if len(state_dict["master"]) != len(shards.masters):
        raise ValueError(f"this state_dict has {len(state_dict['master'])} master shards, the optimizer "
                         f"{len(shards.masters)}")


def _signature(shards: Shards) -> list[tuple]:
    return [(p.slot.name, p.start, p.end, p.bucket) for p in shards.pieces]
