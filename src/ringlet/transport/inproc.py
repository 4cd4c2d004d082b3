"""Ranks as threads of one process: fast unit tests of algorithms, with fault injection.

Not a substitute for real transports: messages move under one lock. By default a send is copied
when it is posted; ``lazy=True`` models a zero-copy transport instead (Gloo, MPI's rendezvous
protocol): the sender's buffer is read only when one side waits, so an executor that reuses a buffer
too early gets wrong data in a test rather than on a cluster.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

import torch

from ..types import CollectiveTimeout, PeerError
from .base import COMPLETED, Capabilities, Handle, Transport, nbytes

Key = tuple[int, int, int]  # (src, dst, tag)


class _RecvHandle(Handle):
    __slots__ = ("world", "buf", "key", "finished", "error", "src")

    def __init__(self, world: "InprocWorld", buf: torch.Tensor, key: Key):
        self.world = world
        self.buf = buf
        self.key = key
        self.finished = False
        self.error: BaseException | None = None
        self.src: _LazySend | None = None  # lazy mode: the matched send, not yet read

    def done(self) -> bool:
        if self.src is not None and not self.finished:
            with self.world.cond:
                self.src.move()
        return self.finished or self.error is not None

    def wait(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.world.cond:
            while not self.done():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    src, dst, tag = self.key
                    raise CollectiveTimeout(
                        f"rank {dst}: timed out after {timeout:.1f}s waiting for a message from rank {src} (tag {tag})"
                    )
                self.world.cond.wait(remaining)
        if self.error is not None:
            raise self.error


class _LazySend(Handle):
    """A posted send whose buffer is read at the first wait (or poll) on either end."""

    __slots__ = ("world", "buf", "key", "dst", "moved")

    def __init__(self, world: "InprocWorld", buf: torch.Tensor, key: Key):
        self.world = world
        self.buf = buf
        self.key = key
        self.dst: _RecvHandle | None = None
        self.moved = False

    def move(self) -> None:
        """Copy into the matched receive; the caller holds ``world.cond``."""
        if not self.moved and self.dst is not None:
            _deliver(self.dst, self.buf)
            self.moved = True
            self.world.cond.notify_all()

    def done(self) -> bool:
        with self.world.cond:
            self.move()
            return self.moved

    def wait(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        src, dst, tag = self.key
        with self.world.cond:
            while True:
                self.move()
                if self.moved:
                    return
                if self.world.dead:
                    raise PeerError(f"rank {src}: peer rank {min(self.world.dead)} died before rank {dst} received "
                                    f"(tag {tag})")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise CollectiveTimeout(f"rank {src}: timed out after {timeout:.1f}s sending to rank {dst} "
                                            f"(tag {tag})")
                self.world.cond.wait(remaining)


class InprocWorld:
    """A set of in-process ranks sharing mailboxes.

    Fault injection: ``delay`` seconds added to every send of ``slow_ranks`` (or all ranks),
    ``drop`` a predicate ``(src, dst, tag) -> bool`` deciding which messages vanish, ``kill(rank)``.
    ``lazy``: read send buffers late (see the module docstring).
    """

    def __init__(self, size: int, *, delay: float = 0.0, slow_ranks: tuple[int, ...] | None = None,
                 drop: Callable[[int, int, int], bool] | None = None, lazy: bool = False):
        self.size = size
        self.lazy = lazy
        self.delay = delay
        self.slow_ranks = slow_ranks
        self.drop = drop
        self.cond = threading.Condition()
        self.unexpected: dict[Key, collections.deque] = collections.defaultdict(collections.deque)
        self.posted: dict[Key, collections.deque] = collections.defaultdict(collections.deque)
        self.dead: set[int] = set()

    def transport(self, rank: int) -> "InprocTransport":
        return InprocTransport(self, rank)

    def kill(self, rank: int) -> None:
        """Mark ``rank`` dead, as a job's liveness monitor announces a dead rank: every survivor's pending
        and later operations fail with ``PeerError`` naming it, not only those with the dead rank (a survivor
        waiting on another survivor that left its collective must not wait for the timeout)."""
        with self.cond:
            self.dead.add(rank)
            for (src, dst, tag), q in self.posted.items():
                for h in q:
                    h.error = PeerError(f"rank {dst}: peer rank {rank} died")
                q.clear()
            self.cond.notify_all()

    def run(self, fn: Callable[["InprocTransport"], object], timeout: float = 120.0) -> list:
        """Run ``fn(transport)`` on every rank in its own thread; return results in rank order.

        The first exception (by rank) is re-raised after all threads finished or timed out.
        """
        results: list = [None] * self.size
        errors: list[BaseException | None] = [None] * self.size

        def body(r: int) -> None:
            try:
                results[r] = fn(self.transport(r))
            except BaseException as exc:  # noqa: BLE001 - reported to the caller below
                errors[r] = exc

        threads = [threading.Thread(target=body, args=(r,), daemon=True, name=f"inproc-rank{r}")
                   for r in range(self.size)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            raise TimeoutError(f"in-process world of {self.size} ranks did not finish in {timeout}s")
        for e in errors:
            if e is not None:
                raise e
        return results


class InprocTransport(Transport):
    name = "inproc"
    capabilities = Capabilities(partial_receive=True, threaded_posts=True)  # one lock guards every mailbox

    def __init__(self, world: InprocWorld, rank: int):
        self.world = world
        self.rank = rank
        self.size = world.size

    def _check_alive(self, peer: int) -> None:
        if self.rank in self.world.dead:
            raise PeerError(f"rank {self.rank} has been killed")
        if self.world.dead:
            raise PeerError(f"rank {self.rank}: peer rank {min(self.world.dead)} died")

    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        w = self.world
        if w.delay and (w.slow_ranks is None or self.rank in w.slow_ranks):
            time.sleep(w.delay)
        key = (self.rank, peer, tag)
        self.wire.sent(nbytes(buf))
        with w.cond:
            self._check_alive(peer)
            if w.drop is not None and w.drop(*key):
                return COMPLETED
            pending = w.posted.get(key)
            if w.lazy:
                out: Handle = _LazySend(w, buf, key)
                if pending:
                    _pair(pending.popleft(), out)
                else:
                    w.unexpected[key].append(out)
            elif pending:
                out = COMPLETED
                _deliver(pending.popleft(), buf)
            else:
                out = COMPLETED
                w.unexpected[key].append(buf.clone())
            w.cond.notify_all()
        return out

    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        return self._irecv(_RecvHandle(self.world, buf, (peer, self.rank, tag)), peer)

    def irecv_upto(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        """Like :meth:`irecv`, but a message shorter than ``buf`` fills its front (MPI's semantics)."""
        return self._irecv(_RecvUpto(self.world, buf, (peer, self.rank, tag)), peer)

    def _irecv(self, h: "_RecvHandle", peer: int) -> Handle:
        w = self.world
        key = h.key
        self.wire.received(nbytes(h.buf))
        with w.cond:
            self._check_alive(peer)
            queued = w.unexpected.get(key)
            if queued:
                first = queued.popleft()
                if isinstance(first, _LazySend):
                    _pair(h, first)
                else:
                    _deliver(h, first)
            else:
                w.posted[key].append(h)
        return h


def _pair(h: _RecvHandle, send: _LazySend) -> None:
    h.src, send.dst = send, h


class _RecvUpto(_RecvHandle):
    """A receive that accepts any message of the same dtype no longer than its buffer."""

    __slots__ = ()


def _deliver(h: _RecvHandle, data: torch.Tensor) -> None:
    if isinstance(h, _RecvUpto) and data.dtype == h.buf.dtype and data.numel() <= h.buf.numel():
        h.buf[:data.numel()].copy_(data)
        h.finished = True
    elif data.numel() != h.buf.numel() or data.dtype != h.buf.dtype:
        h.error = PeerError(
            f"rank {h.key[1]}: message from rank {h.key[0]} has {data.numel()} x {data.dtype}, "
            f"expected {h.buf.numel()} x {h.buf.dtype}"
        )
    else:
        h.buf.copy_(data)
        h.finished = True
