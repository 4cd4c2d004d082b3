"""Checkpoints of ZeRO state: sharded (every rank writes its own pieces), loadable into any world size,
asynchronous (training goes on while a background thread writes a snapshot), atomic (a crash never
leaves a half-written file under a final name, nor a checkpoint that looks complete but is not).

::

    from ringlet.torch.training.zero import checkpoint as zckpt

    zckpt.save(path, zero, module, extra={"step": s})          # every rank, same step; returns when written
    handle = zckpt.save_async(path, zero, module, extra=...)    # snapshot now, written in the background
    extra = zckpt.load(path, zero, module)                      # any world size, any stage
    full = zckpt.consolidate(path)                              # one process: ordinary state_dict + optimizer
    path = zckpt.latest(folder)                                 # newest complete checkpoint in folder

``zero`` is anything with the ZeRO checkpoint interface (:mod:`~ringlet.torch.training.zero.state`):
``stage``, ``world``, ``shard_rank``, ``shard_state()`` and ``load_shard_state(fetch)``; if it also has
``param_groups`` (a ``torch.optim.Optimizer``), loading restores their hyperparameters. ``module``: the
model whose trainable parameters ``zero`` holds under the names of ``named_parameters()``; its other
state (buffers, frozen parameters) is saved by shard rank 0. The file format and the rules of agreement
are in ``docs/checkpoints.md`` and :mod:`.checkpoint_files`.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import checkpoint_snapshot as _snapshot
from .checkpoint_async import (Agreement, CheckpointWriteError, SaveHandle, WorldAgreement, set_pending,
                               take_pending)
from .checkpoint_consolidate import consolidate, load_into_torch_optimizer
from .checkpoint_fetch import Fetcher, Index, check_model, load_common
from .checkpoint_files import AtomicWriter, IncompleteCheckpoint, Manifest, latest
from .state import CheckpointMismatch

__all__ = ["save", "save_async", "load", "consolidate", "latest", "is_complete", "load_into_torch_optimizer",
           "SaveOptions", "SaveHandle", "AtomicWriter", "Agreement", "WorldAgreement", "IncompleteCheckpoint",
           "CheckpointMismatch", "CheckpointWriteError"]


@dataclass(frozen=True)
class SaveOptions:
    """``writer``: how one file is written (:class:`AtomicWriter`, or a subclass); ``agreement``: how the
    ranks agree on the calling thread (:class:`WorldAgreement` over every rank of the job by default)."""

    writer: AtomicWriter = field(default_factory=AtomicWriter)
    agreement: Agreement = field(default_factory=WorldAgreement)


def _check_zero(zero) -> None:
    missing = [a for a in ("stage", "world", "shard_rank", "shard_state", "load_shard_state") if not hasattr(zero, a)]
    if missing:
        raise TypeError(f"{type(zero).__name__} lacks the ZeRO checkpoint interface: no {', '.join(missing)}")


def _begin(zero, opts: SaveOptions) -> str:
    """Wait for this rank's previous asynchronous save, then agree on a token; every rank raises
    :class:`CheckpointWriteError` when any rank's previous save failed unreported."""
    _check_zero(zero)
    return _settle(zero, take_pending(zero), opts)


def _settle(zero, prev: SaveHandle | None, opts: SaveOptions) -> str:
    """Wait for ``prev`` (this rank's last asynchronous save, or None), then agree (see :func:`_begin`)."""
    error = prev.unreported_error() if prev is not None else None
    token, any_failed = opts.agreement.agree(error is not None, zero.world)
    if any_failed:
        where = f"of {str(prev.path)!r} " if prev is not None else ""
        who = "on this rank" if error is not None else "on another rank"
        raise CheckpointWriteError(f"the previous asynchronous save {where}failed {who}; that checkpoint is "
                                   "incomplete") from error
    return token


def _take(handle: SaveHandle, zero, module, extra, token: str) -> _snapshot.Snapshot:
    t0 = time.perf_counter()
    snap = _snapshot.take(zero, module, extra, token)
    handle.snapshot_seconds = time.perf_counter() - t0
    return snap


def save(path, zero, module: torch.nn.Module | None = None, *, extra=None,
         options: SaveOptions | None = None) -> SaveHandle:
    """Save now: every rank calls it at the same step; it returns once every rank's files are written
    (the checkpoint is then complete), with a finished :class:`SaveHandle` (``stall_seconds``: the whole
    call). Waits first for this rank's pending :func:`save_async`. Saving over an existing checkpoint
    replaces it (it is incomplete meanwhile: use a new directory per save to always keep one). Raises
    this rank's write error on this rank and :class:`CheckpointWriteError` on the others."""
    t0 = time.perf_counter()
    opts = options or SaveOptions()
    token = _begin(zero, opts)
    path = Path(path)
    handle = SaveHandle(path)
    snap = _take(handle, zero, module, extra, token)
    handle.run(lambda: _snapshot.write(snap, path, opts.writer))
    error = handle.unreported_error()
    _, any_failed = opts.agreement.agree(error is not None, zero.world)
    handle.stall_seconds = time.perf_counter() - t0
    if error is not None:
        raise error
    if any_failed:
        raise CheckpointWriteError(f"the save of {str(path)!r} failed on another rank; it is incomplete")
    return handle


