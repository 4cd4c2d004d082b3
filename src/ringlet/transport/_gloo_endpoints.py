"""This process's TCP endpoints as the kernel lists them (``/proc/net/tcp``, ``/proc/net/tcp6`` and the
socket inodes of ``/proc/self/fd``), and a fixed-size wire form for short lists of them.

An endpoint is ``(ip, port)`` with ``ip`` in the text form :func:`socket.inet_ntop` gives
(``"127.0.0.1"``, ``"::1"``). On systems without ``/proc`` every listing is empty.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from ._sockets import socket_fds

Endpoint = tuple  # (ip text, port)

LISTEN = 0x0A
TIME_WAIT = 0x06
ENDPOINT_BYTES = 18  # 16 bytes of IPv6 (IPv4 mapped) address, 2 bytes of port


@dataclass(frozen=True)
class Connection:
    """One row of the kernel's TCP table."""

    local: Endpoint
    remote: Endpoint
    state: int
    inode: int


def _endpoint(text: str, family: int) -> Endpoint:
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word of the address in host (little-endian) byte order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return canonical((socket.inet_ntop(family, raw), int(port, 16)))


def canonical(ep: Endpoint) -> Endpoint:
    """``ep`` with an IPv4-mapped IPv6 address written as IPv4 (how the two tables meet)."""
    ip = ipaddress.ip_address(ep[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (str(ip), int(ep[1]))


def tcp_table(inodes=None) -> list[Connection]:
    """The TCP sockets of this network namespace (all processes), IPv4 and IPv6; only those whose inode
    is in ``inodes`` when it is given."""
    rows: list[Connection] = []
    for family, path in ((socket.AF_INET, "/proc/self/net/tcp"), (socket.AF_INET6, "/proc/self/net/tcp6")):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            p = line.split()
            if len(p) < 10 or (inodes is not None and int(p[9]) not in inodes):
                continue
            rows.append(Connection(_endpoint(p[1], family), _endpoint(p[2], family), int(p[3], 16), int(p[9])))
    return rows


def socket_inodes() -> dict[int, int]:
    """This process's socket descriptors: inode -> fd."""
    return {int(target[8:-1]): fd for fd, target in socket_fds().items() if target.startswith("socket:[")}


def own_connections(inodes: dict[int, int] | None = None) -> list[tuple[Connection, int]]:
    """This process's TCP sockets, each with its descriptor; ``inodes``: :func:`socket_inodes`, when the
    caller has just listed them. Costs milliseconds of kernel time whatever the number of sockets (the
    kernel walks its whole connection table for ``/proc/net/tcp``)."""
    inodes = socket_inodes() if inodes is None else inodes
    return [(c, inodes[c.inode]) for c in tcp_table(inodes)]


def pack_endpoints(eps: list[Endpoint], capacity: int) -> bytes:
    """``eps`` as ``1 + capacity * ENDPOINT_BYTES`` bytes: a count (255: more than ``capacity``, the
    list is incomplete), then the entries, zero padded."""
    count = len(eps) if len(eps) <= capacity else 255
    out = bytearray([count])
    for ip, port in list(eps)[:capacity]:
        addr = ipaddress.ip_address(ip)
        out += addr.packed if addr.version == 6 else b"\0" * 10 + b"\xff\xff" + addr.packed
        out += int(port).to_bytes(2, "big")
    return bytes(out.ljust(1 + capacity * ENDPOINT_BYTES, b"\0"))


def unpack_endpoints(raw: bytes, capacity: int) -> tuple[list[Endpoint], bool]:
    """Inverse of :func:`pack_endpoints`: (endpoints, complete)."""
    count = raw[0]
    complete = count != 255
    n = min(count, capacity)
    eps = []
    for i in range(n):
        entry = raw[1 + i * ENDPOINT_BYTES:1 + (i + 1) * ENDPOINT_BYTES]
        ip = ipaddress.IPv6Address(entry[:16])
        eps.append(canonical((str(ip), int.from_bytes(entry[16:], "big"))))
    return eps, complete


def packed_size(capacity: int) -> int:
    return 1 + capacity * ENDPOINT_BYTES
