"""Requests and replies of the job store, after the handshake.

A request is ``op (u8) | count (u32) | count x (length (u32) | bytes)``; a reply is ``status (u8) |
count (u32) | count x (length | bytes)``. Integers are big-endian. Waiting operations carry their
timeout in milliseconds as their first argument (``0``: wait forever).
"""
from __future__ import annotations

import enum
import socket
import struct

from ..security.handshake import recv_exact

MAX_ITEMS = 1 << 16        # arguments or values per message
MAX_BYTES = 256 << 20      # one argument or value


class Op(enum.IntEnum):
    SET = 1
    GET = 2            # timeout, key -> value (waits for the key)
    ADD = 3            # key, delta -> new value
    CHECK = 4          # keys... -> b"1" | b"0"
    WAIT = 5           # timeout, keys...
    COMPARE_SET = 6    # key, expected, desired -> value now
    DELETE = 7         # key -> b"1" | b"0"
    NUM_KEYS = 8       # -> count
    MULTI_GET = 9      # timeout, keys... -> values
    MULTI_SET = 10     # key, value, key, value...
    APPEND = 11        # key, value
    PING = 12


class Status(enum.IntEnum):
    OK = 0
    TIMEOUT = 1
    ERROR = 2


_HEAD = struct.Struct("!BI")
_LEN = struct.Struct("!I")


def send(sock: socket.socket, code: int, items) -> None:
    """Send one message: ``code`` and ``items`` (bytes-like)."""
    parts = [_HEAD.pack(code, len(items))]
    for it in items:
        parts.append(_LEN.pack(len(it)))
        parts.append(bytes(it))
    sock.sendall(b"".join(parts))


def receive(sock: socket.socket) -> tuple[int, list[bytes]]:
    """Receive one message; ``ValueError`` when it breaks the limits (the connection is then dropped)."""
    code, count = _HEAD.unpack(recv_exact(sock, _HEAD.size))
    if count > MAX_ITEMS:
        raise ValueError(f"message of {count} items")
    items = []
    for _ in range(count):
        (n,) = _LEN.unpack(recv_exact(sock, _LEN.size))
        if n > MAX_BYTES:
            raise ValueError(f"item of {n} bytes")
        items.append(recv_exact(sock, n))
    return code, items


def encode(value) -> bytes:
    """str -> UTF-8, bytes-like -> bytes, int -> decimal text (as torch's store keeps counters)."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int):
        return str(value).encode()
    return bytes(value)
