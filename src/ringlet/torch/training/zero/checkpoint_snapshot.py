"""What one rank saves: a :class:`Snapshot` taken at a step boundary (copies only, safe to write while
training goes on) and how it becomes the rank's files.

The module's state is split by who owns it: the **trainable parameters** are the ZeRO object's (saved
as pieces, by name, from ``shard_state()``); everything else in ``module.state_dict()`` — buffers, frozen
parameters, extra states — is copied by shard rank 0 into the common file, with the order of the state
dict's keys and the aliases of tied parameters (a key that names a trainable parameter under another
name), so that consolidation rebuilds the same ``state_dict``.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .checkpoint_files import (FORMAT, VERSION, AtomicWriter, common_name, data_name, dtype_name, remove_stale,
                               write_marker)
from .state import ShardState

__all__ = ["Snapshot", "take", "write", "module_state", "trainable_names"]


@dataclass
class Snapshot:
    """One rank's part of save ``token``: its shard state and, on shard rank 0, the common record."""

    token: str
    rank: int
    world: int
    stage: int
    created: float
    shard: ShardState
    common: dict | None


def trainable_names(module: torch.nn.Module) -> dict[int, str]:
    """``id(parameter) -> name`` of the module's trainable parameters (first name of a tied one)."""
    return {id(p): n for n, p in module.named_parameters() if p.requires_grad}


def module_state(module: torch.nn.Module | None) -> dict | None:
    """The module's state that ZeRO does not hold (copies), the state dict's key order, tied-parameter
    aliases and the trainable parameters' shapes and dtypes; None without a module."""
    if module is None:
        return None
    trainable = trainable_names(module)
    state, aliases = {}, {}
    full = module.state_dict(keep_vars=True)
    for key, value in full.items():
        if id(value) in trainable:
            if trainable[id(value)] != key:
                aliases[key] = trainable[id(value)]
            continue
        state[key] = value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
    params = {n: {"shape": list(p.shape), "dtype": dtype_name(p.dtype)}
              for n, p in module.named_parameters() if p.requires_grad}
    return {"keys": list(full), "state": state, "aliases": aliases, "params": params}


def take(zero, module: torch.nn.Module | None, extra, token: str) -> Snapshot:
    """Copy this rank's state now (on the calling thread): ``zero.shard_state()`` and, on shard rank 0,
    the param groups, the optimizer's extra, ``extra`` (deep-copied) and :func:`module_state`."""
    return take_deferred(zero, module, extra, token)()


def take_deferred(zero, module: torch.nn.Module | None, extra, token: str) -> Callable[[], Snapshot]:
    """Copy now what the next forward or a scheduler may change — on shard rank 0 the param groups'
    hyperparameters, ``extra`` and :func:`module_state` (buffers) — and return a function that copies the
    shard state (masters and optimizer state, which only the optimizer's ``step`` changes) when called,
    on any thread, before that ``step``."""
    early = None
    if zero.shard_rank == 0:
        groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                  for g in getattr(zero, "param_groups", None) or []]
        early = {"groups": groups, "extra": copy.deepcopy(extra), "module": module_state(module)}
    rank, world, stage, created = zero.shard_rank, zero.world, zero.stage, time.time()

    def finish() -> Snapshot:
        shard = zero.shard_state()
        common = None
        if early is not None:
            common = {"groups": early["groups"] if early["groups"] else copy.deepcopy(shard.groups),
                      "zero_extra": copy.deepcopy(shard.extra), "extra": early["extra"], "module": early["module"]}
        return Snapshot(token, rank, world, stage, created, shard, common)

    return finish


def _data(snap: Snapshot) -> dict:
    pieces = [{"name": p.name, "start": p.start, "end": p.end, "master": p.master, "state": p.state}
              for p in snap.shard.pieces]
    return {"format": FORMAT, "version": VERSION, "token": snap.token, "rank": snap.rank, "pieces": pieces}


def _marker(snap: Snapshot, files: dict[str, int]) -> dict:
    params = {}
    for p in snap.shard.pieces:
        params[p.name] = {"shape": list(p.shape), "dtype": dtype_name(p.dtype), "group": p.group}
    return {"format": FORMAT, "version": VERSION, "token": snap.token, "rank": snap.rank, "world": snap.world,
            "stage": snap.stage, "created": snap.created, "files": files, "params": params,
            "pieces": [[p.name, p.start, p.end] for p in snap.shard.pieces]}


def write(snap: Snapshot, path: Path, writer: AtomicWriter) -> int:
    """Write ``snap``'s files into ``path`` (created if needed): data, common (shard rank 0), then the
    marker; then remove this rank's files of other saves there. Returns the bytes written."""
    path.mkdir(parents=True, exist_ok=True)
    files = {}
    name = data_name(snap.rank, snap.token)
    files[name] = writer.write(path / name, lambda f: torch.save(_data(snap), f))
    if snap.common is not None:
        record = {"format": FORMAT, "version": VERSION, "token": snap.token, "world": snap.world,
                  "stage": snap.stage, **snap.common}
        name = common_name(snap.token)
        files[name] = writer.write(path / name, lambda f: torch.save(record, f))
    total = sum(files.values()) + write_marker(writer, path, _marker(snap, files))
    remove_stale(path, snap.rank, snap.token, snap.common is not None)
    return total
