"""A client of the job store. Standard library only: the per-rank shim may use it without torch."""
from __future__ import annotations

import socket
import threading
import time

from ..security.handshake import AuthError, client_handshake
from .protocol import Op, Status, encode, receive, send


class StoreError(RuntimeError):
    """The store refused a request or could not be reached."""


class StoreTimeout(StoreError, TimeoutError):
    """A key did not appear within the timeout."""


class StoreClient:
    """One connection to the store at ``host:port``, authenticated with ``secret`` (None: the store has
    none). ``timeout``: seconds a waiting operation (get, wait, multi_get) may wait, and the socket's
    timeout beyond it, so a store that stops answering raises instead of hanging. ``connect_timeout``:
    how long to retry connecting while the store is not up yet. Thread-safe (one request at a time)."""

    def __init__(self, host: str, port: int, secret: bytes | None = None, *, timeout: float = 300.0,
                 connect_timeout: float = 60.0):
        self.host, self.port, self.timeout = host, int(port), float(timeout)
        self._secret = secret
        self._lock = threading.Lock()
        self._sock = self._connect(secret, connect_timeout)

    def clone(self) -> "StoreClient":
        """A new connection to the same store (for another thread)."""
        return StoreClient(self.host, self.port, self._secret, timeout=self.timeout, connect_timeout=10.0)

    def _connect(self, secret: bytes | None, connect_timeout: float) -> socket.socket:
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(1.0, min(10.0, connect_timeout)))
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise StoreError(f"cannot reach the job's store at {self.host}:{self.port}: {exc}") from exc
                time.sleep(0.1)
        try:
            if secret is not None:
                client_handshake(sock, secret, timeout=max(10.0, connect_timeout))
        except AuthError:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    # ---- requests -----------------------------------------------------------------------
    def _call(self, op: Op, items, wait: float | None = None) -> list[bytes]:
        with self._lock:
            if self._sock is None:
                raise StoreError("the store client is closed")
            self._sock.settimeout(self.timeout + 5.0 if wait is None else wait + 5.0)
            try:
                send(self._sock, op, [encode(x) for x in items])
                status, values = receive(self._sock)
            except (OSError, ConnectionError, ValueError) as exc:
                self._drop()
                raise StoreError(f"the job's store at {self.host}:{self.port} failed: {exc}") from exc
        if status == Status.TIMEOUT:
            raise StoreTimeout(f"timed out after {self.timeout if wait is None else wait:.0f}s waiting for "
                               f"{[encode(k) for k in items[1:]]} in the job's store")
        if status != Status.OK:
            raise StoreError(values[0].decode(errors="replace") if values else "store error")
        return values

    def _drop(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
        self._sock = None

    def _ms(self, timeout: float | None) -> int:
        t = self.timeout if timeout is None else timeout
        return max(1, int(t * 1000)) if t > 0 else 0

    def set(self, key, value) -> None:
        self._call(Op.SET, [key, value])

    def get(self, key, timeout: float | None = None) -> bytes:
        return self._call(Op.GET, [self._ms(timeout), key], timeout)[0]

    def add(self, key, delta: int) -> int:
        return int(self._call(Op.ADD, [key, int(delta)])[0])

    def append(self, key, value) -> None:
        self._call(Op.APPEND, [key, value])

    def check(self, keys) -> bool:
        return self._call(Op.CHECK, list(keys))[0] == b"1"

    def wait(self, keys, timeout: float | None = None) -> None:
        self._call(Op.WAIT, [self._ms(timeout), *keys], timeout)

    def compare_set(self, key, expected, desired) -> bytes:
        return self._call(Op.COMPARE_SET, [key, expected, desired])[0]

    def delete_key(self, key) -> bool:
        return self._call(Op.DELETE, [key])[0] == b"1"

    def num_keys(self) -> int:
        return int(self._call(Op.NUM_KEYS, [])[0])

    def multi_get(self, keys, timeout: float | None = None) -> list[bytes]:
        return self._call(Op.MULTI_GET, [self._ms(timeout), *keys], timeout)

    def multi_set(self, keys, values) -> None:
        items = []
        for k, v in zip(keys, values):
            items += [k, v]
        self._call(Op.MULTI_SET, items)

    def ping(self) -> None:
        self._call(Op.PING, [])

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._drop()
