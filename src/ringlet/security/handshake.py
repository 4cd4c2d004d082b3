"""Mutual challenge-response on a connected stream socket, before any other byte is trusted.

::

    server -> client   MAGIC, server nonce Ns
    client -> server   client nonce Nc, HMAC(secret, "ringlet-client", Ns, Nc)
    server -> client   HMAC(secret, "ringlet-server", Nc, Ns)

Each side sends a fresh nonce and checks the other's answer, so neither a replayed answer nor a
server that does not hold the secret is accepted. A side that fails to prove itself gets the
connection closed and :class:`AuthError` on the other side; nothing it sent is interpreted.
"""
from __future__ import annotations

import contextlib
import socket

from .secret import MAC_BYTES, NONCE_BYTES, new_nonce, prove, verify

MAGIC = b"RGLAUTH1"
CLIENT_ROLE = b"ringlet-client"
SERVER_ROLE = b"ringlet-server"


class AuthError(ConnectionError):
    """The other end of a connection did not prove it holds the job's secret (or spoke another protocol)."""


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock``; ``ConnectionError`` when it closes first."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


@contextlib.contextmanager
def _exchange(sock: socket.socket, timeout: float, broke_off: str):
    """Run one side of the handshake under ``timeout``: socket errors become :class:`AuthError`
    (``broke_off`` says whose), and the socket's own timeout is restored afterwards."""
    old = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        yield
    except AuthError:
        raise
    except (OSError, ConnectionError) as exc:
        raise AuthError(f"{broke_off}: {exc}") from exc
    finally:
        sock.settimeout(old)


def server_handshake(sock: socket.socket, secret: bytes, timeout: float = 10.0) -> None:
    """Authenticate the client on ``sock`` (the server's side); raise :class:`AuthError` if it fails.
    The socket's own timeout is restored afterwards."""
    with _exchange(sock, timeout, "the client broke off the handshake"):
        ns = new_nonce()
        sock.sendall(MAGIC + ns)
        reply = recv_exact(sock, NONCE_BYTES + MAC_BYTES)
        nc, answer = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
        if not verify(secret, answer, CLIENT_ROLE, ns, nc):
            raise AuthError("the client did not prove the job's secret")
        sock.sendall(prove(secret, SERVER_ROLE, nc, ns))


def client_handshake(sock: socket.socket, secret: bytes, timeout: float = 10.0) -> None:
    """Authenticate to the server on ``sock`` and check that it holds the secret too; raise
    :class:`AuthError` if either fails."""
    with _exchange(sock, timeout, "the server refused the job's secret or broke off the handshake"):
        hello = recv_exact(sock, len(MAGIC) + NONCE_BYTES)
        if hello[:len(MAGIC)] != MAGIC:
            raise AuthError("the server does not speak ringlet's authenticated protocol")
        ns, nc = hello[len(MAGIC):], new_nonce()
        sock.sendall(nc + prove(secret, CLIENT_ROLE, ns, nc))
        if not verify(secret, recv_exact(sock, MAC_BYTES), SERVER_ROLE, nc, ns):
            raise AuthError("the server did not prove the job's secret")
