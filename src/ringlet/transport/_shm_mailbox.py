"""One-round all-gather of small records and payloads over shared memory: the shm transport's mailbox.

Each rank's segment ends with two mailbox slots (:data:`SLOT_BYTES` each) that only that rank writes.
Round ``s`` (the ``s``-th call on this transport, the same on every rank of the world) uses slot
``s % 2``: the rank copies its payload and record into the slot, then stores ``s`` in the slot's
sequence word and posts every peer's doorbell; a reader waits until every peer's slot holds ``s``
and then reads the records and payloads in place. On x86 (TSO) the stores of the payload are
visible before the sequence word (the argument of :mod:`._shm_ring`), and a reader loads the word
before the payload.

Two slots need no acknowledgements: a rank writes slot ``s % 2`` again in round ``s + 2``, which it
starts only after every peer published round ``s + 1``, and a peer publishes ``s + 1`` only after it
finished reading round ``s`` (the caller must be done with the views of round ``s`` before it calls
again). Waiting sleeps on the rank's own doorbell (posts are counted, so a publish between the
check and the sleep ends the sleep at once), capped at ``check_every`` seconds to notice dead peers.
A waiter first polls for the transport's mailbox spin (yielding the core between polls), and marks
in its slot that it sleeps before it does, so that the last publisher posts only sleepers.

The world only: every rank of the transport takes part in every round. Sub-groups must not use it.
"""
from __future__ import annotations

import ctypes
import os
import struct
import time

import torch

from ..types import CollectiveTimeout, PeerError

from . import _shm_ring as R
from ._shm_ring import MAILBOX_PAYLOAD as PAYLOAD_MAX
from ._shm_ring import MAILBOX_SLOT as SLOT_BYTES
from ._shm_ring import MAILBOX_SLOT_HEADER as SLOT_HEADER

# Slot header: seq @0, payload bytes @8, record bytes @16, the round its owner sleeps in @24, record @64
# (at most RECORD_MAX bytes).
RECORD_MAX = 1024
_REC_OFF = 64
_SLEEP = 3  # word of the slot header: the owner sleeps waiting for this round (its doorbell needs a post)

_memmove = ctypes.memmove
_yield = os.sched_yield


