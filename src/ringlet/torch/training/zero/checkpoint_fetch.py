"""Reading a checkpoint by parameter name and element range, whoever saved which range.

:class:`Index` is built from the markers alone (no data file is opened): for every parameter its shape,
dtype and param group, and the saved ranges with the file and position that hold them. :class:`Fetcher`
is the :data:`~ringlet.torch.training.zero.state.Fetch` of a checkpoint: ``fetch(name, start, end)``
intersects ``[start, end)`` with the saved ranges, opens only the data files that hold them (memory-mapped:
only the touched tensors are read from disk) and stitches the parts.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import torch

from .checkpoint_files import IncompleteCheckpoint, Manifest, data_name, dtype_of
from .state import CheckpointMismatch

__all__ = ["Index", "Fetcher", "load_common", "check_model"]


def load_common(manifest: Manifest) -> dict:
    """Shard rank 0's common record of the checkpoint (param groups, extras, module state)."""
    record = torch.load(manifest.common_file, map_location="cpu", weights_only=True)
    if record.get("token") != manifest.token:
        raise IncompleteCheckpoint(f"checkpoint {str(manifest.path)!r}: {manifest.common_file.name} belongs to "
                                   "another save")
    return record


class Index:
    """Every parameter of a checkpoint: ``params[name] = (shape, dtype, group)`` and ``ranges[name]``: the
    saved ``(start, end, file, position)`` in element order. ``IncompleteCheckpoint`` when the saved
    ranges of a parameter do not cover it exactly once."""

    def __init__(self, manifest: Manifest, common: dict):
        self.params: dict[str, tuple[tuple[int, ...], torch.dtype, int]] = {}
        self.ranges: dict[str, list[tuple[int, int, str, int]]] = {}
        module = common.get("module") or {}
        for name, meta in (module.get("params") or {}).items():
            self.params[name] = (tuple(meta["shape"]), dtype_of(meta["dtype"]), -1)
        for rank, marker in enumerate(manifest.markers):
            for name, meta in marker["params"].items():
                self.params[name] = (tuple(meta["shape"]), dtype_of(meta["dtype"]), meta["group"])
            file = data_name(rank, manifest.token)
            for pos, (name, start, end) in enumerate(marker["pieces"]):
                self.ranges.setdefault(name, []).append((start, end, file, pos))
        for name, (shape, _, _) in self.params.items():
            self._check_cover(manifest.path, name, math.prod(shape))

    def _check_cover(self, path: Path, name: str, numel: int) -> None:
        ranges = sorted(r for r in self.ranges.get(name, []) if r[0] < r[1])
        self.ranges[name] = ranges
        at = 0
        for start, end, _, _ in ranges:
            if start != at:
                break
            at = end
        if at != numel or (ranges and ranges[-1][1] != numel):
            raise IncompleteCheckpoint(f"checkpoint {str(path)!r}: the saved pieces of {name!r} do not cover its "
                                       f"{numel} elements exactly once")

    def numel(self, name: str) -> int:
        return math.prod(self.params[name][0])


class Fetcher:
    """``fetch(name, start, end) -> (float32 master values, {state key: 1-D slice or scalar})`` from the
    checkpoint (new tensors, the caller's to keep). ``CheckpointMismatch`` for a parameter the checkpoint
    does not hold or a range outside it. Also carries what the interface's ``fetch`` does not pass:
    ``groups`` (param groups' hyperparameters), ``extra`` (the optimizer's extra), ``stage``, ``world``.
    Use as a context manager (or :meth:`close`) to release the memory-mapped files."""

    def __init__(self, manifest: Manifest, index: Index, common: dict):
        self.path = manifest.path
        self.token = manifest.token
        self.index = index
        self.groups = common.get("groups", [])
        self.extra = common.get("zero_extra", {})
        self.stage = manifest.stage
        self.world = manifest.world
        self._files: dict[str, list[dict]] = {}

    def __enter__(self) -> "Fetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._files.clear()

    def _piece(self, file: str, pos: int) -> dict:
        pieces = self._files.get(file)
        if pieces is None:
            data = torch.load(self.path / file, map_location="cpu", mmap=True, weights_only=True)
            if data.get("token") != self.token:
                raise IncompleteCheckpoint(f"checkpoint {str(self.path)!r}: {file} belongs to another save")
            pieces = self._files[file] = data["pieces"]
        return pieces[pos]

    def __call__(self, name: str, start: int, end: int) -> tuple[torch.Tensor, dict]:
        if name not in self.index.params:
            raise CheckpointMismatch(f"parameter {name!r} is not in checkpoint {str(self.path)!r}")
        numel = self.index.numel(name)
        if not 0 <= start <= end <= numel:
            raise CheckpointMismatch(f"elements [{start}, {end}) of parameter {name!r}: the checkpoint's {name!r} "
                                     f"has {numel} elements")
        parts = []
        for a, b, file, pos in self.index.ranges[name]:
            lo, hi = max(a, start), min(b, end)
            if lo < hi or (start == end and not parts):
                piece = self._piece(file, pos)
                parts.append((piece, lo - a, max(lo, hi) - a, b - a))
            if b >= end and parts:
                break
        return _stitch(name, parts)


def _elementwise(value, numel: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == numel


def _stitch(name: str, parts: list[tuple[dict, int, int, int]]) -> tuple[torch.Tensor, dict]:
    """Concatenate ``piece[lo:hi]`` of every part (``n``: the piece's length) into new tensors."""
    if not parts:
        return torch.zeros(0, dtype=torch.float32), {}
    master = torch.cat([piece["master"][lo:hi] for piece, lo, hi, _ in parts])  # a new tensor
    first = parts[0][0]["state"]
    state = {}
    for key, value in first.items():
        if _elementwise(value, parts[0][3]):
            slices = []
            for piece, lo, hi, n in parts:
                other = piece["state"].get(key)
                if not _elementwise(other, n):
                    raise IncompleteCheckpoint(f"optimizer state {key!r} of {name!r} differs between its pieces")
                slices.append(other[lo:hi])
            state[key] = torch.cat(slices)
        else:
            state[key] = value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
    return master, state


def check_model(index: Index, path: Path, pieces, module_params: dict[str, int] | None) -> None:
    """``CheckpointMismatch`` naming the first parameter that does not fit: one of this rank's ``pieces``
    (from ``shard_state()``) the checkpoint lacks or holds with another shape, dtype or param group, and,
    with ``module_params`` (the model's trainable parameters: name -> element count), a name on one side
    only (a model parameter without elements may be absent: it is in no piece)."""
    where = f"checkpoint {str(path)!r}"
    for p in pieces:
        if p.name not in index.params:
            raise CheckpointMismatch(f"parameter {p.name!r} of the model is missing from {where}")
        shape, dtype, group = index.params[p.name]
        if tuple(p.shape) != shape:
            raise CheckpointMismatch(f"parameter {p.name!r}: shape {tuple(p.shape)} in the model, {shape} in {where}")
        if p.dtype != dtype:
            raise CheckpointMismatch(f"parameter {p.name!r}: dtype {p.dtype} in the model, {dtype} in {where}")
        if group >= 0 and p.group != group:
            raise CheckpointMismatch(f"parameter {p.name!r}: param group {p.group} in the model, {group} in {where}")
    if module_params is not None:
        for name, numel in module_params.items():
            if name not in index.params and numel > 0:
                raise CheckpointMismatch(f"parameter {name!r} of the model is missing from {where}")
        for name in index.params:
            if name not in module_params:
                raise CheckpointMismatch(f"unexpected parameter {name!r} in {where}: the model has no trainable "
                                         "parameter of that name")
