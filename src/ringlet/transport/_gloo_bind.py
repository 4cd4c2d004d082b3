"""Which network interface the Gloo groups ringlet creates listen on.

Gloo picks the address of its listeners when a process group is created: the interfaces named by
``GLOO_SOCKET_IFNAME`` when it is set, otherwise the address this machine's host name resolves to
(often an address every host on the network can reach, even for a job that never leaves the
machine). ringlet narrows that choice while it creates a group, unless ``GLOO_SOCKET_IFNAME`` is
already set (the user's or ``ringlet cluster``'s choice wins):

- a single-host job (``MASTER_ADDR`` is a loopback address, or ``RINGLET_RUN_HOSTS`` names one
  host) listens on the loopback interface only;
- a multi-host job listens on the interface that carries this host's route to ``MASTER_ADDR``: the
  network the hosts share, not every interface of the machine.

When the interface cannot be found (no ``/proc``, an address that is not the primary one of its
interface), Gloo's own choice stands.
"""
from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import socket
import struct

IFNAME_ENV = "GLOO_SOCKET_IFNAME"
_SIOCGIFADDR = 0x8915


def is_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback address (False if it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def local_address_towards(host: str) -> str | None:
    """The source address this machine uses to reach ``host`` (no packet is sent), or None."""
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.connect(addr)
                return s.getsockname()[0].split("%")[0]
        except OSError:
            continue
    return None


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(res[20:24])


def _ipv6_owner(ip: ipaddress.IPv6Address) -> str | None:
    try:
        with open("/proc/net/if_inet6") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        p = line.split()
        if len(p) >= 6 and ipaddress.IPv6Address(bytes.fromhex(p[0])) == ip:
            return p[5]
    return None


def interface_of(address: str) -> str | None:
    """The name of the interface that holds ``address`` (IPv4: its primary address), or None."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.version == 6:
        return _ipv6_owner(ip)
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        if _ipv4_of(name) == str(ip):
            return name
    return None


def single_host(environ) -> bool:
    """True when every rank of the job runs on this machine (see the module docstring)."""
    master = environ.get("MASTER_ADDR", "").strip()
    if master and is_loopback(master):
        return True
    hosts = [h for h in environ.get("RINGLET_RUN_HOSTS", "").split(",") if h.strip()]
    return len(hosts) == 1


def choose_interface(environ) -> str | None:
    """The interface Gloo should listen on for the job ``environ`` describes; None to leave Gloo's choice."""
    if environ.get(IFNAME_ENV, "").strip():
        return None
    if single_host(environ):
        return interface_of("127.0.0.1") or interface_of("::1")
    master = environ.get("MASTER_ADDR", "").strip()
    if not master:
        return None
    local = local_address_towards(master)
    return interface_of(local) if local else None


@contextlib.contextmanager
def gloo_bound(environ=None):
    """Within the block, Gloo groups created by this process listen on :func:`choose_interface`'s
    interface (``GLOO_SOCKET_IFNAME`` is set for the block's duration and restored afterwards)."""
    env = os.environ if environ is None else environ
    name = choose_interface(env)
    if name is None:
        yield None
        return
    previous = os.environ.get(IFNAME_ENV)
    os.environ[IFNAME_ENV] = name
    try:
        yield name
    finally:
        if previous is None:
            os.environ.pop(IFNAME_ENV, None)
        else:
            os.environ[IFNAME_ENV] = previous
