"""The one small interface every transport implements: non-blocking tagged point-to-point, and the
per-transport count of the bytes it moved (:class:`WireCounter`)."""
from __future__ import annotations

import abc
import socket
import threading
from dataclasses import dataclass

import torch


class Handle(abc.ABC):
    """A pending send or receive. ``wait`` raises ``PeerError``/``CollectiveTimeout`` on failure."""

    __slots__ = ()

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> None: ...

    @abc.abstractmethod
    def done(self) -> bool: ...


class CompletedHandle(Handle):
    __slots__ = ()

    def wait(self, timeout: float | None = None) -> None:
        return None

    def done(self) -> bool:
        return True


COMPLETED = CompletedHandle()


@dataclass(frozen=True, slots=True)
class WireCount:
    """A snapshot of a :class:`WireCounter`; ``later - earlier`` is what moved in between.

    ``sent`` / ``received``: payload bytes of point-to-point messages this rank posted (receives at their
    buffer's size: a receive that accepts shorter messages counts its whole buffer), shared memory's
    one-round mailbox included; ``messages_sent`` / ``messages_received``: how many; ``native``: bytes
    handed to the backend's own all-reduce (what the backend sends for them depends on its algorithm,
    so they are not in ``sent``)."""

    sent: int = 0
    received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    native: int = 0

    def __sub__(self, other: "WireCount") -> "WireCount":
        return WireCount(self.sent - other.sent, self.received - other.received,
                         self.messages_sent - other.messages_sent,
                         self.messages_received - other.messages_received, self.native - other.native)


class WireCounter:
    """The bytes one transport moved, counted where each message is posted (every transport calls
    :meth:`sent` / :meth:`received` in its ``isend`` / ``irecv``). Thread-safe; :meth:`snapshot` reads it."""

    __slots__ = ("_lock", "_sent", "_received", "_msent", "_mreceived", "_native")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent = self._received = self._msent = self._mreceived = self._native = 0

    def sent(self, nbytes: int, messages: int = 1) -> None:
        with self._lock:
            self._sent += nbytes
            self._msent += messages

    def received(self, nbytes: int, messages: int = 1) -> None:
        with self._lock:
            self._received += nbytes
            self._mreceived += messages

    def native(self, nbytes: int) -> None:
        with self._lock:
            self._native += nbytes

    def snapshot(self) -> WireCount:
        with self._lock:
            return WireCount(self._sent, self._received, self._msent, self._mreceived, self._native)


def nbytes(buf: torch.Tensor) -> int:
    """Payload bytes of a tensor."""
    return buf.numel() * buf.element_size()


@dataclass(frozen=True, slots=True)
class HostInfo:
    """Where each global rank lives; hierarchical algorithms group ranks by ``host_of``."""

    hostnames: tuple[str, ...]

    @property
    def host_of(self) -> tuple[int, ...]:
        order: dict[str, int] = {}
        return tuple(order.setdefault(h, len(order)) for h in self.hostnames)


class Transport(abc.ABC):
    """Moves contiguous 1-D CPU (or device) tensors between ranks.

    Messages between one (src, dst, tag) triple are matched in the order they were posted (MPI's
    non-overtaking rule); algorithms rely on it when a step is split into segments.
    """

    name: str = "abstract"
    # True when the backend's own all-reduce (compiled, on a low-latency channel, e.g. MPI) beats
    # ringlet's Python-driven schedules on small messages: ``auto`` then picks it for those.
    native_small: bool = False
    # True when the metadata check should be one tiny native all-reduce of a digest (the full record
    # exchange then runs only on a mismatch, to name it): a compiled collective finishes sooner than
    # a Python-driven all-gather of records.
    native_digest: bool = False
    # True when small all-reduces, and with them every checked op's metadata, should travel by
    # recursive doubling over ``irecv_upto`` with the records in band (:mod:`ringlet.engine.small`):
    # one exchange where the native path needs a digest round and then the data round.
    small_p2p: bool = False
    # The largest message the executor should post (None: no limit): longer transfers are cut into
    # segments of at most this size, whatever the options' ``segment_bytes``, for backends that move
    # large messages exchanged both ways between two ranks at a fraction of the link's rate.
    max_segment_bytes: int | None = None
    rank: int
    size: int

    @classmethod
    def available(cls) -> bool:
        return True

    @abc.abstractmethod
    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> Handle: ...

    @abc.abstractmethod
    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> Handle: ...

    # Set by :meth:`abort`: the error every pending and later operation fails with.
    aborted: Exception | None = None

    def close(self) -> None:
        return None

    def abort(self, error: Exception) -> None:
        """Make every pending and later operation fail with ``error`` (a silent peer was found; ``error``
        names it). Transports that can interrupt a blocked wait override this; by default only later
        operations fail."""
        if self.aborted is None:
            self.aborted = error

    def check_strangers(self) -> list:
        """Report and refuse connections to this transport's endpoints from processes that did not
        prove the job's secret; return their addresses. The liveness monitor calls it every heartbeat.
        Transports without network endpoints of their own have nothing to check."""
        return []

    def aborted_error(self) -> Exception:
        """A fresh copy of the abort error (each raise gets its own traceback)."""
        err = self.aborted
        copy = type(err)(*err.args)
        copy.__dict__.update(err.__dict__)
        return copy

    @property
    def wire(self) -> WireCounter:
        """The bytes this transport moved (see :class:`WireCount`); made on first use."""
        d = self.__dict__
        w = d.get("_wire")
        return w if w is not None else d.setdefault("_wire", WireCounter())  # setdefault: one winner

    def hosts(self) -> HostInfo:
        """Hostname of every rank. Transports that can exchange data override; default: one host."""
        return HostInfo(tuple([socket.gethostname()] * self.size))

    # The backend's own collective, the "native" algorithm. Transports without one return False.
    def native_allreduce(self, buf: torch.Tensor, op, ranks: tuple[int, ...]) -> bool:
        return False


class PostingTransport(Transport):
    """A transport whose sends and receives go through one routine, :meth:`_post` (``what``: ``"send"``
    or ``"receive"``), after :meth:`_check_open`; the bytes are counted here."""

    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        return self._posted(buf, peer, tag, "send")

    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        return self._posted(buf, peer, tag, "receive")

    def _posted(self, buf: torch.Tensor, peer: int, tag: int, what: str) -> Handle:
        if self.aborted is not None:
            raise self.aborted_error()
        self._check_open()
        (self.wire.sent if what == "send" else self.wire.received)(nbytes(buf))
        return self._post(buf, peer, tag, what)

    @abc.abstractmethod
    def _check_open(self) -> None:
        """Raise ``PeerError`` when the transport is closed."""

    @abc.abstractmethod
    def _post(self, buf: torch.Tensor, peer: int, tag: int, what: str) -> Handle: ...