def save_async(path, zero, module: torch.nn.Module | None = None, *, extra=None,
               options: SaveOptions | None = None) -> SaveHandle:
    """Save in the background; return its handle at once. On the calling thread: wait for this rank's
    previous asynchronous save, agree on a token, and copy what the next forward or an LR scheduler may
    change (the module's buffers, the param groups' hyperparameters, ``extra``). The shard state (masters,
    optimizer state), which only ``zero.step()`` changes, is copied by the background thread while
    training goes on; ``zero``'s next ``step()`` first waits until that copy is taken (a step pre-hook),
    so the checkpoint holds the state of this step boundary. Do not change the shard state otherwise
    (``load_state_dict``) before that step. A ``zero`` without ``register_step_pre_hook`` is copied on
    the calling thread. ``stall_seconds``: time on the calling thread; ``blocked_seconds``: what the
    next ``step()`` waited for the copy. The background thread runs no collective. A write error is
    raised by ``handle.wait()`` or, if not reported there, on every rank by the next save. The
    checkpoint is complete once every rank's background write finished (:func:`is_complete`,
    :func:`latest`)."""
    t0 = time.perf_counter()
    opts = options or SaveOptions()
    token = _begin(zero, opts)
    path = Path(path)
    handle = SaveHandle(path)
    finish = _snapshot.take_deferred(zero, module, extra, token)
    if not hasattr(zero, "register_step_pre_hook"):
        snap = _take_now(handle, finish)
        handle.start(lambda: _snapshot.write(snap, path, opts.writer))
    else:
        hook = zero.register_step_pre_hook(lambda *_: handle.wait_snapshot())
        handle.start(lambda: _snapshot.write(_take_now(handle, finish, hook), path, opts.writer))
    set_pending(zero, handle)
    handle.stall_seconds = time.perf_counter() - t0
    return handle


def _take_now(handle: SaveHandle, finish, hook=None) -> _snapshot.Snapshot:
    """Run the deferred copy, record its time and tell a waiting ``step()`` (removing its hook)."""
    t0 = time.perf_counter()
    try:
        return finish()
    finally:
        handle.snapshot_seconds = time.perf_counter() - t0
        handle.snapshot_taken()
        if hook is not None:
            hook.remove()


def is_complete(path) -> bool:
    """True when ``path`` holds a complete checkpoint (every rank's files of one save)."""
    try:
        Manifest.read(path)
        return True
    except (IncompleteCheckpoint, FileNotFoundError):
        return False


def load(path, zero, module: torch.nn.Module | None = None, *, options: SaveOptions | None = None):
    """Load the checkpoint at ``path`` into ``zero`` (any world size and stage: state is kept by parameter
    name and element range) and, with ``module``, its buffers and frozen parameters; return the save's
    ``extra``. Every rank calls it (``zero.load_shard_state`` may communicate). Each rank reads only the
    pieces its shard needs. When an asynchronous save of ``zero`` is pending, every rank first waits for
    its own and the ranks agree (``options.agreement``) as a save would: the files of all are written, or
    :class:`CheckpointWriteError` on every rank.

    ``FileNotFoundError`` (no such directory), :class:`IncompleteCheckpoint` (not every rank's files of
    one save are there), :class:`CheckpointMismatch` naming the parameter or state entry that does not
    fit (missing, unexpected, other shape, dtype or param group; unexpected names are only detected with
    ``module``) — raised before anything is modified."""
    _check_zero(zero)
    pending = take_pending(zero)
    if pending is not None:
        _settle(zero, pending, options or SaveOptions())
    manifest = Manifest.read(path)
    common = load_common(manifest)
    index = Index(manifest, common)
    params = None if module is None else {n: p.numel() for n, p in module.named_parameters() if p.requires_grad}
    check_model(index, manifest.path, zero.shard_state().pieces, params)
    saved_module = common.get("module")
    if module is not None and saved_module is not None:
        _check_module_state(module, saved_module["state"], manifest.path)
    _check_groups(zero, common.get("groups"), manifest.path)
    _restore_groups(zero, common.get("groups"))
    with Fetcher(manifest, index, common) as fetch:
        zero.load_shard_state(fetch)
    if module is not None and saved_module is not None:
        module.load_state_dict(saved_module["state"], strict=False)
    return common.get("extra")


def _check_module_state(module: torch.nn.Module, saved: dict, path: Path) -> None:
    trainable = _snapshot.trainable_names(module)
    mine = {k: v for k, v in module.state_dict(keep_vars=True).items()
            if not (id(v) in trainable)}
    where = f"checkpoint {str(path)!r}"
    for key, value in mine.items():
        if key not in saved:
            raise CheckpointMismatch(f"module state {key!r} (buffer or frozen parameter) is missing from {where}")
        other = saved[key]
        if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor):
            if value.shape != other.shape or value.dtype != other.dtype:
                raise CheckpointMismatch(f"module state {key!r}: {tuple(value.shape)} {value.dtype} in the model, "
                                         f"{tuple(other.shape)} {other.dtype} in {where}")
    for key in saved:
        if key not in mine:
            raise CheckpointMismatch(f"unexpected module state {key!r} in {where}: the model has no such buffer "
                                     "or frozen parameter")


def _check_groups(zero, groups: list | None, path: Path) -> None:
    mine = getattr(zero, "param_groups", None)
    if mine is not None and groups is not None and len(mine) != len(groups):
        raise CheckpointMismatch(f"checkpoint {str(path)!r} has {len(groups)} param groups, the optimizer "
                                 f"{len(mine)}")


def _restore_groups(zero, groups: list | None) -> None:
    mine = getattr(zero, "param_groups", None)
    if mine is None or groups is None:
        return
    for group, saved in zip(mine, groups):
        for key, value in saved.items():
            if key != "params":
                group[key] = copy.deepcopy(value)
