"""Low-level pieces of the shared-memory transport: segment layout, libc bindings, peer liveness.

One segment per rank, owned by that rank as a *receiver*::

    header page   magic, version, world size, ring capacity, owner pid, closed flag,
                  the owner's doorbell (a process-shared POSIX semaphore), cma_ok[p]
    per sender s  a control page (head @0, tail @64, NSLOTS completion slots @128)
                  followed by ``capacity`` bytes of ring data
    mailbox       two slots written only by the owner (:mod:`._shm_mailbox`)

A ring is single-producer (sender ``s``) / single-consumer (the owner). ``head`` and ``tail`` are
monotonic byte counters (never wrapped); the data position is ``counter % capacity``. Every frame
starts 64-byte aligned with a 64-byte header, and its payload is padded to a multiple of 64, so a
header never straddles the end of the ring.

Memory ordering (x86-64 TSO): the producer copies payload bytes, *then* stores ``head``; the
consumer loads ``head``, *then* reads the payload, *then* stores ``tail``. TSO keeps stores in
program order and loads in program order and never moves a store before an earlier load, which is
all this protocol needs. glibc's memcpy ends its non-temporal (streaming-store) loop with an
``sfence``, so bulk copies are ordered before the counter store too. Counters are aligned 8-byte
words written with single stores (``memoryview`` of format ``Q``), hence never torn. Weakly ordered
CPUs (ARM, POWER) would need explicit barriers; :func:`supported` refuses them.

Doorbells: a sender that publishes data always posts the receiver's semaphore afterwards
(``sem_post`` is an atomic add that only enters the kernel when someone sleeps). A waiter first
drains its semaphore, then polls all its rings, then sleeps in ``sem_clockwait``: any publish it
missed in the poll was followed by a post after the drain, so the sleep returns at once.
Space freed and CMA acknowledgements would mostly wake senders that wait for something else, so the
receiver posts them only to a sender that raised its *want* flag for it. That is a Dekker-style
handshake (waiter: store flag, load counters; notifier: store counter, load flag), which TSO may
reorder (store buffer), so both sides put a full fence between their store and their load: a
``sem_post`` on their own doorbell, whose locked add is one. The waiter's fence-post is drained just
after; the notifier's is drained before its next sleep. Sleeps are capped (a lost wake-up would cost
latency, never a hang), which also lets waiters notice dead peers, for whom nobody posts.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import platform
import select
import struct
import sys
import time

PAGE = 4096
MAGIC = 0x524E474C54534D31  # "RNGLTSM1"
VERSION = 2

# Header page (byte offsets).
H_MAGIC, H_VERSION, H_SIZE, H_CAP, H_PID, H_CLOSED = 0, 8, 16, 24, 32, 40
H_SEM = 64  # sem_t: 32 bytes on x86-64 glibc, 16 on i386
H_CMA_OK = 128  # one byte per sender: 1 if the owner can read that sender's memory with CMA
# Then one byte per peer (at want_offset): 1 while the owner may sleep waiting for ring space or a CMA
# acknowledgement from that peer, who must then ring its doorbell.

# Per-sender control page (byte offsets from its start).
C_HEAD, C_TAIL, C_SLOTS = 0, 64, 128
NSLOTS = 256  # CMA completion slots: ticket t is acknowledged by storing t into slot t % NSLOTS
CTRL_BYTES = PAGE

# After the rings: the mailbox of :mod:`._shm_mailbox`, two slots of a header page and a payload.
MAILBOX_SLOT_HEADER = PAGE
MAILBOX_PAYLOAD = 64 << 10
MAILBOX_SLOT = MAILBOX_SLOT_HEADER + MAILBOX_PAYLOAD

FRAME = 64  # frame header size and alignment of everything in a ring
EAGER, CMA = 0, 1
# tag, payload bytes, kind, remote address (CMA), ticket (CMA); padded to FRAME bytes.
HEADER = struct.Struct("<qqqQQ")


def pad(n: int) -> int:
    """Ring bytes taken by an ``n``-byte payload."""
    return (n + FRAME - 1) & ~(FRAME - 1)


def want_offset(size: int) -> int:
    return H_CMA_OK + size


def header_bytes(size: int) -> int:
    return (H_CMA_OK + 2 * size + PAGE - 1) // PAGE * PAGE


def mailbox_offset(size: int, capacity: int) -> int:
    return header_bytes(size) + max(0, size - 1) * (CTRL_BYTES + capacity)


def segment_bytes(size: int, capacity: int) -> int:
    return mailbox_offset(size, capacity) + 2 * MAILBOX_SLOT


def ring_offset(owner: int, sender: int, size: int, capacity: int) -> int:
    """Byte offset of the control page of ring ``sender -> owner`` inside ``owner``'s segment."""
    index = sender if sender < owner else sender - 1
    return header_bytes(size) + index * (CTRL_BYTES + capacity)


def supported() -> tuple[bool, str]:
    """Whether this machine can run the transport, and why not."""
    if not sys.platform.startswith("linux"):
        return False, "the shm transport needs Linux"
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False, f"the shm transport relies on x86 memory ordering; this CPU is {platform.machine()}"
    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)):
        return False, "/dev/shm is missing or not writable"
    try:
        libc()
    except (OSError, AttributeError) as exc:
        return False, f"libc lacks process-shared semaphores: {exc}"
    return True, ""


