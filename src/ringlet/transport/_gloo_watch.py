"""Strangers on this process's Gloo listeners, found after the groups were authenticated.

Gloo keeps a listener open for the life of every process group and accepts whatever connects to it;
a connection that arrives after the group is complete is parked (or read until it sends 8 bytes)
and never used, so it cannot disturb the job, but nothing reports it either. :func:`check_strangers`
lists this process's connections to the listeners of authenticated groups (``/proc/net/tcp`` rows
whose inode is one of this process's descriptors) and compares each with the endpoints the group's
authenticated peers said they connect from (:mod:`._gloo_auth`). Every other one is a stranger: it is
reported once through :func:`ringlet.security.note_stranger` (endpoint ``"transport"``) and refused
by shutting the connection down in both directions. The descriptor stays Gloo's (closing it behind
Gloo's back could close an unrelated file that reused the number later); Gloo drops a connection it
is still reading from as soon as it sees the shutdown, and never uses a parked one.

A connection Gloo accepts is a new socket descriptor of this process, so the TCP table (milliseconds of
kernel time to list) is read only when the set of this process's sockets changed since the last check.
"""
from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, field

from ..security import note_stranger
from ._gloo_endpoints import LISTEN, TIME_WAIT, Endpoint, own_connections, socket_inodes


@dataclass
class _Listener:
    endpoint: Endpoint
    legit: set = field(default_factory=set)


class StrangerWatch:
    """The listeners of this process's authenticated Gloo groups, and who may be connected to them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[int, _Listener] = {}  # listener inode -> record
        self._seen: set[int] = set()                # inodes of strangers already reported
        self._sockets: frozenset[int] | None = None  # this process's socket inodes at the last table read

    def add(self, listeners: dict[int, Endpoint], legit: set) -> None:
        """Watch ``listeners`` (inode -> local endpoint); ``legit``: the remote endpoints of the group's
        authenticated peers."""
        with self._lock:
            for inode, ep in listeners.items():
                self._listeners[inode] = _Listener(ep, set(legit))
            self._sockets = None  # read the table at the next check

    def forget(self) -> None:
        with self._lock:
            self._listeners.clear()
            self._seen.clear()
            self._sockets = None

    def watched(self) -> list[Endpoint]:
        with self._lock:
            return [rec.endpoint for rec in self._listeners.values()]

    def check(self, refuse: bool = True) -> list[Endpoint]:
        """Report (and with ``refuse`` shut down) every connection to a watched listener that is not an
        authenticated peer's; return the remote endpoints reported by this call."""
        inodes = socket_inodes()
        with self._lock:
            sockets = frozenset(inodes)
            if not self._listeners or sockets == self._sockets:
                return []  # nothing watched, or no socket came or went since the table was last read
            self._sockets = sockets
        rows = own_connections(inodes)
        with self._lock:
            live = {c.inode for c, _ in rows if c.state == LISTEN}
            for inode in [i for i in self._listeners if i not in live]:
                del self._listeners[inode]  # the group was destroyed
            by_endpoint = {rec.endpoint: rec for rec in self._listeners.values()}
            found = []
            for conn, fd in rows:
                rec = by_endpoint.get(conn.local)
                if rec is None or conn.state in (LISTEN, TIME_WAIT) or conn.remote in rec.legit:
                    continue
                if conn.inode in self._seen:
                    continue
                self._seen.add(conn.inode)
                found.append((conn, fd))
        out = []
        for conn, fd in found:
            note_stranger("transport", conn.remote,
                          f"it connected to Gloo listener {conn.local[0]}:{conn.local[1]} but is not one of "
                          "the job's authenticated peers")
            if refuse:
                _shut(fd, conn.inode)
            out.append(conn.remote)
        return out


def _shut(fd: int, inode: int) -> None:
    """Shut down the connection on ``fd`` if the descriptor still refers to socket ``inode``."""
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != f"socket:[{inode}]":
            return
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    with s:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


watch = StrangerWatch()


def check_strangers() -> list[Endpoint]:
    """New connections to this process's Gloo listeners that are not the job's authenticated peers:
    each is logged once (``ringlet.security.note_stranger``) and shut down. Returns their remote
    addresses (``(ip, port)``); empty when the job has no secret (nothing was authenticated) or off
    Linux. Cheap enough to call every second: a listing of ``/proc/self/fd``, and ``/proc/net/tcp``
    only after a socket came or went."""
    return watch.check()
