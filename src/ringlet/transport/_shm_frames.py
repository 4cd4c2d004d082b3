"""Handles, frames and ring ends of the shared-memory transport (see :mod:`.shm` and :mod:`._shm_ring`)."""
from __future__ import annotations

import collections
import ctypes

import torch

from . import _shm_ring as R
from .base import Handle


class _Op(Handle):
    """A pending send or receive. ``finished``/``error`` are only changed under the transport lock."""

    __slots__ = ("tr", "peer", "tag", "buf", "addr", "nbytes", "finished", "error")

    def __init__(self, tr: "ShmTransport", buf: torch.Tensor, peer: int, tag: int):
        self.tr = tr
        self.peer = peer
        self.tag = tag
        self.buf = buf  # keeps the memory alive while the operation is in flight
        self.addr = buf.data_ptr()
        self.nbytes = buf.nbytes
        self.finished = False
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.tr._poll(self)

    def wait(self, timeout: float | None = None) -> None:
        self.tr._wait(self, timeout)

    def _finish(self) -> None:
        self.finished = True
        self.buf = None


class _Send(_Op):
    __slots__ = ("kind", "sent", "ticket")

    def __init__(self, tr, buf, peer, tag):
        super().__init__(tr, buf, peer, tag)
        self.kind = R.EAGER
        self.sent = -1  # ring bytes of the payload written; -1 until the frame header is written
        self.ticket = 0

    def describe(self) -> str:
        return f"sending {self.nbytes} bytes to rank {self.peer} (tag {self.tag})"


class _Recv(_Op):
    __slots__ = ()

    def describe(self) -> str:
        return f"receiving {self.nbytes} bytes from rank {self.peer} (tag {self.tag})"


class _Frame:
    """An incoming message, from its header onwards. Unmatched frames wait in ``_unexpected``."""

    __slots__ = ("peer", "tag", "nbytes", "kind", "raddr", "ticket", "got", "dest", "keep", "handle",
                 "complete")

    def __init__(self, peer: int, tag: int, nbytes: int, kind: int, raddr: int, ticket: int):
        self.peer, self.tag, self.nbytes, self.kind = peer, tag, nbytes, kind
        self.raddr, self.ticket = raddr, ticket
        self.got = 0  # ring bytes of the payload consumed (padded)
        self.dest: int | None = None  # where the payload goes; None discards it
        self.keep: torch.Tensor | None = None  # private buffer of an unmatched eager frame
        self.handle: _Recv | None = None
        self.complete = False


class _Out:
    """Sender side of ring ``self -> peer`` (it lives in the peer's segment)."""

    __slots__ = ("peer", "seg", "cap", "data", "data_off", "head_i", "tail_i", "slot_i", "head", "queue",
                 "cma_ok", "next_ticket", "cma_pending")

    def __init__(self, me: int, peer: int, seg: R.Segment, size: int):
        cap = seg.words[R.H_CAP // 8]
        ctrl = R.ring_offset(peer, me, size, cap)
        self.peer, self.seg, self.cap = peer, seg, cap
        self.data_off = ctrl + R.CTRL_BYTES
        self.data = seg.addr + self.data_off
        self.head_i, self.tail_i, self.slot_i = (ctrl + R.C_HEAD) // 8, (ctrl + R.C_TAIL) // 8, (ctrl + R.C_SLOTS) // 8
        self.head = seg.words[self.head_i]
        self.queue: collections.deque[_Send] = collections.deque()
        self.cma_ok = False
        self.next_ticket = 1
        self.cma_pending: dict[int, _Send] = {}  # ticket -> CMA send not acknowledged yet


class _In:
    """Receiver side of ring ``peer -> self`` (it lives in our own segment)."""

    __slots__ = ("peer", "cap", "data", "data_off", "head_i", "tail_i", "slot_i", "tail", "frame")

    def __init__(self, me: int, peer: int, seg: R.Segment, size: int):
        cap = seg.words[R.H_CAP // 8]
        ctrl = R.ring_offset(me, peer, size, cap)
        self.peer, self.cap = peer, cap
        self.data_off = ctrl + R.CTRL_BYTES
        self.data = seg.addr + self.data_off
        self.head_i, self.tail_i, self.slot_i = (ctrl + R.C_HEAD) // 8, (ctrl + R.C_TAIL) // 8, (ctrl + R.C_SLOTS) // 8
        self.tail = seg.words[self.tail_i]
        self.frame: _Frame | None = None  # eager frame whose payload is still streaming in


_memmove = ctypes.memmove  # releases the GIL; glibc fences its streaming stores (see _shm_ring)


def take_first(queues: dict, key):
    """Pop the first item queued under ``key`` (dropping the emptied queue), or None when there is none."""
    q = queues.get(key)
    if not q:
        return None
    item = q.popleft()
    if not q:
        del queues[key]
    return item
