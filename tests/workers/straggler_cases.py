"""For the straggler tests: an in-process transport whose hosts have network interfaces of given rates.
A large send waits until both the sender's upload and the receiver's download are free, takes
``bytes / rate`` of both, and is delivered (its handle completes) then. Each sender's messages to one
peer leave in order."""
from __future__ import annotations

import collections
import queue
import threading
import time

from ringlet.transport.base import Handle
from ringlet.transport.inproc import InprocTransport

SMALL = 4096  # messages below this many bytes are delivered at once


class Nics:
    """Every rank's interface: its rate (bytes/s) and when its upload and download are next free."""

    def __init__(self, rates: dict[int, float]):
        self.rates, self.lock = rates, threading.Lock()
        self.up: dict[int, float] = collections.defaultdict(float)
        self.down: dict[int, float] = collections.defaultdict(float)

    def reserve(self, src: int, dst: int, nbytes: int) -> float:
        """When a message posted now from ``src`` to ``dst`` arrives."""
        with self.lock:
            start = max(time.monotonic(), self.up[src], self.down[dst])
            end = start + nbytes / min(self.rates[src], self.rates[dst])
            self.up[src] = self.down[dst] = end
            return end


class _Sent(Handle):
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()

    def wait(self, timeout=None) -> None:
        self.event.wait()

    def done(self) -> bool:
        return self.event.is_set()


class SlowNic(InprocTransport):
    @staticmethod
    def rates(p: int, fast: float, slow: dict) -> Nics:
        return Nics({r: slow.get(r, fast) for r in range(p)})

    def __init__(self, world, rank: int, nics: Nics):
        super().__init__(world, rank)
        self.nics = nics
        self.queues: dict[int, queue.Queue] = {}

    def isend(self, buf, peer, tag):
        n = buf.numel() * buf.element_size()
        if n < SMALL:
            return super().isend(buf, peer, tag)
        q = self.queues.get(peer)
        if q is None:
            q = self.queues[peer] = queue.Queue()
            threading.Thread(target=self._deliver, args=(q,), daemon=True).start()
        h = _Sent()
        q.put((buf.clone(), peer, tag, self.nics.reserve(self.rank, peer, n), h))
        return h

    def _deliver(self, q: queue.Queue) -> None:
        while True:
            data, peer, tag, end, h = q.get()
            delay = end - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            InprocTransport.isend(self, data, peer, tag)
            h.event.set()
