"""The job store's server: a thread per connection, each one authenticated before it may do anything."""
from __future__ import annotations

import logging
import socket
import threading
import time

from ..security.handshake import AuthError, server_handshake
from ..security.strangers import note_stranger
from .protocol import Op, Status, encode, receive, send

log = logging.getLogger(__name__)
MAX_PENDING = 64  # connections still in their handshake; more are closed at once


class _Data:
    """The key-value map and the condition waiting operations sleep on."""

    def __init__(self) -> None:
        self.kv: dict[bytes, bytes] = {}
        self.cond = threading.Condition()

    def wait_for(self, keys, timeout_ms: int) -> bool:
        deadline = None if timeout_ms == 0 else time.monotonic() + timeout_ms / 1000.0
        with self.cond:
            while not all(k in self.kv for k in keys):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(left)
            return True


def _execute(data: _Data, op: int, a: list[bytes]) -> tuple[int, list[bytes]]:
    kv, cond = data.kv, data.cond
    if op in (Op.GET, Op.WAIT, Op.MULTI_GET):
        keys = a[1:]
        if not data.wait_for(keys, int(a[0])):
            return Status.TIMEOUT, []
        with cond:
            return Status.OK, ([kv[k] for k in keys] if op != Op.WAIT else [])
    with cond:
        if op == Op.SET:
            kv[a[0]] = a[1]
        elif op == Op.MULTI_SET:
            for i in range(0, len(a) - 1, 2):
                kv[a[i]] = a[i + 1]
        elif op == Op.ADD:
            v = int(kv.get(a[0], b"0")) + int(a[1])
            kv[a[0]] = encode(v)
            return Status.OK, [kv[a[0]]]
        elif op == Op.APPEND:
            kv[a[0]] = kv.get(a[0], b"") + a[1]
        elif op == Op.COMPARE_SET:
            cur = kv.get(a[0])
            if (cur is None and a[1] == b"") or cur == a[1]:
                kv[a[0]] = a[2]
            return Status.OK, [kv.get(a[0], a[1])]
        elif op == Op.CHECK:
            return Status.OK, [b"1" if all(k in kv for k in a) else b"0"]
        elif op == Op.DELETE:
            return Status.OK, [b"1" if kv.pop(a[0], None) is not None else b"0"]
        elif op == Op.NUM_KEYS:
            return Status.OK, [encode(len(kv))]
        elif op != Op.PING:
            return Status.ERROR, [f"unknown operation {op}".encode()]
        cond.notify_all()
    return Status.OK, []


class StoreServer:
    """Listen on ``addr:port`` (port 0: the OS picks; ``addr`` ``""``: every interface) and serve the
    store to clients that prove ``secret`` (None: to every client, for jobs without a secret)."""

    def __init__(self, addr: str, port: int = 0, secret: bytes | None = None, *, handshake_timeout: float = 10.0):
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((addr, port))
        self._sock.listen(socket.SOMAXCONN)
        self.address = addr
        self.port = self._sock.getsockname()[1]
        self.secret = secret
        self.refused = 0
        self._timeout = handshake_timeout
        self._data = _Data()
        self._pending = threading.BoundedSemaphore(MAX_PENDING)
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="ringlet-store", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            if not self._pending.acquire(blocking=False):
                self._refuse(conn, peer, "too many connections in their handshake")
                continue
            threading.Thread(target=self._serve, args=(conn, peer), name="ringlet-store-conn", daemon=True).start()

    def _refuse(self, conn: socket.socket, peer, why: str) -> None:
        self.refused += 1
        note_stranger("the job's store", peer, why)
        try:
            conn.close()
        except OSError:
            pass

    def _serve(self, conn: socket.socket, peer) -> None:
        try:
            if self.secret is not None:
                server_handshake(conn, self.secret, self._timeout)
        except AuthError as exc:
            self._refuse(conn, peer, str(exc))
            return
        finally:
            self._pending.release()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._closed:  # closed while this client was proving itself: close() did not see it
                conn.close()
                return
            self._conns.add(conn)
        try:
            while True:
                op, args = receive(conn)
                status, values = _execute(self._data, op, args)
                send(conn, status, values)
        except (OSError, ConnectionError, ValueError) as exc:
            log.debug("store connection from %s ended: %s", peer, exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        """Stop listening and drop every connection, including one still in its handshake."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        try:
            self._sock.close()
        except OSError:
            pass
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
