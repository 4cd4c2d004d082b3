"""The execution thread of ``ringlet.torch``: runs agreed batches of collectives while negotiation goes on.

The coordinator puts batches in the order it agreed them, which is the same on every rank, and this
thread runs them one after the other in that order; the collectives use the process sets' groups,
never the coordinator's own, so their tags cannot meet a negotiation round's. The first failure stops
the thread (later batches are dropped: the ranks may no longer be in step) and is kept in ``error``
for the coordinator, which fails every pending handle and stops on every rank.
"""
from __future__ import annotations

import collections
import threading
from typing import Callable

import torch


class ExecQueue:
    """A FIFO of batches (callables) run on one background thread; ``on_move()`` is called (on that
    thread) whenever a batch is taken off the queue, so the coordinator may hand over the next one, and
    when the thread fails."""

    def __init__(self, on_move: Callable[[], None], name: str = "ringlet-exec"):
        self._on_move = on_move
        self._name = name
        self._cond = threading.Condition()
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._running = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def put(self, batch: Callable[[], None]) -> None:
        """Queue ``batch``; it runs after every batch put before it (dropped after a failure)."""
        with self._cond:
            if self.error is None and not self._closing:
                self._queue.append(batch)
                self._cond.notify_all()

    def waiting(self) -> int:
        """Batches queued and not started yet."""
        return len(self._queue)

    def busy(self) -> bool:
        """True while a batch runs or waits."""
        return self._running or bool(self._queue)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued batch ran (or the thread failed or stopped); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._running or self._queue) or self.error is not None
                                       or self._thread is None or not self._thread.is_alive(), timeout)

    def close(self, timeout: float | None = None, drop: bool = False) -> None:
        """Stop the thread after the queued batches ran (``drop``: without running them)."""
        with self._cond:
            self._closing = True
            if drop:
                self._queue.clear()
            self._cond.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def _loop(self) -> None:
        # Requests may hold tensors that require grad (hvd.broadcast_(param, 0)): the thread's copies and
        # in-place reductions must not be recorded by autograd.
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    self._cond.notify_all()
                    return
                batch = self._queue.popleft()
                self._running = True
            self._on_move()
            try:
                batch()
            except BaseException as exc:  # noqa: BLE001 - handed to the coordinator
                with self._cond:
                    self.error = exc
                    self._queue.clear()
                    self._running = False
                    self._cond.notify_all()
                self._on_move()
                return
            batch = None  # the idle thread must not keep the last batch's tensors alive
            with self._cond:
                self._running = False
                self._cond.notify_all()
