"""The one small interface every transport implements: non-blocking tagged point-to-point, the
per-transport count of the bytes it moved (:class:`WireCounter`), and the record of the optional
abilities a backend has (:class:`Capabilities`), with a default method for each: callers read
``transport.capabilities`` and never probe a transport for attributes."""
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


class LinkCounter:
    """Per-peer timing of this rank's large sends (at least ``min_bytes``), for straggler detection
    (:mod:`ringlet.straggler`): the executor calls :meth:`add` at each such send's wait with its bytes,
    the seconds from post to the end of its wait, and the seconds blocked in that wait. A transport has
    one only while a straggler meter is attached (``transport.links``; None otherwise), so smaller
    messages and unmetered jobs pay nothing. Written by the thread running collectives and read by the
    liveness thread without a lock: a snapshot may miss the message being added, never more."""

    __slots__ = ("min_bytes", "peers")

    def __init__(self, min_bytes: int = 64 << 10) -> None:
        if min_bytes < 1:
            raise ValueError(f"LinkCounter.min_bytes must be positive, got {min_bytes}")
        self.min_bytes = min_bytes
        self.peers: dict[int, list] = {}  # peer -> [bytes, elapsed s, blocked s, messages]

    def add(self, peer: int, nbytes: int, elapsed: float, blocked: float) -> None:
        row = self.peers.get(peer)
        if row is None:
            row = self.peers.setdefault(peer, [0, 0.0, 0.0, 0])
        row[0] += nbytes
        row[1] += elapsed
        row[2] += blocked
        row[3] += 1

    def snapshot(self) -> dict[int, tuple[int, float, float, int]]:
        """Totals per peer so far: (bytes, elapsed s, blocked s, messages)."""
        return {peer: tuple(row) for peer, row in list(self.peers.items())}


def nbytes(buf: torch.Tensor) -> int:
    """Payload bytes of a tensor."""
    return buf.numel() * buf.element_size()


SMALL_PATHS = (None, "mailbox", "p2p")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a transport offers beyond tagged point-to-point, declared once per backend
    (``Transport.capabilities``; the defaults describe a transport with nothing extra).

    ``native_small``: the backend's own all-reduce (compiled, on a low-latency channel: MPI) beats
    ringlet's Python-driven schedules on small messages; ``"auto"`` then picks it for those.
    ``native_digest``: a checked op's metadata check should be one tiny native all-reduce of a digest
    (the record exchange runs only on a mismatch, to name it).
    ``small_path``: the transport's one path for small all-reduces, with the metadata check in the same
    messages (:mod:`ringlet.engine.small`), which then also carries every checked op's records:
    ``"mailbox"`` (one round through :meth:`Transport.small_round`; the world group only), ``"p2p"``
    (recursive doubling over :meth:`Transport.irecv_upto`; any group) or None (the schedules).
    ``small_bytes``: the most payload bytes that path takes.
    ``max_segment_bytes``: the largest message the executor should post (None: no limit), for backends
    that move large messages exchanged both ways between two ranks at a fraction of the link's rate.
    ``partial_receive``: :meth:`Transport.irecv_upto` exists (a receive that a shorter message completes).
    ``group_setup``: a new group needs a step of the backend (:meth:`Transport.on_new_group`), collective
    over the world and queued like a collective.
    ``native_dtypes``: the dtypes the backend's own all-reduce (algorithm ``"native"``,
    :meth:`Transport.native_allreduce`) takes for every op ringlet sends it; empty where the step tuner
    should not try it (no native all-reduce, or one whose dtypes vary with the build).
    ``threaded_posts``: sends and receives may be posted and waited on from several threads of the process
    at once (the caller's and the communication thread): what :mod:`ringlet.p2p` needs, since it posts
    from the caller's thread while collectives run on the communication thread."""

    native_small: bool = False
    native_digest: bool = False
    small_path: str | None = None
    small_bytes: int = 0
    max_segment_bytes: int | None = None
    partial_receive: bool = False
    group_setup: bool = False
    native_dtypes: frozenset = frozenset()
    threaded_posts: bool = False

    def native_takes(self, tensors) -> bool:
        """Whether the backend's own all-reduce takes every one of ``tensors`` (a non-empty collection
        whose dtypes are all in :attr:`native_dtypes`)."""
        tensors = list(tensors)
        return bool(tensors) and all(t.dtype in self.native_dtypes for t in tensors)

    def __post_init__(self) -> None:
        if self.small_path not in SMALL_PATHS:
            raise ValueError(f"small_path must be one of {SMALL_PATHS}, got {self.small_path!r}")
        if self.small_path == "p2p" and not self.partial_receive:
            raise ValueError("small_path 'p2p' needs partial_receive (irecv_upto)")
        if self.small_path is not None and self.small_bytes <= 0:
            raise ValueError(f"small_path {self.small_path!r} needs small_bytes > 0")
        if self.max_segment_bytes is not None and self.max_segment_bytes < 1:
            raise ValueError(f"max_segment_bytes must be positive or None, got {self.max_segment_bytes}")


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
    # The optional abilities of this backend (see :class:`Capabilities`); each backend declares its own.
    capabilities: Capabilities = Capabilities()
    # Where ``capabilities.small_path == "mailbox"``: the world's mailbox, whose slots :meth:`small_round`'s
    # round number indexes (records, payload sizes, payloads); None elsewhere.
    mailbox = None
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
    # Per-peer timing of large sends (:class:`LinkCounter`), set while a straggler meter is attached.
    links: LinkCounter | None = None

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

    def wait_all(self, handles, timeout: float | None = None) -> None:
        """Wait for every one of ``handles`` (each within ``timeout``); backends that can wait for many
        at once override it."""
        for h in handles:
            h.wait(timeout)

    def irecv_upto(self, buf: torch.Tensor, peer: int, tag: int) -> Handle:
        """A receive that a message shorter than ``buf`` completes too (fills its front); only where
        ``capabilities.partial_receive``."""
        raise NotImplementedError(f"the {self.name} transport has no partial receives "
                                  "(capabilities.partial_receive is False)")

    def small_round(self, record: bytes, payload: torch.Tensor | None, timeout: float | None) -> int:
        """One round of the world's mailbox (see :class:`~ringlet.transport.shm.ShmTransport`); only where
        ``capabilities.small_path == "mailbox"``."""
        raise NotImplementedError(f"the {self.name} transport has no mailbox (capabilities.small_path is "
                                  f"{self.capabilities.small_path!r})")

    def on_new_group(self, group_id: int, ranks: tuple[int, ...]) -> None:
        """The backend's step for a new group of global ``ranks`` (``capabilities.group_setup``); every
        rank calls it in the same order. Nothing by default."""
        return None


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
