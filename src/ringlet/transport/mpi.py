"""MPI as a transport, through mpi4py: zero-copy ``Isend``/``Irecv`` on the tensors' own memory.

Launch with ``ringlet run --transport mpi`` (which runs ``mpiexec``) or ``mpiexec`` directly.
ringlet works on a duplicate of ``COMM_WORLD``, so its tags never meet the application's messages.

Every buffer is handed to MPI as raw bytes (a uint8 view), so float16/bfloat16 move like any other
dtype; only ``native_allreduce`` needs a real MPI datatype and declines the ones MPI lacks.
mpi4py initialises MPI with ``MPI_THREAD_MULTIPLE`` by default; collectives call MPI from one thread at a
time, and point-to-point (:mod:`ringlet.p2p`) from the caller's thread beside them, which
``capabilities.threaded_posts`` allows only when the library granted ``MPI_THREAD_MULTIPLE``.
"""
from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import os
import threading
import time

import torch

from ..types import CollectiveTimeout, Options, PeerError, ReduceOp
from .base import Capabilities, Handle, PostingTransport, nbytes

# Polling a request: spin briefly (latency), yield for a while, then sleep in short naps (one Test per
# nap) for a while and with a growing pause after that, so that waiting ranks leave the cores to the
# ranks doing work (CPU oversubscription is common on CI) and do not burn a CPU quota: a host limited to
# half a CPU that yields for milliseconds per message is throttled for the rest of the quota period.
# The yield lasts longer than a small message's round between hosts, since MPICH progresses a request
# only inside MPI calls (benchmarks/small_messages/README.md).
# Environment knobs for experiments.
_SPIN_TESTS = 8
_YIELD_SECONDS = float(os.environ.get("RINGLET_MPI_YIELD_US") or 500) * 1e-6
_NAP = float(os.environ.get("RINGLET_MPI_NAP_US") or 20) * 1e-6
_NAP_SECONDS = 2e-3  # then the pause doubles up to _MAX_SLEEP
_MAX_SLEEP = 5e-4
# A nap of 20 us lasts 70-80 us with Linux's default timer slack (50 us): a thread that waits for MPI
# requests gets a slack of 1 us (prctl PR_SET_TIMERSLACK; it only lets the kernel coalesce wake-ups).
_SLACK_NS = int(os.environ.get("RINGLET_MPI_TIMERSLACK_NS") or 1000)
_slack_set = threading.local()


