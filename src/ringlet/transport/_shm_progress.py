"""The progress engine of the shared-memory transport: pushing sends into rings, draining rings into
receives, matching, CMA reads and acknowledgements, and the doorbells that wake sleeping peers.

Mixed into :class:`.shm.ShmTransport`; every method runs under the transport's lock.
"""
from __future__ import annotations

import collections
import os

import torch

from ..types import PeerError
from . import _shm_ring as R
from ._shm_frames import _Frame, _In, _Out, _Recv, _memmove, take_first


class Progress:
    """Ring traffic of one rank (state lives on the transport: ``_ins``, ``_outs``, ``_posted``...)."""

    def _progress(self) -> bool:
        """One pass over every ring: drain inbound, push outbound, collect CMA acks."""
        moved = False
        for i in self._ins:
            if self._consume(i):
                moved = True
        if self._sending:
            for peer in list(self._sending):
                o = self._outs[peer]
                if self._push(o):
                    moved = True
                if not o.queue:
                    self._sending.discard(peer)
        if self._acking:
            for peer in list(self._acking):
                o = self._outs[peer]
                slots, base = o.seg.words, o.slot_i
                for t in [t for t in o.cma_pending if slots[base + t % R.NSLOTS] >= t]:
                    o.cma_pending.pop(t)._finish()
                    moved = True
                if not o.cma_pending:
                    self._acking.discard(peer)
        self._ring_doorbells()
        return moved

    def _ring_doorbells(self) -> None:
        post, bells = self._lib.sem_post, self._doorbells
        if self._notify:
            for peer in self._notify:
                post(bells[peer])
            self._notify_space.difference_update(self._notify)
            self._notify.clear()
        if self._notify_space:
            post(bells[self.rank])  # full fence between our counter stores and the loads of want flags
            segs, flag = self._segs, self._want_off + self.rank
            for peer in self._notify_space:
                if segs[peer].mm[flag]:
                    post(bells[peer])
            self._notify_space.clear()

    def _push(self, o: _Out) -> bool:
        """Write as much of ``o``'s queued sends into its ring as fits. True if anything was written."""
        words = o.seg.words
        cap, head = o.cap, o.head
        free = cap - (head - words[o.tail_i])
        q = o.queue
        start = head
        while q:
            s = q[0]
            if s.sent < 0:
                if free < R.FRAME:
                    break
                R.HEADER.pack_into(o.seg.mm, o.data_off + head % cap, s.tag, s.nbytes, s.kind,
                                   s.addr if s.kind == R.CMA else 0, s.ticket)
                head += R.FRAME
                free -= R.FRAME
                s.sent = 0
                if s.kind == R.CMA:
                    q.popleft()  # completes when the receiver acknowledges its ticket
                    continue
            padded = R.pad(s.nbytes)
            while s.sent < padded and free > 0:
                n = min(free, padded - s.sent, self._chunk)
                real = min(n, s.nbytes - s.sent)
                if real > 0:
                    pos = head % cap
                    first = min(real, cap - pos)
                    _memmove(o.data + pos, s.addr + s.sent, first)
                    if real > first:
                        _memmove(o.data, s.addr + s.sent + first, real - first)
                head += n
                s.sent += n
                words[o.head_i] = head  # publish each chunk so the receiver can copy out meanwhile
                free = cap - (head - words[o.tail_i])
            if s.sent < padded:
                break
            q.popleft()
            s._finish()
        if head == start:
            return False
        words[o.head_i] = head
        o.head = head
        self._notify.add(o.peer)
        return True

    def _consume(self, i: _In) -> bool:
        """Read every frame available in ring ``i``. True if anything was consumed."""
        words = self._segs[self.rank].words
        head = words[i.head_i]
        tail = i.tail
        if head == tail:
            return False
        cap = i.cap
        mm = self._segs[self.rank].mm
        while tail < head:
            f = i.frame
            if f is None:
                tag, nbytes, kind, raddr, ticket = R.HEADER.unpack_from(mm, i.data_off + tail % cap)
                if nbytes < 0 or kind not in (R.EAGER, R.CMA):
                    raise PeerError(f"rank {self.rank}: corrupt frame from rank {i.peer} (kind {kind}, "
                                    f"{nbytes} bytes); was the segment written by another program?")
                tail += R.FRAME
                f = _Frame(i.peer, tag, nbytes, kind, raddr, ticket)
                self._arrive(f)
                if kind == R.CMA:
                    continue
                if nbytes == 0:
                    self._frame_done(f)
                    continue
                i.frame = f
            padded = R.pad(f.nbytes)
            n = min(head - tail, padded - f.got, self._chunk)
            real = min(n, f.nbytes - f.got)
            if real > 0 and f.dest is not None:
                pos = tail % cap
                first = min(real, cap - pos)
                _memmove(f.dest + f.got, i.data + pos, first)
                if real > first:
                    _memmove(f.dest + f.got + first, i.data, real - first)
            f.got += n
            tail += n
            if f.got >= padded:
                i.frame = None
                self._frame_done(f)
            words[i.tail_i] = tail  # free the space at once: the sender may be waiting for it
        i.tail = tail
        words[i.tail_i] = tail
        self._notify_space.add(i.peer)
        return True

    def _arrive(self, f: _Frame) -> None:
        key = (f.peer, f.tag)
        h = take_first(self._posted, key)
        if h is not None:
            self._bind(f, h)
            return
        if f.kind == R.EAGER and f.nbytes:
            f.keep = torch.empty(f.nbytes, dtype=torch.uint8)
            f.dest = f.keep.data_ptr()
        self._unexpected.setdefault(key, collections.deque()).append(f)

    def _bind(self, f: _Frame, h: _Recv) -> None:
        """Match frame ``f`` (maybe still streaming) with receive ``h``."""
        if f.nbytes != h.nbytes:
            h.error = PeerError(f"rank {self.rank}: message from rank {f.peer} (tag {f.tag}) has {f.nbytes} "
                                f"bytes, but the receive posted for it expects {h.nbytes}")
            f.dest = f.keep = None
            if f.kind == R.CMA:
                self._ack(f)
            return
        if f.kind == R.CMA:
            err = self._lib.read_remote(self._pids[f.peer], h.addr, f.raddr, f.nbytes) if f.nbytes else 0
            if err:
                h.error = PeerError(f"rank {self.rank}: reading {f.nbytes} bytes from rank {f.peer}'s memory "
                                    f"failed: {os.strerror(err)} (did it die?)")
            else:
                h._finish()
            self._ack(f)
            return
        received = min(f.got, f.nbytes)
        if received:
            _memmove(h.addr, f.dest, received)
        f.keep = None
        if f.complete:
            h._finish()
        else:
            f.dest = h.addr
            f.handle = h

    def _ack(self, f: _Frame) -> None:
        i = self._ins[f.peer if f.peer < self.rank else f.peer - 1]
        self._segs[self.rank].words[i.slot_i + f.ticket % R.NSLOTS] = f.ticket
        self._notify_space.add(f.peer)

    def _frame_done(self, f: _Frame) -> None:
        f.complete = True
        if f.handle is not None:
            f.handle._finish()
            f.handle = None
            f.dest = None