# ---- libc ---------------------------------------------------------------------------------------
class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class Libc:
    """The few libc calls we need. ctypes releases the GIL around each of them."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(None, use_errno=True)
        vp, ci = ctypes.c_void_p, ctypes.c_int
        self.sem_init = lib.sem_init
        self.sem_init.argtypes, self.sem_init.restype = [vp, ci, ctypes.c_uint], ci
        self.sem_post = lib.sem_post
        self.sem_post.argtypes, self.sem_post.restype = [vp], ci
        self.sem_trywait = lib.sem_trywait
        self.sem_trywait.argtypes, self.sem_trywait.restype = [vp], ci
        self.sem_destroy = lib.sem_destroy
        self.sem_destroy.argtypes, self.sem_destroy.restype = [vp], ci
        ts = ctypes.POINTER(_Timespec)
        self._clockwait = getattr(lib, "sem_clockwait", None)  # glibc >= 2.30: immune to clock jumps
        if self._clockwait is not None:
            self._clockwait.argtypes, self._clockwait.restype = [vp, ci, ts], ci
        self._timedwait = lib.sem_timedwait
        self._timedwait.argtypes, self._timedwait.restype = [vp, ts], ci
        self._readv = getattr(lib, "process_vm_readv", None)
        if self._readv is not None:
            iov = ctypes.POINTER(_Iovec)
            self._readv.argtypes = [ci, iov, ctypes.c_ulong, iov, ctypes.c_ulong, ctypes.c_ulong]
            self._readv.restype = ctypes.c_ssize_t

    def sem_wait_for(self, sem: int, seconds: float) -> None:
        """Sleep on the semaphore at address ``sem`` until posted or ``seconds`` elapsed."""
        if self._clockwait is not None:
            t = time.clock_gettime(time.CLOCK_MONOTONIC) + seconds
            clock = time.CLOCK_MONOTONIC
        else:
            t, clock = time.time() + seconds, None
        sec = int(t)
        spec = _Timespec(sec, int((t - sec) * 1e9))
        if clock is None:
            self._timedwait(sem, ctypes.byref(spec))
        else:
            self._clockwait(sem, clock, ctypes.byref(spec))

    def drain(self, sem: int) -> None:
        while self.sem_trywait(sem) == 0:
            pass

    def read_remote(self, pid: int, local: int, remote: int, nbytes: int) -> int:
        """Copy ``nbytes`` from address ``remote`` of process ``pid`` to ``local``. Returns 0 or an errno."""
        if self._readv is None:
            return 38  # ENOSYS
        done = 0
        while done < nbytes:
            lo = _Iovec(local + done, nbytes - done)
            ro = _Iovec(remote + done, nbytes - done)
            got = self._readv(pid, ctypes.byref(lo), 1, ctypes.byref(ro), 1, 0)
            if got <= 0:
                return ctypes.get_errno() or 5  # EIO when the kernel read nothing and set no errno
            done += got
        return 0


_LIBC: Libc | None = None


def libc() -> Libc:
    global _LIBC
    if _LIBC is None:
        _LIBC = Libc()
    return _LIBC


# ---- segments -----------------------------------------------------------------------------------
class Segment:
    """A mapped shared-memory file. ``words`` views it as uint64 counters; ``addr`` is its base."""

    __slots__ = ("path", "mm", "nbytes", "addr", "words", "_view", "_anchor")

    def __init__(self, path: str, mm: mmap.mmap):
        self.path = path
        self.mm = mm
        self.nbytes = len(mm)
        self._anchor = ctypes.c_char.from_buffer(mm)  # pins the mapping while raw addresses are in use
        self.addr = ctypes.addressof(self._anchor)
        self._view = memoryview(mm)
        self.words = self._view.cast("Q")

    @classmethod
    def create(cls, path: str, nbytes: int) -> "Segment":
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                # Reserve the pages now: on a full tmpfs this fails cleanly instead of a later SIGBUS.
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                os.unlink(path)
                raise OSError(exc.errno, f"cannot reserve {nbytes} bytes in /dev/shm for {path}: "
                                         f"{exc.strerror} (free space in /dev/shm or lower RINGLET_SHM_RING_BYTES)")
            mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        return cls(path, mm)

    @classmethod
    def attach(cls, path: str) -> "Segment":
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        return cls(path, mm)

    def close(self) -> None:
        if self.mm is None:
            return
        self.words.release()
        self._view.release()
        self._anchor = None
        self.mm.close()
        self.mm = None


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---- liveness -----------------------------------------------------------------------------------
def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the "(comm)" field (state first), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()


def process_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of ``pid``: with the pid it identifies one process."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])  # field 22 of stat(5)


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class Watcher:
    """Tells whether peer processes have exited: through pidfds (readable once the process exits), or
    by reading ``/proc/<pid>/stat`` where pidfds are missing (Linux < 5.3)."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # rank -> pidfd
        self._procs: dict[int, tuple[int, int]] = {}  # rank -> (pid, start time), polled through /proc
        self._poll = select.poll()

    def watch(self, rank: int, pid: int, start_time: int | None) -> bool:
        """Watch ``pid`` if it is still the process that registered (same start time)."""
        if start_time is None or process_start_time(pid) != start_time:
            return False  # gone already, or another pid namespace: only timeouts will tell
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._procs[rank] = (pid, start_time)
            return True
        if process_start_time(pid) != start_time:  # exited and reused between the two checks
            os.close(fd)
            return False
        self._fds[rank] = fd
        self._poll.register(fd, select.POLLIN)
        return True

    def dead(self) -> set[int]:
        """Ranks whose process has exited."""
        out = {r for r, (pid, start) in self._procs.items() if not _alive(pid, start)}
        if self._fds:
            ready = {fd for fd, _ in self._poll.poll(0)}
            out.update(r for r, fd in self._fds.items() if fd in ready)
        return out

    def close(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
        self._procs.clear()


def _alive(pid: int, start_time: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in (b"Z", b"X") and int(fields[19]) == start_time
