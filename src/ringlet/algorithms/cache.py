"""Caches bounded by bytes, not by entries: a schedule of 1,024 ranks weighs megabytes, one of 4 ranks
a few hundred bytes, so an entry count bounds nothing.

:class:`SizeBoundedCache` is an LRU map whose values carry a weight in bytes: it keeps at most
``max_bytes`` in total and ``max_entries`` values, evicting the least recently used, and does not keep a
value heavier than ``max_item_bytes`` at all (such a value is rebuilt on every call). :func:`cached`
memoises a schedule builder in the one shared :data:`SCHEDULES` cache, weighing each schedule by
:meth:`~ringlet.algorithms.schedule.Schedule.nbytes`.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Callable, Hashable


class SizeBoundedCache:
    """A thread-safe LRU map bounded by total weight (bytes) and entry count (see the module docstring).

    ``ValueError`` for a non-positive bound or ``max_item_bytes > max_bytes``.
    """

    def __init__(self, max_bytes: int, *, max_item_bytes: int | None = None, max_entries: int = 1024):
        max_item_bytes = max_bytes if max_item_bytes is None else max_item_bytes
        if min(max_bytes, max_item_bytes, max_entries) <= 0 or max_item_bytes > max_bytes:
            raise ValueError(f"bounds must be positive with max_item_bytes <= max_bytes, got max_bytes={max_bytes}, "
                             f"max_item_bytes={max_item_bytes}, max_entries={max_entries}")
        self.max_bytes, self.max_item_bytes, self.max_entries = max_bytes, max_item_bytes, max_entries
        self._items: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Total weight of the values held."""
        return self._bytes

    def get(self, key: Hashable, default=None):
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return default
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value, nbytes: int) -> bool:
        """Keep ``value`` under ``key`` (evicting the least recently used); False when it is too heavy to keep."""
        if nbytes > self.max_item_bytes:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes or len(self._items) > self.max_entries:
                _, (_, w) = self._items.popitem(last=False)
                self._bytes -= w
        return True

    def clear(self, which: Callable[[Hashable], bool] | None = None) -> None:
        """Drop every entry, or those whose key satisfies ``which``."""
        with self._lock:
            for key in [k for k in self._items if which is None or which(k)]:
                self._bytes -= self._items.pop(key)[1]


#: Every cached schedule builder's results: 256 MiB in all, none above 64 MiB (a ring all-reduce of
#: 1,024 ranks weighs about 2 MB, so dozens of them fit), at most 256 schedules (``nbytes`` counts the
#: arrays, not the Python objects around them, which dominate small schedules).
SCHEDULES = SizeBoundedCache(256 << 20, max_item_bytes=64 << 20, max_entries=256)


def memoise(cache: SizeBoundedCache, weigh: Callable[[object, tuple], int]) -> Callable[[Callable], Callable]:
    """Decorator: memoise a function of hashable positional arguments in ``cache``, each result
    weighing ``weigh(result, args)`` bytes. The wrapper has ``cache_clear()`` (drops this function's
    entries), ``cache`` and ``__wrapped__``."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args):
            key = (wrapper, args)
            hit = cache.get(key)
            if hit is None:
                hit = fn(*args)
                cache.put(key, hit, weigh(hit, args))
            return hit

        wrapper.cache_clear = lambda: cache.clear(lambda key: key[0] is wrapper)
        wrapper.cache = cache
        return wrapper

    return decorate


def cached(builder: Callable) -> Callable:
    """Memoise a schedule builder in :data:`SCHEDULES`, weighing each schedule by its ``nbytes()``."""
    return memoise(SCHEDULES, lambda schedule, args: schedule.nbytes())(builder)
