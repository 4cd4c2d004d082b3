"""The TCP sockets a backend opened inside this process, found through ``/proc/self/fd`` (Linux).

Gloo keeps its connections to itself: no Python call interrupts a blocked ``wait()`` on them, and a
link that was cut without a reset leaves them open for as long as the kernel retries. Knowing which
descriptors Gloo created (those that appear while a process group is being made) lets a rank shut
them down when a peer is declared silent, so that every pending operation fails at once, as it would
if the peer had crashed. Listening sockets are never touched (Gloo treats an error on its listener as
fatal to the process).
"""
from __future__ import annotations

import os
import socket

_FD_DIR = "/proc/self/fd"


def socket_fds() -> dict[int, str]:
    """This process's socket descriptors: fd -> ``"socket:[inode]"`` (empty off Linux)."""
    out: dict[int, str] = {}
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"{_FD_DIR}/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out[int(name)] = target
    return out


class SocketSet:
    """Sockets opened between :meth:`before` and :meth:`after`, by whatever ran in between."""

    def __init__(self) -> None:
        self.owned: dict[int, str] = {}
        self._before: dict[int, str] = {}

    def before(self) -> None:
        self._before = socket_fds()

    def after(self) -> None:
        for fd, ident in socket_fds().items():
            if self._before.get(fd) != ident:
                self.owned[fd] = ident
        self._before = {}

    def _still_ours(self, fd: int, ident: str) -> bool:
        try:
            return os.readlink(f"{_FD_DIR}/{fd}") == ident
        except OSError:
            return False

    def listening(self) -> list[tuple[int, tuple]]:
        """(fd, local address) of the owned sockets that listen (the backend's endpoints)."""
        out = []
        for fd, ident in self.owned.items():
            if not self._still_ours(fd, ident):
                continue
            with socket.socket(fileno=os.dup(fd)) as s:
                try:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                        out.append((fd, s.getsockname()))
                except OSError:
                    pass
        return out

    def shutdown_connections(self) -> int:
        """Shut down (both directions) every owned connected socket still open; return how many.
        The descriptors stay open: the backend notices the shutdown and closes them itself."""
        count = 0
        for fd, ident in list(self.owned.items()):
            if not self._still_ours(fd, ident):
                continue
            try:
                s = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            with s:
                try:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                        continue
                    s.shutdown(socket.SHUT_RDWR)
                    count += 1
                except OSError:
                    pass
        return count
