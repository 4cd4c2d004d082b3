"""Ranks as threads of one process: fast unit tests of algorithms, with fault injection.

Not a substitute for real transports: every message is copied eagerly under one lock.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

import torch

from ..types import CollectiveTimeout, PeerError
from .base import COMPLETED, Handle, Transport

Key = tuple[int, int, int]  # (src, dst, tag)


class _RecvHandle(Handle):
    __slots__ = ("world", "buf", "key", "finished", "error")

    def __init__(self, world: "InprocWorld", buf: torch.Tensor, key: Key):
        self.world = world
        self.buf = buf
        self.key = key
        self.finished = False
        self.error: BaseException | None = None

    def done(self) -> bool:
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


class InprocWorld:
    """A set of in-process ranks sharing mailboxes.

    Fault injection: ``delay`` seconds added to every send of ``slow_ranks`` (or all ranks),
    ``drop`` a predicate ``(src, dst, tag) -> bool`` deciding which messages vanish, ``kill(rank)``.
    """

    def __init__(self, size: int, *, delay: float = 0.0, slow_ranks: tuple[int, ...] | None = None,
                 drop: Callable[[int, int, int], bool] | None = None):
        self.size = size
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
        """Mark ``rank`` dead: its peers' pending and future receives from it fail with PeerError."""
        with self.cond:
            self.dead.add(rank)
            for (src, dst, tag), q in self.posted.items():
                if src == rank or dst == rank:
                    for h in q:
                        h.error = PeerError(f"rank {dst}: peer rank {src} died")
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

    def __init__(self, world: InprocWorld, rank: int):
        self.world = world
        self.rank = rank
        self.size = world.size

    def _check_alive(self, peer: int) -> None:
        if self.rank in self.world.dead:
            raise PeerError(f"rank {self.rank} has been killed")
        if peer in self.world.dead:
            raise PeerError(f"rank {self.rank}: peer rank {peer} died")

    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        w = self.world
        if w.delay and (w.slow_ranks is None or self.rank in w.slow_ranks):
            time.sleep(w.delay)
        key = (self.rank, peer, tag)
        with w.cond:
            self._check_alive(peer)
            if w.drop is not None and w.drop(*key):
                return COMPLETED
            pending = w.posted.get(key)
            if pending:
                h = pending.popleft()
                _deliver(h, buf)
            else:
                w.unexpected[key].append(buf.clone())
            w.cond.notify_all()
        return COMPLETED

    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        w = self.world
        key = (peer, self.rank, tag)
        h = _RecvHandle(w, buf, key)
        with w.cond:
            self._check_alive(peer)
            queued = w.unexpected.get(key)
            if queued:
                _deliver(h, queued.popleft())
            else:
                w.posted[key].append(h)
        return h


def _deliver(h: _RecvHandle, data: torch.Tensor) -> None:
    if data.numel() != h.buf.numel() or data.dtype != h.buf.dtype:
        h.error = PeerError(
            f"rank {h.key[1]}: message from rank {h.key[0]} has {data.numel()} x {data.dtype}, "
            f"expected {h.buf.numel()} x {h.buf.dtype}"
        )
    else:
        h.buf.copy_(data)
        h.finished = True
