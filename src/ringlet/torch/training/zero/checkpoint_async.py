"""The running of a save: how the ranks agree (on the calling thread only), the handle of a save, and the
background thread that writes an asynchronous one.

Agreement (:class:`Agreement`) happens where every rank calls the save, in the same order as training's
collectives: when a save starts (a token naming the save, and whether any rank's previous asynchronous
save failed) and at the end of a synchronous save (whether any rank failed to write). The background
thread of an asynchronous save runs no collective at all: it only writes files, and the checkpoint's
completeness is read from the files (the per-rank markers).
"""
from __future__ import annotations

import secrets
import threading
import time
import weakref
from pathlib import Path
from typing import Callable

import torch

__all__ = ["Agreement", "WorldAgreement", "SaveHandle", "CheckpointWriteError", "take_pending", "set_pending"]


class CheckpointWriteError(RuntimeError):
    """An asynchronous save failed to write on some rank (raised on every rank at the next save), or a
    synchronous save failed on another rank."""


class Agreement:
    """How the ranks of a save agree, called on the training thread by every rank at the same point.
    :meth:`agree` returns ``(token, any_failed)``: one token for the save, the same on every rank, and
    whether ``failed`` was true on any rank."""

    def agree(self, failed: bool, world: int) -> tuple[str, bool]:
        raise NotImplementedError


class WorldAgreement(Agreement):
    """One all-reduce (MAX) of two ``int64`` over ringlet's ``group`` (None: every rank of the job — which
    is what every rank calling the save at the same step means). With no ringlet runtime the process is
    alone: a random token, its own flag; ``ValueError`` then if the ZeRO group has more than one rank."""

    def __init__(self, group=None):
        self.group = group

    def agree(self, failed: bool, world: int) -> tuple[str, bool]:
        from ringlet import collectives
        from ringlet.types import ReduceOp

        try:
            collectives.runtime()
        except ValueError:
            if world > 1:
                raise ValueError(f"a ZeRO checkpoint of {world} ranks needs the ranks to agree, but ringlet is not "
                                 "initialised on this thread (call ringlet.init(), or pass an Agreement in "
                                 "SaveOptions)") from None
            return f"{secrets.randbits(62):016x}", failed
        mine = torch.tensor([int(failed), secrets.randbits(62)], dtype=torch.int64)
        out = collectives.allreduce(mine, op=ReduceOp.MAX, group=self.group)
        return f"{int(out[1]):016x}", bool(out[0])


class SaveHandle:
    """One save of one rank. ``stall_seconds``: the time the save took on the calling thread (the whole
    synchronous save; for an asynchronous one waiting for the previous save, agreeing and copying what
    the next forward may change); ``blocked_seconds``: how long training's next ``step()`` waited for an
    asynchronous save's copy of the shard state; ``snapshot_seconds``: the shard state's copy alone;
    ``write_seconds`` / ``bytes_written``: this rank's writing, once done."""

    def __init__(self, path: Path):
        self.path = path
        self.stall_seconds = 0.0
        self.blocked_seconds = 0.0
        self.snapshot_seconds = 0.0
        self._snapshot = threading.Event()
        self.write_seconds = 0.0
        self.bytes_written = 0
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._reported = False
        self._thread: threading.Thread | None = None

    def snapshot_taken(self) -> None:
        """The shard state is copied: the live state may change from now on."""
        self._snapshot.set()

    def wait_snapshot(self) -> None:
        """Block until the shard state is copied (or the save ended); add the wait to ``blocked_seconds``."""
        t0 = time.perf_counter()
        while not self._snapshot.wait(0.05):
            if self._done.is_set():
                break
        self.blocked_seconds += time.perf_counter() - t0

    def done(self) -> bool:
        """True once this rank's files are written (or the write failed)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until this rank's files are written; raise the write's exception if it failed (once:
        a reported error is not raised again at the next save). ``TimeoutError`` if not done within
        ``timeout`` seconds. The checkpoint is complete once every rank's files are: see ``is_complete``."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the save of {str(self.path)!r} is still writing after {timeout}s")
        if self._error is not None and not self._reported:
            self._reported = True
            raise self._error

    def run(self, write: Callable[[], int]) -> None:
        """Run ``write`` (returns bytes written) on this thread, recording its time, size or error."""
        t0 = time.perf_counter()
        try:
            self.bytes_written = write()
        except BaseException as exc:  # noqa: BLE001 - kept for wait() / the next save
            self._error = exc
        finally:
            self.write_seconds = time.perf_counter() - t0
            self._done.set()

    def start(self, write: Callable[[], int]) -> None:
        """Run ``write`` on a background (non-daemon: a normal exit lets it finish) thread."""
        self._thread = threading.Thread(target=self.run, args=(write,), name=f"ringlet-zero-save:{self.path.name}")
        self._thread.start()

    def unreported_error(self) -> BaseException | None:
        """Wait for the write; its error if :meth:`wait` has not raised it yet (then counts as reported)."""
        self._done.wait()
        if self._error is None or self._reported:
            return None
        self._reported = True
        return self._error


_pending: "weakref.WeakKeyDictionary[object, SaveHandle]" = weakref.WeakKeyDictionary()
_pending_by_id: dict[int, SaveHandle] = {}


def take_pending(zero) -> SaveHandle | None:
    """The last asynchronous save of ``zero`` not yet taken, forgotten from now on."""
    try:
        return _pending.pop(zero, None)
    except TypeError:
        return _pending_by_id.pop(id(zero), None)


def set_pending(zero, handle: SaveHandle) -> None:
    try:
        _pending[zero] = handle
    except TypeError:
        _pending_by_id[id(zero)] = handle