def _tight_timers() -> None:
    if _SLACK_NS <= 0 or getattr(_slack_set, "done", False):
        return
    _slack_set.done = True
    try:
        ctypes.CDLL(None).prctl(29, ctypes.c_ulong(_SLACK_NS), 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


_MPI = None


def _mpi():
    global _MPI
    if _MPI is None:
        from mpi4py import MPI

        _MPI = MPI
    return _MPI


_EMPTY = bytearray(0)


def _as_bytes(buf: torch.Tensor):
    """A buffer MPI can read or write that shares ``buf``'s memory (CPU, contiguous).

    Built from the data pointer (``MPI.buffer.fromaddress``, about 0.4 us) rather than through a
    numpy view (about 4 us), which matters for small messages: a 4 KiB all-reduce makes a handful
    of these per step. The caller keeps ``buf`` alive until the request completes.
    """
    if buf.is_cuda:
        raise ValueError("The MPI transport moves CPU tensors only; copy CUDA tensors to the CPU first.")
    if not buf.is_contiguous():
        raise ValueError("The MPI transport needs contiguous buffers.")
    nbytes = buf.numel() * buf.element_size()
    if nbytes == 0:
        return _EMPTY
    return _mpi().buffer.fromaddress(buf.data_ptr(), nbytes)


def _wait_request(req, timeout: float | None, describe, owner=None) -> None:
    """Poll ``req.Test()`` until it completes or ``timeout`` seconds pass (then CollectiveTimeout)."""
    _wait_until(req.Test, timeout, describe, owner)


def _wait_until(test, timeout: float | None, describe, owner=None) -> None:
    """Call ``test()`` (an MPI Test*) until it returns true, spinning, yielding, then napping. While it
    naps it raises the abort error of ``owner`` (the transport) once the liveness monitor set one."""
    MPI = _mpi()
    try:
        for _ in range(_SPIN_TESTS):
            if test():
                return
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        pause = _NAP
        while not test():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise CollectiveTimeout(f"{describe()} timed out after {timeout:.1f}s")
            if now - start < _YIELD_SECONDS:
                os.sched_yield()
                continue
            if owner is not None and owner.aborted is not None:
                raise owner.aborted_error()
            if now - start < _NAP_SECONDS:
                _tight_timers()
                time.sleep(_NAP)
            else:
                time.sleep(pause)
                pause = min(pause * 2, _MAX_SLEEP)
    except MPI.Exception as exc:
        raise PeerError(f"{describe()} failed: {exc.Get_error_string()}") from exc


class MPIHandle(Handle):
    __slots__ = ("req", "rank", "peer", "tag", "what", "keep", "finished", "owner")

    def __init__(self, req, rank: int, peer: int | None, tag: int | None, what: str, keep, owner=None):
        self.req = req
        self.rank = rank
        self.peer = peer
        self.tag = tag
        self.what = what
        self.keep = keep  # the tensor: MPI owns its memory until the request completes
        self.finished = False
        self.owner = owner  # the transport, whose abort error ends a wait

    def _describe(self) -> str:
        s = f"rank {self.rank}: {self.what}"
        if self.peer is not None:
            s += f" with peer rank {self.peer}"
        if self.tag is not None:
            s += f" (tag {self.tag})"
        return s

    def wait(self, timeout: float | None = None) -> None:
        if self.finished:
            return
        _wait_request(self.req, timeout, self._describe, self.owner)
        self.finished = True
        self.keep = None

    def done(self) -> bool:
        if not self.finished and self.req.Test():
            self.finished = True
            self.keep = None
        return self.finished


_MPI_DTYPES = {
    torch.float32: "FLOAT",
    torch.float64: "DOUBLE",
    torch.int8: "INT8_T",
    torch.uint8: "UINT8_T",
    torch.int16: "INT16_T",
    torch.int32: "INT32_T",
    torch.int64: "INT64_T",
}


class MPITransport(PostingTransport):
    """Point-to-point over a private duplicate of ``MPI.COMM_WORLD``."""

    name = "mpi"
    # Small all-reduces by recursive doubling with the records in band: one exchange where the native
    # path needs a digest round and then the data round. MPICH over TCP moves 4-32 MiB messages that
    # cross between a pair at about half the link's rate, 1 MiB ones at full rate (docs/design.md,
    # "Why the defaults are what they are").
    capabilities = Capabilities(native_small=True, native_digest=True, small_path="p2p", small_bytes=64 << 10,
                                max_segment_bytes=1 << 20, partial_receive=True, group_setup=True)

    def __init__(self, comm=None, *, timeout: float | None = None):
        MPI = _mpi()
        base = MPI.COMM_WORLD if comm is None else comm
        self.comm = base.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._timeout = Options.from_env().timeout if timeout is None else timeout
        self._comms: dict[tuple[int, ...], object] = {tuple(range(self.size)): self.comm}
        self._closed = False
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            self.capabilities = dataclasses.replace(type(self).capabilities, threaded_posts=True)

    @classmethod
    def available(cls) -> bool:
        return importlib.util.find_spec("mpi4py") is not None

    @classmethod
    def from_env(cls, options: Options | None = None) -> "MPITransport":
        if not cls.available():
            raise RuntimeError("The mpi transport needs mpi4py and an MPI library: pip install 'ringlet[mpi]'.")
        opts = options or Options.from_env()
        return cls(timeout=opts.timeout)

    def _check_open(self) -> None:
        if self._closed:
            raise PeerError(f"rank {self.rank}: the MPI transport has been closed")

    def _post(self, buf: torch.Tensor, peer: int, tag: int, what: str) -> Handle:
        MPI = _mpi()
        arr = [_as_bytes(buf), MPI.BYTE]
        try:
            req = (self.comm.Isend(arr, dest=peer, tag=tag) if what == "send"
                   else self.comm.Irecv(arr, source=peer, tag=tag))
        except MPI.Exception as exc:
            where = "to" if what == "send" else "from"
            raise PeerError(f"rank {self.rank}: {what} {where} rank {peer} (tag {tag}) failed: "
                            f"{exc.Get_error_string()}") from exc
        return MPIHandle(req, self.rank, peer, tag, what, buf, self)

    def irecv_upto(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        """A receive that a message shorter than ``buf`` completes too (MPI's own rule): the small
        all-reduce of :mod:`ringlet.engine.small` posts one buffer for any size up to its limit."""
        return self.irecv(buf, peer, tag)

    def wait_all(self, handles, timeout: float | None = None) -> None:
        """Wait for every handle of this transport with one ``MPI_Testall`` per poll (one progress pass
        for all of them, instead of a poll loop per handle)."""
        MPI = _mpi()
        todo = [h for h in handles if not h.finished]
        if not todo:
            return
        reqs = [h.req for h in todo]
        _wait_until(lambda: MPI.Request.Testall(reqs), timeout,
                    lambda: f"rank {self.rank}: {len(todo)} sends/receives with ranks "
                            f"{sorted({h.peer for h in todo})}", self)
        for h in todo:
            h.finished = True
            h.keep = None

    def native_allreduce(self, buf: torch.Tensor, op, ranks: tuple[int, ...]) -> bool:
        """``MPI_Iallreduce(IN_PLACE)`` on the communicator of ``ranks``; AVG runs as SUM (the collective
        layer scales). False for dtypes without an MPI datatype (float16, bfloat16) or CUDA tensors."""
        self._check_open()
        MPI = _mpi()
        op = ReduceOp.parse(op)
        ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX,
               ReduceOp.PRODUCT: MPI.PROD}
        name = _MPI_DTYPES.get(buf.dtype)
        if buf.is_cuda or name is None or op not in ops:
            return False
        comm = self._comms.get(tuple(ranks))
        if comm is None:
            raise ValueError(f"No MPI communicator for ranks {list(ranks)}; create it with ringlet.new_group.")
        arr = buf.reshape(-1).numpy()
        try:
            req = comm.Iallreduce(MPI.IN_PLACE, [arr, getattr(MPI, name)], ops[op])
        except MPI.Exception as exc:
            raise PeerError(f"rank {self.rank}: native all-reduce failed: {exc.Get_error_string()}") from exc
        MPIHandle(req, self.rank, None, None, f"native all-reduce over ranks {list(ranks)}", arr,
                  self).wait(self._timeout)
        self.wire.native(nbytes(buf))
        return True

    def on_new_group(self, group_id: int, ranks: tuple[int, ...]) -> None:
        """Split a communicator for ``ranks``; collective over the world, called by every rank in order."""
        MPI = _mpi()
        ranks = tuple(ranks)
        if ranks in self._comms:
            return
        member = self.rank in ranks
        sub = self.comm.Split(0 if member else MPI.UNDEFINED, ranks.index(self.rank) if member else 0)
        self._comms[ranks] = sub if member else None

    def close(self) -> None:
        """Free ringlet's communicators. MPI itself is finalised by mpi4py at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        MPI = _mpi()
        if MPI.Is_finalized():
            return
        for comm in self._comms.values():
            if comm is not None and comm != MPI.COMM_NULL:
                try:
                    comm.Free()
                except MPI.Exception:
                    pass
        self._comms.clear()
