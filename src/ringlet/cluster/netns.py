"""Network plumbing of an emulated cluster: namespaces, a bridge, veth pairs and tbf rate caps.

::

    rgl-h0 [eth0 10.213.0.1, tbf] ==veth== rgl-v0 [tbf] --+
    rgl-h1 [eth0 10.213.0.2, tbf] ==veth== rgl-v1 [tbf] --+-- rgl-br0 (bridge, no address)
    ...

Each host is a network namespace whose only links are ``lo`` (up: torch's stores bind there) and
``eth0``, one end of a veth pair whose other end is a port of the bridge. ``tc tbf`` on ``eth0`` caps
what the host sends (its upload); ``tbf`` on the bridge-side end caps what it receives (its
download), so that a host fed by several peers at once still gets one link's rate, as a real NIC
would. Traffic between two processes of one host never leaves the namespace (it goes over ``lo``).
The bridge has no address and namespaces get no default route: nothing reaches the root namespace
or any other network. Everything is named ``rgl-*`` so that :func:`leftovers` finds it after a crash.

Everything here shells out to iproute2 (``ip``, ``tc``), with a timeout on every call.
"""
from __future__ import annotations

import ipaddress
import json
import math
import shlex
import shutil
import subprocess
from pathlib import Path

from .state import (BRIDGE, ETC_NETNS, HOST_IFNAME, MIN_BURST, PORT, PORT_SECONDS, PORT_STEP, PREFIX, ClusterError,
                    Host, format_rate)

TIMEOUT = 20.0
TBF_LATENCY = "50ms"
NETNS_DIRS = (Path("/run/netns"), Path("/var/run/netns"))


def sh(*argv: str, check: bool = True, timeout: float = TIMEOUT) -> str:
    """Run a command; return stdout. Failure → :class:`ClusterError` quoting the command and stderr."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ClusterError(f"`{argv[0]}` is not installed (ringlet cluster needs iproute2: ip and tc).") from None
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f} s.") from None
    if check and p.returncode != 0:
        raise ClusterError(f"`{shlex.join(argv)}` failed: {p.stderr.strip() or f'exit status {p.returncode}'}")
    return p.stdout


def missing_tools() -> list[str]:
    return [t for t in ("ip", "tc") if shutil.which(t) is None]


def tbf_burst(rate_bits: int, burst: int | str | None = None) -> int:
    """Bucket size in bytes of a tbf cap at ``rate_bits``: ``burst`` bytes if given; :data:`PORT`: the
    smallest bucket that holds the rate (:data:`PORT_SECONDS` of traffic in whole :data:`PORT_STEP`);
    None, the default: 2 ms of traffic, 250 kB at 1 Gbit/s. Never below :data:`MIN_BURST` unless asked
    for in bytes (docs/design.md and docs/cluster.md have the measurements behind these)."""
    if isinstance(burst, int):
        return burst
    if burst == PORT:
        return max(MIN_BURST, math.ceil(rate_bits / 8 * PORT_SECONDS / PORT_STEP) * PORT_STEP)
    return max(MIN_BURST, rate_bits // 8 // 500)


def bucket_text(rate_bits: int, burst: int | str | None) -> str:
    """How a status line names a bucket asked for: '' for the default, else its bytes."""
    if burst is None:
        return ""
    return f"{'port ' if burst == PORT else ''}{tbf_burst(rate_bits, burst)} B buckets"


def tbf_args(rate_bits: int, burst: int | str | None = None) -> list[str]:
    """tc arguments of a cap at ``rate_bits`` with the bucket :func:`tbf_burst` gives for ``burst``."""
    size = tbf_burst(rate_bits, burst)
    return ["tbf", "rate", format_rate(rate_bits), "burst", str(size), "latency", TBF_LATENCY]


def set_rate(host: Host, rate_bits: int, cap_ingress: bool, burst: int | str | None = None) -> None:
    """Re-shape a live host's caps to ``rate_bits`` (``tc qdisc change``: connections stay up)."""
    sh("tc", "-n", host.netns, "qdisc", "change", "dev", HOST_IFNAME, "root", *tbf_args(rate_bits, burst))
    if cap_ingress:
        sh("tc", "qdisc", "change", "dev", host.veth, "root", *tbf_args(rate_bits, burst))


def overlapping_routes(network) -> list[str]:
    """Routes of the root namespace that overlap ``network`` (the cluster would shadow or be shadowed)."""
    out = []
    for r in json.loads(sh("ip", "-j", "-4", "route", "show") or "[]"):
        dst = r.get("dst", "")
        if dst in ("", "default"):
            continue
        try:
            if ipaddress.IPv4Network(dst, strict=False).overlaps(network):
                out.append(f"{dst} dev {r.get('dev', '?')}")
        except ValueError:
            continue
    return out


