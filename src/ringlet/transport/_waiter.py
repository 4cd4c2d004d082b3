"""Blocking backend waits that the transport's abort can interrupt.

A Gloo ``Work.wait()`` cannot be interrupted from Python, and ``is_completed()`` of a point-to-point
work only turns true inside ``wait()``, so it cannot be polled. A receive that the backend never
completes (its connection closed in a way that does not fail it) would hold its caller until the
collective timeout. Here each calling thread hands its blocking waits to a helper thread of its own
and waits for that helper's answer in slices, checking between slices whether the transport was
aborted; if it was, the caller raises and the helper is left behind in the dead backend.
"""
from __future__ import annotations

import threading
from typing import Callable

SLICE = 0.25  # seconds between checks of the abort flag while a wait is in progress


class _Helper:
    __slots__ = ("go", "done", "job", "error", "stuck")

    def __init__(self) -> None:
        self.go = threading.Lock()
        self.go.acquire()
        self.done = threading.Lock()
        self.done.acquire()
        self.job: Callable[[], None] | None = None
        self.error: BaseException | None = None
        self.stuck = False
        threading.Thread(target=self._run, name="ringlet-wait", daemon=True).start()

    def _run(self) -> None:
        while True:
            self.go.acquire()
            job, self.job = self.job, None
            try:
                job()
                self.error = None
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self.error = exc
            # The idle helper must not keep the last job alive: it holds the backend's work, and the
            # work holds the collective's buffers (torch keeps a tensor whose C++ side is still owned).
            job = None
            self.done.release()


class Waiter:
    """``wait(job, aborted)`` runs ``job`` (a blocking wait) on this thread's helper and returns when it
    does, or raises what ``aborted()`` returns as soon as that is not None."""

    def __init__(self) -> None:
        self._local = threading.local()

    def wait(self, job: Callable[[], None], aborted: Callable[[], BaseException | None]) -> None:
        h = getattr(self._local, "helper", None)
        if h is None or h.stuck:
            h = self._local.helper = _Helper()
        h.job = job
        h.go.release()
        while not h.done.acquire(timeout=SLICE):
            err = aborted()
            if err is not None:
                h.stuck = True  # still inside the backend: the next wait gets a new helper
                raise err
        if h.error is not None:
            err, h.error = h.error, None
            raise err