class Mailbox:
    """The mailbox slots of every rank, seen from rank ``tr.rank`` of a connected :class:`ShmTransport`."""

    def __init__(self, tr, offset: int):
        self.tr = tr
        self.me, self.size = tr.rank, tr.size
        self.seq = 0
        self.offset = offset  # byte offset of the mailbox in every segment
        self._views: dict[tuple, torch.Tensor] = {}
        self._peers = [q for q in range(self.size) if q != self.me]

    def _slot(self, q: int, seq: int) -> int:
        """Byte offset of rank ``q``'s slot for round ``seq`` in its segment (the same in every segment)."""
        return self.offset + (seq & 1) * SLOT_BYTES

    def publish(self, record: bytes, payload: torch.Tensor | None) -> int:
        """Start a round: write ``record`` and ``payload`` (contiguous CPU, at most :data:`PAYLOAD_MAX`
        bytes) into this rank's slot and wake the peers. Returns the round number."""
        nbytes = 0 if payload is None else payload.numel() * payload.element_size()
        if nbytes > PAYLOAD_MAX or len(record) > RECORD_MAX:
            raise ValueError(f"mailbox payload {nbytes} B / record {len(record)} B exceed "
                             f"{PAYLOAD_MAX} / {RECORD_MAX} B")
        tr = self.tr
        seg = tr._segs[self.me]
        if seg is None or tr._closed:
            raise PeerError(f"rank {self.me}: the shm transport is closed")
        self.seq += 1
        s = self.seq
        off = self._slot(self.me, s)
        if nbytes:
            _memmove(seg.addr + off + SLOT_HEADER, payload.data_ptr(), nbytes)
        seg.mm[off + _REC_OFF:off + _REC_OFF + len(record)] = record
        w = off // 8
        words = seg.words
        words[w + 1] = nbytes
        words[w + 2] = len(record)
        words[w] = s  # publish: TSO keeps the stores above before this one
        self._wake_if_last(s, w)
        return s

    def _wake_if_last(self, s: int, w: int) -> None:
        """Post the doorbell of every peer that sleeps waiting for round ``s``, if every rank has now
        published it.

        Only the last publisher needs to wake anyone (a peer cannot finish before it), and only the
        peers that marked their slot as sleeping. Fences on both sides make it a Dekker handshake:
        we store ``s``, fence (a post on our own doorbell, a locked add), then load the peers' words
        and sleep marks; a sleeper stores its mark, fences (taking the transport's lock), then loads
        the words. Either the sleeper sees every ``s``, or the publisher that saw every ``s`` sees its
        mark and posts. Of publishers racing to be last, at least one sees every store; we drain our
        own post before sleeping."""
        tr = self.tr
        post, bells, segs = tr._lib.sem_post, tr._doorbells, tr._segs
        post(bells[self.me])
        for q in self._peers:
            if segs[q].words[w] != s:
                return
        for q in self._peers:
            if segs[q].words[w + _SLEEP] == s:
                post(bells[q])

    def wait(self, seq: int, timeout: float | None, check_every: float) -> None:
        """Block until every peer has published round ``seq``; PeerError if one died or closed,
        CollectiveTimeout after ``timeout`` seconds."""
        tr = self.tr
        w = self._slot(0, seq) // 8
        segs = tr._segs
        pending = [q for q in self._peers if segs[q].words[w] != seq]
        if not pending:
            return
        lib, bell = tr._lib, tr._doorbells[self.me]
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        spin_end = now + tr._mailbox_spin
        next_check = now + check_every
        while True:
            pending = [q for q in pending if segs[q].words[w] != seq]
            if not pending:
                return
            now = time.monotonic()
            if now < spin_end:
                _yield()  # lets a peer sharing this core publish instead of burning its time slice
                continue
            if now >= next_check:
                next_check = now + check_every
                self._check_peers(pending, seq)
            if deadline is not None and now >= deadline:
                raise CollectiveTimeout(f"rank {self.me}: timed out after {timeout:.1f}s in a small all-gather "
                                        f"(round {seq}), waiting for ranks {pending}")
            segs[self.me].words[w + _SLEEP] = seq  # then the lock's fence, then the words are loaded again
            with tr._lock:
                if tr.aborted is not None:
                    raise tr.aborted_error()
                if tr._closed:
                    raise PeerError(f"rank {self.me}: the shm transport was closed during a small all-gather")
                tr._sleepers += 1
            try:
                lib.drain(bell)
                if any(segs[q].words[w] != seq for q in pending):
                    nap = check_every if deadline is None else max(0.0, min(check_every, deadline - now))
                    lib.sem_wait_for(bell, nap)
            finally:
                with tr._lock:
                    tr._sleepers -= 1

    def _check_peers(self, pending: list[int], seq: int) -> None:
        tr = self.tr
        dead = tr._watch.dead()
        for q in pending:
            if tr._segs[q].words[R.H_CLOSED // 8]:
                raise PeerError(f"rank {self.me}: peer rank {q} closed its transport during a small all-gather")
            if q in dead:
                raise PeerError(f"rank {self.me}: peer rank {q} died during a small all-gather (round {seq})")

    def record(self, q: int, seq: int) -> bytes:
        """Rank ``q``'s record of round ``seq`` (after :meth:`wait`)."""
        seg = self.tr._segs[q]
        off = self._slot(q, seq)
        n = seg.words[off // 8 + 2]
        return bytes(seg.mm[off + _REC_OFF:off + _REC_OFF + min(n, RECORD_MAX)])

    def agree(self, seq: int, record: bytes, nbytes: int) -> bool:
        """True when every rank's round ``seq`` carries exactly ``record`` and ``nbytes`` payload bytes."""
        off = self.offset + (seq & 1) * SLOT_BYTES
        w, n = off // 8, len(record)
        a = off + _REC_OFF
        for seg in self.tr._segs:
            words = seg.words
            if words[w + 1] != nbytes or words[w + 2] != n or (n and seg.mm[a:a + n] != record):
                return False
        return True

    def payloads(self, seq: int, dtype: torch.dtype, count: int, as_numpy: bool = False) -> list:
        """Every rank's payload of round ``seq`` (see :meth:`payload`), in rank order."""
        key = (seq & 1, dtype, count, as_numpy)
        v = self._views.get(key)
        if v is None:
            v = [self.payload(q, seq, dtype, count, as_numpy) for q in range(self.size)]
            self._views[key] = v
        return v

    def payload_bytes(self, q: int, seq: int) -> int:
        return self.tr._segs[q].words[self._slot(q, seq) // 8 + 1]

    def payload(self, q: int, seq: int, dtype: torch.dtype, count: int, as_numpy: bool = False):
        """A tensor (or, ``as_numpy``, a numpy array) over rank ``q``'s payload of round ``seq``: valid
        until this rank's next round."""
        key = (q, seq & 1, dtype, count, as_numpy)
        v = self._views.get(key)
        if v is None:
            if len(self._views) > 256:
                self._views.clear()
            addr = self.tr._segs[q].addr + self._slot(q, seq) + SLOT_HEADER
            nbytes = count * torch.empty(0, dtype=dtype).element_size()
            if nbytes == 0:
                return torch.empty(0, dtype=dtype)
            raw = (ctypes.c_char * nbytes).from_address(addr)
            v = torch.frombuffer(raw, dtype=dtype, count=count)
            if as_numpy:
                v = v.numpy()
            self._views[key] = v
        return v

    def close(self) -> None:
        self._views.clear()


def pack_record(values) -> bytes:
    """An int64 record as bytes (what :meth:`Mailbox.publish` carries)."""
    return struct.pack(f"<{len(values)}q", *values)


def unpack_record(raw: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(raw) // 8}q", raw))