def create_bridge() -> None:
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "link", "set", BRIDGE, "up")


def create_host(host: Host, prefixlen: int, rate_bits: int, cap_ingress: bool, hosts_file: str,
                burst: int | str | None = None) -> None:
    """Namespace, veth into the bridge, address, loopback, rate caps and /etc/netns/NAME/hosts."""
    ns = host.netns
    sh("ip", "netns", "add", ns)
    # IPv6 off before any link is up: no link-local chatter, and address lookups give the IPv4 address.
    for key in ("all", "default"):
        sh("ip", "netns", "exec", ns, "sh", "-c", f"echo 1 > /proc/sys/net/ipv6/conf/{key}/disable_ipv6", check=False)
    sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", HOST_IFNAME, "netns", ns)
    sh("ip", "link", "set", host.veth, "master", BRIDGE)
    sh("ip", "link", "set", host.veth, "up")
    sh("ip", "-n", ns, "addr", "add", f"{host.addr}/{prefixlen}", "dev", HOST_IFNAME)
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", ns, "link", "set", HOST_IFNAME, "up")
    sh("tc", "-n", ns, "qdisc", "add", "dev", HOST_IFNAME, "root", *tbf_args(rate_bits, burst))
    if cap_ingress:
        sh("tc", "qdisc", "add", "dev", host.veth, "root", *tbf_args(rate_bits, burst))
    # `ip netns exec` bind-mounts /etc/netns/NAME/* over /etc/*: names of the hosts resolve inside.
    d = ETC_NETNS / ns
    d.mkdir(parents=True, exist_ok=True)
    (d / "hosts").write_text(hosts_file)
    nss = nsswitch_files_only()
    if nss is not None:
        (d / "nsswitch.conf").write_text(nss)


def nsswitch_files_only(path: Path = Path("/etc/nsswitch.conf")) -> str | None:
    """This machine's nsswitch.conf with host lookups from files only. A host has no DNS server (no route
    out): a DNS lookup would fail as "temporary failure", which makes glibc's getnameinfo fail instead of
    answering with the numeric address (torch's stores then warn on every connection)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None  # no file to bind over (e.g. musl): nothing to change
    out = [("hosts:          files" if ln.split(":", 1)[0].strip() == "hosts" else ln) for ln in lines]
    if not any(ln.startswith("hosts:") for ln in out):
        out.append("hosts:          files")
    return "\n".join(out) + "\n"


def hosts_file(hosts: tuple[Host, ...]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h.addr}\t{h.name}" for h in hosts]
    return "\n".join(lines) + "\n"


def netns_file(ns: str) -> Path:
    for d in NETNS_DIRS:
        if (d / ns).exists():
            return d / ns
    raise ClusterError(f"network namespace {ns} does not exist (the cluster is down; run `ringlet cluster up`)")


def list_netns(prefix: str = PREFIX) -> list[str]:
    names = set()
    for d in NETNS_DIRS:
        try:
            names.update(p.name for p in d.iterdir() if p.name.startswith(prefix))
        except OSError:
            continue
    return sorted(names)


def list_links(prefix: str = PREFIX) -> list[str]:
    """Links of the root namespace named ``prefix*`` (the bridge and veth ends)."""
    try:
        links = json.loads(sh("ip", "-j", "link", "show") or "[]")
    except (ClusterError, ValueError):
        return []
    return sorted(link["ifname"] for link in links if link.get("ifname", "").startswith(prefix))


def list_etc(prefix: str = PREFIX) -> list[Path]:
    try:
        return sorted(p for p in ETC_NETNS.iterdir() if p.name.startswith(prefix))
    except OSError:
        return []


def netns_pids(ns: str) -> list[int]:
    out = sh("ip", "netns", "pids", ns, check=False)
    return [int(x) for x in out.split() if x.isdigit()]


def delete_netns(ns: str) -> None:
    sh("ip", "netns", "del", ns)


def delete_link(name: str) -> None:
    # Deleting one end of a veth deletes both; the second call then finds nothing.
    sh("ip", "link", "del", name, check=False)


def remove_etc(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def qdisc_rate(dev: str, ns: str | None = None) -> str | None:
    """The tbf rate on ``dev`` as tc prints it (e.g. ``"1Gbit"``), or None if it has no tbf."""
    argv = ["tc"] + (["-n", ns] if ns else []) + ["-j", "qdisc", "show", "dev", dev]
    try:
        for q in json.loads(sh(*argv) or "[]"):
            if q.get("kind") == "tbf":
                rate = q.get("options", {}).get("rate")
                return format_rate(int(rate) * 8) if isinstance(rate, int) else str(rate)
    except (ClusterError, ValueError):
        return None
    return None
