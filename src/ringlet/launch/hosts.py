"""Host lists: which entries are this machine, how ranks fill them, which address the store binds to."""
from __future__ import annotations

import socket

from .config import LaunchError
from ..layout import parse_hosts

_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}
LOOPBACK = "127.0.0.1"


def is_local_host(name: str) -> bool:
    """True when ``name`` designates this machine (without any network lookup beyond /etc/hosts)."""
    if name in _LOCAL_NAMES or name.startswith("127."):
        return True
    me = {socket.gethostname(), socket.getfqdn()}
    if name in me or name.split(".")[0] == socket.gethostname().split(".")[0]:
        return True
    try:
        addr = socket.gethostbyname(name)
    except OSError:
        return False
    if addr.startswith("127."):
        return True
    try:
        return addr in socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        return False


def free_port(addr: str = LOOPBACK) -> int:
    """A TCP port free on ``addr`` right now (another process may take it before it is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def hosts_spec(hosts) -> str:
    """``[("h1", 4), ("h2", 2)]`` → ``"h1:4,h2:2"``."""
    return ",".join(f"{h}:{n}" for h, n in hosts)


def parse_host_list(hosts) -> tuple[tuple[str, int], ...]:
    """``"h1:4,h2:2"`` or ``[("h1", 4), ...]`` → a tuple of (name, slots); ``LaunchError`` when malformed."""
    try:
        if isinstance(hosts, str):
            return tuple(parse_hosts(hosts))
        return tuple((str(h), int(n)) for h, n in hosts)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None


def fit_hosts(hosts: tuple[tuple[str, int], ...], np: int | None) -> tuple[tuple[str, int], ...]:
    """Fill host slots in order up to ``np`` ranks (all slots when ``np`` is None)."""
    total = sum(n for _, n in hosts)
    if np is None:
        return hosts
    if np > total:
        raise LaunchError(f"-np {np} exceeds the {total} slots of --hosts {hosts_spec(hosts)}.")
    out, left = [], np
    for h, n in hosts:
        if left <= 0:
            break
        out.append((h, min(n, left)))
        left -= min(n, left)
    return tuple(out)


def single_host(hosts) -> bool:
    """True when the job runs on this machine as one host (no host list, or one entry naming this machine)."""
    return hosts is None or (len(hosts) == 1 and is_local_host(hosts[0][0]))


def store_bind_address(master_addr: str, hosts) -> str:
    """The address node 0's store listens on: the address the hosts reach it at (``master_addr``
    resolved here), so a job whose hosts are all this machine listens on loopback only. When that
    address is a loopback one but some hosts are other machines (a name that /etc/hosts maps to
    127.0.1.1, say), it listens on every interface (``""``), or they could not reach it."""
    try:
        addr = socket.gethostbyname(master_addr)
    except OSError as exc:
        raise LaunchError(f"Cannot resolve the rendezvous address {master_addr!r}: {exc}") from None
    if addr.startswith("127.") and not all(is_local_host(h) for h, _ in hosts):
        return ""
    return addr
