"""Socket checks across emulated hosts: connectivity after ``up``, and the rate a capped link gives.

A socket belongs to the network namespace in which it was created, and a thread may switch its own
namespace with ``setns`` without affecting the others. So one process can open a listener "on" host
B and a client "on" host A (each from a short-lived thread that entered the namespace) and move
bytes between them: no helper processes, every wait bounded by a timeout.
"""
from __future__ import annotations

import ctypes
import os
import socket
import threading
import time
from dataclasses import dataclass

from .netns import netns_file
from .state import ClusterError, ClusterState

CLONE_NEWNET = 0x40000000
CHUNK = 1 << 20


def in_netns(ns: str, fn):
    """``fn()`` called in a thread that has entered network namespace ``ns``; returns its result."""
    path = str(netns_file(ns))
    out: dict = {}

    def body():
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {ns} failed")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            out["error"] = exc

    t = threading.Thread(target=body, name=f"netns-{ns}")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _listener(addr: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 0))
    s.listen(8)
    return s


def connectivity(state: ClusterState, timeout: float = 3.0) -> list[str]:
    """Problems found connecting the first host to every other one and back (empty: all reachable).
    Catches, e.g., a host firewall that filters bridged traffic (br_netfilter with a DROP policy)."""
    problems = []
    first = state.hosts[0]
    for other in state.hosts[1:]:
        for a, b in ((first, other), (other, first)):
            srv = in_netns(b.netns, lambda b=b: _listener(b.addr))
            try:
                port = srv.getsockname()[1]
                try:
                    c = in_netns(a.netns, lambda: socket.create_connection((b.addr, port), timeout=timeout))
                    c.close()
                except OSError as exc:
                    problems.append(f"{a.name} cannot reach {b.name} ({b.addr}:{port}): {exc}")
            finally:
                srv.close()
    return problems


@dataclass(frozen=True)
class FlowResult:
    src: str
    dst: str
    nbytes: int
    seconds: float

    @property
    def mbytes_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


def _receive(srv: socket.socket, timeout: float) -> tuple[int, float]:
    """Accept one flow on ``srv`` and read it to its end: (bytes after the first read, seconds from the
    first read to the last)."""
    conn, _ = srv.accept()
    with conn:
        conn.settimeout(timeout)
        buf, n, t0, t1 = bytearray(CHUNK), 0, None, None
        while True:
            k = conn.recv_into(buf)
            if not k:
                break
            t1 = time.perf_counter()
            if t0 is None:
                t0 = t1
            else:
                n += k  # bytes after the first read: paired with the elapsed time
    return n, (t1 - t0) if t0 else 0.0


def _send(c: socket.socket, seconds: float, max_bytes: int) -> None:
    """Send zeros on ``c`` for ``seconds`` or ``max_bytes``, whichever comes first, then end the flow."""
    data, sent = memoryview(bytes(CHUNK)), 0
    end = time.perf_counter() + seconds
    while sent < max_bytes and time.perf_counter() < end:
        c.sendall(data)
        sent += CHUNK
    c.shutdown(socket.SHUT_WR)


def _run_flows(flows, servers, clients, seconds: float, max_bytes: int, timeout: float) -> list[FlowResult]:
    """One receiving and one sending thread per flow, all at once; each thread's wait is bounded."""
    results: list[FlowResult | None] = [None] * len(flows)
    errors: list[BaseException] = []

    def recv(i: int) -> None:
        try:
            n, sec = _receive(servers[i], timeout)
            results[i] = FlowResult(flows[i][0].name, flows[i][1].name, n, sec)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def send(i: int) -> None:
        try:
            _send(clients[i], seconds, max_bytes)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    for s in servers:
        s.settimeout(timeout)
    threads = [threading.Thread(target=recv, args=(i,)) for i in range(len(flows))]
    threads += [threading.Thread(target=send, args=(i,)) for i in range(len(flows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 2 * timeout)
    if errors:
        raise ClusterError(f"link test failed: {errors[0]}")
    if any(r is None for r in results):
        raise ClusterError("link test did not finish in time")
    return [r for r in results if r is not None]


def parse_flows(flows) -> list[tuple[str, str]]:
    """``["h0:h1", "h2:h0"]`` → ``[("h0", "h1"), ("h2", "h0")]``; ``ClusterError`` for anything else."""
    pairs = [tuple(f.split(":", 1)) for f in flows]
    if any(len(p) != 2 or not all(p) for p in pairs):
        raise ClusterError("Flows are SRC:DST host pairs, e.g. h0:h1.")
    return pairs


def measure(state: ClusterState, pairs: list[tuple[str, str]], seconds: float = 2.0,
            max_bytes: int = 2 << 30, timeout: float = 10.0) -> list[FlowResult]:
    """Run one TCP flow per ``(src, dst)`` host pair at the same time for ``seconds`` (or ``max_bytes``
    per flow) and return what each receiver got per second, timed from its first to its last byte.
    Bounded: every socket operation times out after ``timeout`` seconds."""
    if not 0 < seconds <= 60:
        raise ClusterError("A link test runs between 0 and 60 seconds.")
    flows = [(state.host(s), state.host(d)) for s, d in pairs]
    if any(s.name == d.name for s, d in flows):
        raise ClusterError("A link test needs two different hosts per flow (same-host traffic stays on lo).")
    servers = [in_netns(d.netns, lambda d=d: _listener(d.addr)) for _, d in flows]
    clients = []
    try:
        for (s, d), srv in zip(flows, servers):
            port = srv.getsockname()[1]
            clients.append(in_netns(s.netns, lambda d=d, port=port: socket.create_connection((d.addr, port), timeout)))
        return _run_flows(flows, servers, clients, seconds, max_bytes, timeout)
    finally:
        for c in clients:
            c.close()
        for s in servers:
            s.close()
