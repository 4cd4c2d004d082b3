"""The files of a ZeRO checkpoint: names, atomic writes, per-rank markers, and the test of completeness.

A checkpoint is one directory. Every save has a ``token`` (agreed by the ranks when the save starts) that
is part of its data files' names, so a save never overwrites the data of another:

* ``rank-RRRRR-TOKEN.pt`` — rank ``R``'s pieces (``torch.save``; read back with ``mmap``);
* ``common-TOKEN.pt`` — written by shard rank 0: param groups, the optimizer's ``extra``, the caller's
  ``extra`` and the module's state that ZeRO does not shard;
* ``rank-RRRRR.json`` — rank ``R``'s **marker**, written last: the save's token, world size and stage,
  the sizes of the files above, and the index of its pieces (name, element range; shape, dtype, group).

Every file is written to a temporary name in the same directory, flushed, ``fsync``'d, renamed over its
final name and the directory ``fsync``'d (:class:`AtomicWriter`). A checkpoint is **complete** when rank
0's marker exists and the markers of ranks ``0 .. world-1`` all carry its token and world size and every
file they list exists with the listed size. Completeness is read from files alone: no rank waits for
another to finish writing.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

import torch

__all__ = ["FORMAT", "VERSION", "AtomicWriter", "IncompleteCheckpoint", "Manifest", "marker_name", "data_name",
           "common_name", "dtype_name", "dtype_of", "latest", "remove_stale"]

FORMAT = "ringlet.zero.checkpoint"
VERSION = 1


class IncompleteCheckpoint(RuntimeError):
    """A checkpoint directory that is not (or not yet) a complete checkpoint; the message says what is
    missing. A missing directory raises ``FileNotFoundError`` instead."""


def marker_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def data_name(rank: int, token: str) -> str:
    return f"rank-{rank:05d}-{token}.pt"


def common_name(token: str) -> str:
    return f"common-{token}.pt"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in checkpoint")
    return dtype


class AtomicWriter:
    """Writes one file so that it appears whole under its final name or not at all: temporary name in the
    same directory, ``dump(stream)``, flush, ``fsync``, rename, ``fsync`` of the directory. The temporary
    file is removed when ``dump`` or the disk fails (the error propagates); a process killed meanwhile
    leaves only a ``.*.tmp`` file, which nothing reads. Subclass and override :meth:`stream` (or
    :meth:`write`) to slow down or break writes in tests."""

    def write(self, final: Path, dump: Callable[[BinaryIO], None]) -> int:
        """Write ``final`` atomically with ``dump``; return its size in bytes."""
        tmp = final.parent / f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            with open(tmp, "wb") as f:
                stream = _FirstError(self.stream(f, final))
                try:
                    dump(stream)
                except Exception as exc:
                    if stream.error is not None and stream.error is not exc:
                        raise stream.error from exc  # torch.save replaces the stream's error with its own
                    raise
                f.flush()
                os.fsync(f.fileno())
            size = tmp.stat().st_size
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(final.parent)
        return size

    def stream(self, f: BinaryIO, final: Path) -> BinaryIO:
        """The stream ``dump`` writes ``final``'s bytes to (the open temporary file)."""
        return f


class _FirstError:
    """A stream that remembers the first exception its ``write`` raised."""

    def __init__(self, inner: BinaryIO):
        self.inner = inner
        self.error: BaseException | None = None

    def write(self, data) -> int:
        try:
            return self.inner.write(data)
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise

    def flush(self) -> None:
        self.inner.flush()


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Manifest:
    """A complete checkpoint as its markers describe it: ``markers[r]`` is rank ``r``'s marker (a dict)."""

    path: Path
    token: str
    world: int
    stage: int
    created: float
    markers: tuple[dict, ...]

    @property
    def common_file(self) -> Path:
        return self.path / common_name(self.token)

    @staticmethod
    def read(path) -> "Manifest":
        """The manifest of the checkpoint at ``path``. ``FileNotFoundError`` when ``path`` is not a
        directory; :class:`IncompleteCheckpoint` naming what is missing when it is not complete."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no checkpoint at {str(path)!r}: not a directory")
        first = _read_marker(path, 0, None)
        token, world = first["token"], first["world"]
        markers = [first] + [_read_marker(path, r, first) for r in range(1, world)]
        for r, marker in enumerate(markers):
            for name, size in marker["files"].items():
                f = path / name
                if not f.is_file() or f.stat().st_size != size:
                    raise IncompleteCheckpoint(f"checkpoint {str(path)!r}: rank {r}'s file {name} is missing or "
                                               f"has another size than its marker records ({size} bytes)")
        if common_name(token) not in first["files"]:
            raise IncompleteCheckpoint(f"checkpoint {str(path)!r}: rank 0's marker lists no {common_name(token)}")
        return Manifest(path, token, world, first["stage"], first["created"], tuple(markers))


def _read_marker(path: Path, rank: int, first: dict | None) -> dict:
    f = path / marker_name(rank)
    try:
        marker = json.loads(f.read_text())
    except FileNotFoundError:
        who = "rank 0" if first is None else f"rank {rank} of {first['world']}"
        raise IncompleteCheckpoint(f"checkpoint {str(path)!r} is incomplete: {who} has not finished writing "
                                   f"(no {f.name})") from None
    except (OSError, ValueError) as exc:
        raise IncompleteCheckpoint(f"checkpoint {str(path)!r}: unreadable marker {f.name}: {exc}") from exc
    if not isinstance(marker, dict) or marker.get("format") != FORMAT:
        raise IncompleteCheckpoint(f"checkpoint {str(path)!r}: {f.name} is not a ringlet ZeRO checkpoint marker")
    if marker.get("version") != VERSION:
        raise IncompleteCheckpoint(f"checkpoint {str(path)!r}: {f.name} has format version "
                                   f"{marker.get('version')}, this ringlet reads {VERSION}")
    if first is not None and (marker["token"] != first["token"] or marker["world"] != first["world"]):
        raise IncompleteCheckpoint(f"checkpoint {str(path)!r} is incomplete: rank {rank}'s marker belongs to "
                                   f"another save (the save of rank 0's marker has not finished there)")
    return marker


def latest(folder) -> Path | None:
    """The newest complete checkpoint among the directories in ``folder`` (by rank 0's snapshot time,
    then name), or None when there is none (or no ``folder``). Incomplete ones are skipped."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    best: tuple[float, str] | None = None
    for sub in folder.iterdir():
        if not sub.is_dir():
            continue
        try:
            m = Manifest.read(sub)
        except (IncompleteCheckpoint, FileNotFoundError):
            continue
        if best is None or (m.created, sub.name) > best:
            best = (m.created, sub.name)
    return folder / best[1] if best is not None else None


def remove_stale(path: Path, rank: int, token: str, with_common: bool) -> None:
    """Remove this rank's data files (and, for shard rank 0, common files) of other saves into ``path``
    (called after this rank's marker of save ``token`` is written). Errors are ignored."""
    keep = {data_name(rank, token), common_name(token)}
    patterns = [f"rank-{rank:05d}-*.pt"] + (["common-*.pt"] if with_common else [])
    for pattern in patterns:
        for f in path.glob(pattern):
            if f.name not in keep:
                try:
                    f.unlink()
                except OSError:
                    pass


def write_marker(writer: AtomicWriter, path: Path, marker: dict) -> int:
    body = json.dumps(marker, indent=None, separators=(",", ":")).encode()
    return writer.write(path / marker_name(marker["rank"]), lambda f: f.write(body))
