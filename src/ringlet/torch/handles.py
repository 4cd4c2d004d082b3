"""Integer handles of asynchronous ops: what ``*_async`` returns and ``poll``/``synchronize`` take."""
from __future__ import annotations

import threading
from typing import Any, Callable


class HandleState:
    """Completion of one handle (an op, or every member of a grouped op)."""

    __slots__ = ("event", "result", "error", "pending", "finalize", "callback")

    def __init__(self, parts: int, finalize: Callable[[list], Any] | None):
        self.event = threading.Event()
        self.result: list = [None] * parts
        self.error: BaseException | None = None
        self.pending = parts
        self.finalize = finalize  # turns the per-part results into what synchronize returns
        self.callback: Callable[[Any, BaseException | None], None] | None = None

    def outcome(self) -> tuple[Any, BaseException | None]:
        """(value, None) or (None, error) of a finished handle."""
        if self.error is not None:
            return None, self.error
        try:
            return (self.finalize(self.result) if self.finalize is not None else self.result[0]), None
        except BaseException as exc:  # noqa: BLE001 - a failing finalizer is the op's outcome
            return None, exc


class HandleTable:
    """Handles count from 1 in each context; the same counter numbers ``noname`` ops (Horovod's rule)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 1
        self._next_internal = -1  # control ops (process set changes) must not shift noname numbering
        self._states: dict[int, HandleState] = {}

    def allocate(self, parts: int = 1, finalize: Callable[[list], Any] | None = None, internal: bool = False) -> int:
        with self._lock:
            if internal:
                h = self._next_internal
                self._next_internal -= 1
            else:
                h = self._next
                self._next += 1
            st = HandleState(parts, finalize)
            if parts == 0:
                st.event.set()
            self._states[h] = st
            return h

    def peek(self) -> int:
        """The number the next (non-internal) handle will get."""
        with self._lock:
            return self._next

    def advance_to(self, n: int) -> None:
        """Make the next handle at least ``n`` (never moves the counter back)."""
        with self._lock:
            self._next = max(self._next, int(n))

    def complete(self, handle: int, part: int, result: Any = None, error: BaseException | None = None) -> None:
        """Record one part's outcome; the handle is done when every part is."""
        with self._lock:
            st = self._states.get(handle)
            if st is None or st.event.is_set():
                return
            if error is not None and st.error is None:
                st.error = error
            st.result[part] = result
            st.pending -= 1
            if st.pending <= 0:
                st.event.set()
            callback = self._release(handle, st)
        if callback is not None:
            callback(*st.outcome())

    def _release(self, handle: int, st: HandleState):
        """A finished handle with a callback is forgotten here (nobody waits on it); returns the callback."""
        if not st.event.is_set() or st.callback is None:
            return None
        self._states.pop(handle, None)
        return st.callback

    def on_done(self, handle: int, fn: Callable[[Any, BaseException | None], None]) -> None:
        """Call ``fn(value, error)`` once ``handle`` finishes (at once when it has) and forget the handle:
        it must not be waited for, polled or synchronized afterwards. ``fn`` must not raise."""
        with self._lock:
            st = self._states.get(handle)
            if st is None:
                raise ValueError(f"Handle {handle!r} was not created or has been cleared.")
            st.callback = fn
            callback = self._release(handle, st)
        if callback is not None:
            callback(*st.outcome())

    def discard(self, handle: int) -> None:
        """Forget a handle whose submission was rejected."""
        with self._lock:
            self._states.pop(handle, None)

    def _get(self, handle: int) -> HandleState:
        with self._lock:
            st = self._states.get(handle)
        if st is None:
            raise ValueError(f"Handle {handle!r} was not created or has been cleared.")
        return st

    def poll(self, handle: int) -> bool:
        return self._get(handle).event.is_set()

    def wait(self, handle: int) -> Any:
        st = self._get(handle)
        while not st.event.wait(1.0):
            pass
        with self._lock:
            self._states.pop(handle, None)
        if st.error is not None:
            raise st.error
        return st.finalize(st.result) if st.finalize is not None else st.result[0]

    def fail_all(self, error: BaseException) -> None:
        with self._lock:
            called = []
            for h, st in list(self._states.items()):
                if not st.event.is_set():
                    st.error = st.error or error
                    st.event.set()
                    callback = self._release(h, st)
                    if callback is not None:
                        called.append((callback, st))
        for callback, st in called:
            callback(*st.outcome())
