"""The one small interface every transport implements: non-blocking tagged point-to-point."""
from __future__ import annotations

import abc
import socket
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
    rank: int
    size: int

    @classmethod
    def available(cls) -> bool:
        return True

    @abc.abstractmethod
    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> Handle: ...

    @abc.abstractmethod
    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> Handle: ...

    def close(self) -> None:
        return None

    def hosts(self) -> HostInfo:
        """Hostname of every rank. Transports that can exchange data override; default: one host."""
        return HostInfo(tuple([socket.gethostname()] * self.size))

    # The backend's own collective, the "native" algorithm. Transports without one return False.
    def native_allreduce(self, buf: torch.Tensor, op, ranks: tuple[int, ...]) -> bool:
        return False
