"""Shared-memory transport: point-to-point between the ranks of one host, no sockets, no copies through
the kernel for small messages and a single copy for large ones.

Every directed pair ``s -> r`` has a ring buffer in shared memory (in ``r``'s segment, see
:mod:`._shm_ring` for the layout and the memory-ordering argument). A message is a 64-byte frame
header followed by its payload:

* *eager* frames stream the payload through the ring: the sender copies in, the receiver copies out
  straight into the posted buffer (or into a private buffer if no receive matches yet, so a ring
  never blocks on matching order). Messages larger than the ring are streamed in chunks.
* *CMA* frames (messages of at least ``cma_min_bytes`` when the kernel allows
  ``process_vm_readv`` between the ranks) carry only the address of the sender's buffer; the
  receiver copies it straight into its buffer with one ``process_vm_readv`` and acknowledges through
  a completion slot. One copy instead of two, and nothing is buffered for unmatched messages.

Progress is made by whoever calls ``wait()``/``done()`` on *any* handle (and eagerly inside
``isend``/``irecv``): each pass drains every inbound ring and pushes every pending send, so two ranks
sending large messages to each other while waiting on their receives cannot deadlock. A waiter with
nothing to do sleeps on its doorbell (a process-shared semaphore) rather than spinning, so
oversubscribed hosts (more ranks than cores) do not lose CPU to idle ranks. Sleeps are capped at
``_CHECK_EVERY`` seconds to notice peers that died (pidfds), raising :class:`PeerError`.

Start-up (:meth:`ShmTransport.from_env`, see :mod:`._shm_boot`) exchanges segment names through a
``TCPStore``: torchrun's agent store when workers are told to use it, otherwise a store on
``MASTER_PORT + 1`` hosted by rank 0. Segments are unlinked as soon as every rank has mapped them,
so nothing is left in ``/dev/shm`` even if a process is killed later.

Only x86 (TSO) is supported; the memory-ordering argument is in :mod:`._shm_ring`.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..types import CollectiveTimeout, PeerError, RingletError
from . import _shm_boot as B
from . import _shm_ring as R
from ._shm_frames import _Frame, _In, _Op, _Out, _Recv, _Send, _memmove, take_first
from ._shm_mailbox import Mailbox
from ._shm_progress import Progress
from .base import COMPLETED, Capabilities, Handle, Transport, nbytes

_CHECK_EVERY = 0.1  # seconds between liveness checks while blocked; also the longest doorbell sleep
_instances = 0  # transports created by this process: part of the bootstrap key prefix


def _env_int(name: str, default: int) -> int:
    val = os.environ.get(name)
    return int(float(val)) if val not in (None, "") else default


@dataclass(frozen=True, slots=True)
class ShmOptions:
    """Tuning knobs, read from the environment by :meth:`from_env`.

    ``ring_bytes``: capacity of each directed ring (``RINGLET_SHM_RING_BYTES``; 0 = automatic: 4 MiB,
    shrinking for large worlds so all rings together stay near 256 MiB, never below 64 KiB).
    ``cma``: use ``process_vm_readv`` for large messages when the kernel allows it (``RINGLET_SHM_CMA``).
    ``cma_min_bytes``: messages at least this large go through CMA (``RINGLET_SHM_CMA_MIN_BYTES``).
    ``spin_us``: how long a waiter polls before sleeping (``RINGLET_SHM_SPIN_US``; -1 = automatic: 50
    when the host has a core per rank, else 0, since a spinning rank steals the core a peer needs).
    ``mailbox_spin_us``: the same for a small all-reduce's one round through the mailbox
    (``RINGLET_SHM_MAILBOX_SPIN_US``, default 100): it yields the core between polls, and a round
    takes tens of microseconds, less than a sleep and a wake-up cost, also with more ranks than cores.
    """

    ring_bytes: int = 0
    cma: bool = True
    cma_min_bytes: int = 64 << 10
    spin_us: int = -1
    mailbox_spin_us: int = 100

    @classmethod
    def from_env(cls) -> "ShmOptions":
        cma = os.environ.get("RINGLET_SHM_CMA", "1").strip().lower() not in ("0", "false", "no", "off")
        return cls(ring_bytes=_env_int("RINGLET_SHM_RING_BYTES", 0), cma=cma,
                   cma_min_bytes=_env_int("RINGLET_SHM_CMA_MIN_BYTES", 64 << 10),
                   spin_us=_env_int("RINGLET_SHM_SPIN_US", -1),
                   mailbox_spin_us=_env_int("RINGLET_SHM_MAILBOX_SPIN_US", 100))

    def capacity(self, size: int) -> int:
        if self.ring_bytes > 0:
            cap = self.ring_bytes
        else:
            pairs = max(1, size * (size - 1))
            cap = min(4 << 20, max(64 << 10, 1 << ((256 << 20) // pairs).bit_length() - 1))
        return max(R.PAGE, (cap + R.PAGE - 1) // R.PAGE * R.PAGE)

    def spin_seconds(self, size: int) -> float:
        if self.spin_us >= 0:
            return self.spin_us * 1e-6
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        return 50e-6 if size <= cores else 0.0


# ---- the transport ----------------------------------------------------------------------------
class ShmTransport(Progress, Transport):
    """Point-to-point over shared memory between the processes of one host.

    Build it with :meth:`from_env` (torchrun's environment) or directly from any
    ``torch.distributed.Store`` shared by the ``size`` processes.
    """

    name = "shm"
    # Small all-reduces of the world in one round through the mailbox; any thread may post and wait (one lock).
    capabilities = Capabilities(small_path="mailbox", small_bytes=R.MAILBOX_PAYLOAD, threaded_posts=True)

    @classmethod
    def available(cls) -> bool:
        return R.supported()[0]

    def __init__(self, rank: int, size: int, store=None, *, timeout: float = 300.0,
                 options: ShmOptions | None = None):
        ok, why = R.supported()
        if not ok:
            raise RingletError(why)
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is outside a world of size {size}")
        if size > 1 and store is None:
            raise ValueError("a world of more than one rank needs a store to exchange segment names")
        self.rank, self.size = rank, size
        self.options = options or ShmOptions.from_env()
        self._lib = R.libc()
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # waits of a lone rank, which has no doorbell
        self._closed = False
        self._spin = self.options.spin_seconds(size)
        self._mailbox_spin = max(0, self.options.mailbox_spin_us) * 1e-6
        self._chunk = 1 << 20
        self._segs: list[R.Segment | None] = [None] * size
        self._outs: list[_Out | None] = [None] * size
        self._ins: list[_In] = []
        self._pids = [os.getpid()] * size
        self._doorbells = [0] * size
        self._watch = R.Watcher()
        self._mapped: B.Mapped | None = None
        self._store = store  # kept alive: rank 0 may be hosting it
        self._posted: dict[tuple[int, int], collections.deque[_Recv]] = {}
        self._unexpected: dict[tuple[int, int], collections.deque[_Frame]] = {}
        self._sending: set[int] = set()  # peers with queued sends
        self._acking: set[int] = set()  # peers with CMA sends awaiting acknowledgement
        self._notify: set[int] = set()  # receivers to wake after this progress pass (new data)
        self._notify_space: set[int] = set()  # senders to wake if they want it (space freed, CMA acks)
        self._want_off = R.want_offset(size)
        self._wanted: set[int] = set()  # peers whose want flag we raised in our header
        self._ack_waits: collections.Counter[int] = collections.Counter()  # blocked CMA-send waits per peer
        self._sleepers = 0
        self._next_check = 0.0
        self._self_posted: dict[int, collections.deque[_Recv]] = {}
        self._self_unexpected: dict[int, collections.deque[torch.Tensor]] = {}
        self._path: str | None = None  # own segment, unlinked once every rank has mapped it
        self._cma_min = max(1, self.options.cma_min_bytes)
        self.mailbox: Mailbox | None = None  # one-round small all-gathers of the world (size > 1)
        if size > 1:
            self._connect(store, timeout)

    # ---- bootstrap ----------------------------------------------------------------------------
    @classmethod
    def from_env(cls, *, timeout: float | None = None, options: ShmOptions | None = None) -> "ShmTransport":
        """Join the job described by torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

        Every rank must run on this host: ``LOCAL_WORLD_SIZE != WORLD_SIZE`` or ranks reporting other
        hostnames raise ``ValueError``.
        """
        global _instances
        env = os.environ
        if timeout is None:
            timeout = float(env.get("RINGLET_TIMEOUT") or 300.0)
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = env.get("LOCAL_WORLD_SIZE")
        if local not in (None, "") and int(local) != size:
            raise ValueError(
                f"The shm transport needs all ranks on one host, but this host runs LOCAL_WORLD_SIZE={local} "
                f"of WORLD_SIZE={size} ranks; use the torch or mpi transport across hosts.")
        _instances += 1
        if size == 1:
            return cls(0, 1, None, timeout=timeout, options=options)
        store = B.store_from_env(env, rank, size, timeout, _instances)
        return cls(rank, size, store, timeout=timeout, options=options)

    def _connect(self, store, timeout: float) -> None:
        m = B.start(self.rank, self.size, store, self.options.capacity(self.size), self.options.cma, timeout)
        self._mapped, self._segs, self._pids, self._watch, self._path = m, m.segments, m.pids, m.watcher, m.path
        me, own = self.rank, m.segments[self.rank]
        for r, seg in enumerate(m.segments):
            self._doorbells[r] = seg.addr + R.H_SEM
            if r != me:
                o = _Out(me, r, seg, self.size)
                o.cma_ok = self.options.cma and seg.mm[R.H_CMA_OK + me] == 1
                self._outs[r] = o
                self._ins.append(_In(me, r, own, self.size))
        self.mailbox = Mailbox(self, R.mailbox_offset(self.size, own.words[R.H_CAP // 8]))

    # ---- one-round small all-gather (world only) -----------------------------------------------
    def small_round(self, record: bytes, payload: torch.Tensor | None, timeout: float | None) -> int:
        """Every rank of the world publishes ``record`` (bytes) and ``payload`` (at most
        ``capabilities.small_bytes`` bytes) and returns once it can read every rank's; the returned round
        number indexes ``self.mailbox.record(q, seq)`` / ``.payload(q, seq, dtype, count)``, valid until
        this rank's next round. Every rank must call it, in the same order as its other collectives."""
        if self.mailbox is None:
            raise ValueError("a world of one rank has no mailbox")
        seq = self.mailbox.publish(record, payload)
        self.mailbox.wait(seq, timeout, _CHECK_EVERY)
        # One slot written, every peer's read: counted as a message to and from each peer, each as large
        # as ours (a round whose slots differ in size fails as a mismatch).
        own = len(record) + (0 if payload is None else nbytes(payload))
        peers = self.size - 1
        self.wire.sent(own * peers, peers)
        self.wire.received(own * peers, peers)
        return seq

    # ---- posting ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        """Raise ``PeerError`` once the transport is closed."""
        if self._closed:
            raise PeerError(f"rank {self.rank}: the shm transport is closed")

    def _admit(self, buf: torch.Tensor, peer: int, count: Callable[[int], None]) -> bool:
        """Check a post of ``buf`` to or from ``peer`` (:meth:`_check`). False when ``peer`` is this rank
        (the post is served locally and not counted); else count its bytes with ``count``
        (``wire.sent`` or ``wire.received``) and return True."""
        self._check(buf, peer)
        if peer == self.rank:
            return False
        count(nbytes(buf))
        return True

    def _check(self, buf: torch.Tensor, peer: int) -> None:
        if self.aborted is not None:
            raise self.aborted_error()
        self._check_open()
        if not 0 <= peer < self.size:
            raise ValueError(f"peer {peer} is outside a world of size {self.size}")
        if not buf.is_cpu:
            raise ValueError(f"the shm transport moves CPU tensors; got one on {buf.device}")
        if buf.dim() != 1 or not buf.is_contiguous():
            raise ValueError("the shm transport needs a contiguous 1-D tensor (view)")

    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        if not self._admit(buf, peer, self.wire.sent):
            return self._self_send(buf, tag)
        h = _Send(self, buf, peer, tag)
        with self._lock:
            o = self._outs[peer]
            self._check_open()
            # A ticket reuses the completion slot of ticket - NSLOTS, which must be acknowledged by then.
            if o.cma_ok and h.nbytes >= self._cma_min and (o.next_ticket - R.NSLOTS) not in o.cma_pending:
                h.kind, h.ticket = R.CMA, o.next_ticket
                o.next_ticket += 1
                o.cma_pending[h.ticket] = h
                self._acking.add(peer)
            o.queue.append(h)
            if len(o.queue) == 1:
                self._push(o)
            if o.queue:
                self._sending.add(peer)
            self._ring_doorbells()
        return h

    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        if not self._admit(buf, peer, self.wire.received):
            return self._self_recv(buf, tag)
        h = _Recv(self, buf, peer, tag)
        key = (peer, tag)
        with self._lock:
            self._check_open()
            f = take_first(self._unexpected, key)
            if f is not None:
                self._bind(f, h)
            else:
                self._posted.setdefault(key, collections.deque()).append(h)
                self._consume(self._ins[peer if peer < self.rank else peer - 1])
            self._ring_doorbells()
        return h

    def _self_send(self, buf: torch.Tensor, tag: int) -> Handle:
        with self._lock:
            h = take_first(self._self_posted, tag)
            if h is not None:
                self._deliver_local(h, buf)
            else:
                self._self_unexpected.setdefault(tag, collections.deque()).append(buf.clone())
        return COMPLETED

    def _self_recv(self, buf: torch.Tensor, tag: int) -> Handle:
        h = _Recv(self, buf, self.rank, tag)
        with self._lock:
            data = take_first(self._self_unexpected, tag)
            if data is not None:
                self._deliver_local(h, data)
            else:
                self._self_posted.setdefault(tag, collections.deque()).append(h)
        return h

    def _deliver_local(self, h: _Recv, data: torch.Tensor) -> None:
        n = data.numel() * data.element_size()
        if n != h.nbytes:
            h.error = PeerError(f"rank {self.rank}: message to itself has {n} bytes, expected {h.nbytes} "
                                f"(tag {h.tag})")
        else:
            if n:
                _memmove(h.addr, data.data_ptr(), n)
            h._finish()
        # A thread of ours may sleep on this receive: wake it.
        self._cond.notify_all()
        if self._doorbells[self.rank]:
            self._lib.sem_post(self._doorbells[self.rank])

    # ---- waiting ------------------------------------------------------------------------------
    def _poll(self, h: _Op) -> bool:
        if h.finished or h.error is not None:
            return True
        if self._lock.acquire(blocking=False):
            try:
                self._progress()
                if not (h.finished or h.error is not None) and time.monotonic() >= self._next_check:
                    self._next_check = time.monotonic() + _CHECK_EVERY
                    self._check_peers(h)
            finally:
                self._lock.release()
        return h.finished or h.error is not None

    def _wait(self, h: _Op, timeout: float | None) -> None:
        if not h.finished and h.error is None:
            self._block(h, timeout)
        if h.error is not None:
            raise h.error

    def _block(self, h: _Op, timeout: float | None) -> None:
        acks = isinstance(h, _Send) and h.kind == R.CMA
        if acks:
            with self._lock:
                self._ack_waits[h.peer] += 1
        try:
            self._block_loop(h, timeout)
        finally:
            if acks:
                with self._lock:
                    self._ack_waits[h.peer] -= 1

    def _block_loop(self, h: _Op, timeout: float | None) -> None:
        lib, bell = self._lib, self._doorbells[self.rank]
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        spin_end = now + self._spin
        next_check = now + _CHECK_EVERY
        drained = False
        while True:
            with self._lock:
                if self._closed and not (h.finished or h.error is not None):
                    h.error = PeerError(f"rank {self.rank}: the shm transport was closed while {h.describe()}")
                moved = self._progress() if not self._closed else False
                if moved and self._sleepers:
                    lib.sem_post(bell)  # another thread of ours may wait for what we just completed
                if h.finished or h.error is not None:
                    return
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + _CHECK_EVERY
                    self._check_peers(h)
                    if h.error is not None:
                        return
                if deadline is not None and now >= deadline:
                    h.error = CollectiveTimeout(f"rank {self.rank}: timed out after {timeout:.1f}s "
                                                f"{h.describe()}")
                    return
                if moved or now < spin_end:
                    drained = False
                    continue
                nap = _CHECK_EVERY if deadline is None else max(0.0, min(_CHECK_EVERY, deadline - now))
                if not bell:  # a lone rank: only a thread of ours can complete this
                    self._cond.wait(nap)
                    continue
                if not drained:
                    self._raise_wants()
                # Counted under the lock so that close() knows nobody touches the semaphore once it unmaps.
                self._sleepers += 1
            try:
                if drained:
                    lib.sem_wait_for(bell, nap)
                else:
                    # Fence (a post: the want flags just raised are visible before we read counters),
                    # drain, then poll once more before sleeping: a publish missed by that poll is
                    # posted after the drain, so the sleep returns at once.
                    lib.sem_post(bell)
                    lib.drain(bell)
                drained = not drained
            finally:
                with self._lock:
                    self._sleepers -= 1

    def _raise_wants(self) -> None:
        """Flag the peers whose space or acknowledgements we may sleep for (see _shm_ring)."""
        want = set(self._sending)
        want.update(q for q, n in self._ack_waits.items() if n)
        if want != self._wanted:
            mm, off = self._segs[self.rank].mm, self._want_off
            for q in want - self._wanted:
                mm[off + q] = 1
            for q in self._wanted - want:
                mm[off + q] = 0
            self._wanted = want

    def _check_peers(self, h: _Op) -> None:
        """Fail ``h`` if its peer is gone or any peer crashed (exited without closing), or the transport
        was aborted."""
        if self.aborted is not None:
            h.error = self.aborted_error()
            return
        if self._closed:
            h.error = PeerError(f"rank {self.rank}: the shm transport was closed while {h.describe()}")
            return
        if h.peer == self.rank:
            return
        dead = self._watch.dead()
        if not dead and not self._segs[h.peer].words[R.H_CLOSED // 8]:
            return
        self._progress()  # take whatever the peer published before it went away
        if h.finished or h.error is not None:
            return
        if self._segs[h.peer].words[R.H_CLOSED // 8]:
            h.error = PeerError(f"rank {self.rank}: peer rank {h.peer} closed its transport while {h.describe()}")
            return
        crashed = sorted(r for r in dead if not self._segs[r].words[R.H_CLOSED // 8])
        if h.peer in crashed:
            h.error = PeerError(f"rank {self.rank}: peer rank {h.peer} died while {h.describe()}")
        elif crashed:
            h.error = PeerError(f"rank {self.rank}: rank {crashed[0]} died (while {h.describe()})")

    # ---- shutdown -----------------------------------------------------------------------------
    def abort(self, error: PeerError) -> None:
        """Fail every pending and later operation with ``error`` (a silent peer was found): blocked
        waits notice it at their next liveness check."""
        with self._lock:
            if self.aborted is None:
                self.aborted = error
            self._cond.notify_all()

    def close(self) -> None:
        """Mark this rank closed (peers waiting on it get PeerError), fail pending operations, unmap."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if os.getpid() != self._owner:  # a forked child: the shared state belongs to the parent
                self._segs, self._mapped = [None] * self.size, None
                return
            own = self._segs[self.rank]
            if own is not None:
                own.words[R.H_CLOSED // 8] = 1
                for r in range(self.size):
                    if r != self.rank and self._segs[r] is not None:
                        self._lib.sem_post(self._doorbells[r])
            err = PeerError(f"rank {self.rank}: the shm transport was closed")
            for q in self._posted.values():
                for h in q:
                    h.error = err
            for o in self._outs:
                if o is not None:
                    for s in list(o.queue) + list(o.cma_pending.values()):
                        s.error = err
            self._cond.notify_all()
        # Threads of ours asleep on the doorbell must leave it before the memory goes away.
        give_up = time.monotonic() + 2 * _CHECK_EVERY + 1.0
        while True:
            with self._lock:
                if not self._sleepers or time.monotonic() > give_up:
                    self._posted.clear()
                    self._unexpected.clear()
                    self._self_posted.clear()
                    self._self_unexpected.clear()
                    self._outs = [None] * self.size
                    self._ins = []
                    self._sending.clear()
                    self._acking.clear()
                    self._notify.clear()
                    self._release()
                    return
                self._lib.sem_post(self._doorbells[self.rank])
            time.sleep(0.001)

    def _release(self) -> None:
        if self.mailbox is not None:
            self.mailbox.close()
        if self._mapped is not None:
            B.release(self._mapped)
        self._segs = [None] * self.size
        self._doorbells = [0] * self.size
        self._store = None
