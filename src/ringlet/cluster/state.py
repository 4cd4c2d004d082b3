"""What an emulated cluster is: its spec (what the user asked for) and its state (what ``up`` made).

The state is a small JSON file (:data:`STATE_PATH`) written by ``ringlet cluster up`` and read by
``exec``, ``status``, ``ringlet run --cluster``, ``down`` and by the remote-shell helper
(:mod:`ringlet.cluster._rsh`, which reads the JSON directly so that it starts without importing torch).
Every object the cluster creates is named with :data:`PREFIX`, so ``down`` finds the leftovers of a
crashed run even without the state file.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PREFIX = "rgl-"
BRIDGE = "rgl-br0"
DEFAULT_SUBNET = "10.213.0.0/24"
INTRA_CHOICES = ("shm", "loopback")
# The smallest tbf bucket: more than one GSO packet with its headers (tbf splits a packet larger than its
# bucket, at a high CPU cost: docs/cluster.md).
MIN_BURST = 96 * 1024
# `--burst port`: the smallest bucket that holds the rate, as a switch port passes no more than its rate
# after an idle pause: 200 us of traffic in whole 32 KiB, at least MIN_BURST (96 KiB at 1 Gbit/s,
# 256 KiB at 10 Gbit/s).
PORT = "port"
PORT_SECONDS, PORT_STEP = 200e-6, 32 * 1024
# The host side of each veth is renamed to this inside its namespace (GLOO_SOCKET_IFNAME points at it).
HOST_IFNAME = "eth0"
STATE_DIR = Path("/run/ringlet") if Path("/run").is_dir() else Path("/tmp/ringlet")
STATE_PATH = STATE_DIR / "cluster.json"
ETC_NETNS = Path("/etc/netns")

_UNITS = {  # tc's units: *bit are bits per second, *bps are BYTES per second
    "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
}


class ClusterError(RuntimeError):
    """A cluster operation cannot proceed; the message says what to do."""


def parse_rate(text: str) -> int:
    """``"1gbit"`` → 1_000_000_000 (bits per second). Units as tc spells them: bit, kbit, mbit, gbit,
    tbit (bits/s) and bps, kbps, mbps, gbps (BYTES/s, as in tc). A bare number is bits/s."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = (m.group(2).lower() if m else "") or "bit"
    if not m or unit not in _UNITS:
        raise ValueError(f"Bad link rate {text!r}: use a number and a unit such as 100mbit, 1gbit or 10gbit.")
    bits = float(m.group(1)) * _UNITS[unit]
    if bits < 8000:
        raise ValueError(f"Link rate {text!r} is below 8 kbit/s.")
    return int(bits)


def format_rate(bits: int) -> str:
    """1_000_000_000 → ``"1gbit"`` (tc syntax, exact: falls back to a smaller unit)."""
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits % scale == 0:
            return f"{bits // scale}{unit}"
    return f"{bits}bit"


@dataclass(frozen=True)
class ClusterSpec:
    """What ``ringlet cluster up`` is asked for.

    ``cpus_per_host`` is the CPU quota of each host in CPUs (0.5 = half a core); None means an equal
    share of this machine (``os.cpu_count() / hosts``) and 0 means no quota.
    """

    hosts: int
    ranks_per_host: int = 1
    link: str = "1gbit"
    cpus_per_host: float | None = None
    intra: str = "shm"
    subnet: str = DEFAULT_SUBNET
    cap_ingress: bool = True  # also cap the bridge side of each veth: the host's download
    # bytes of each cap's token bucket; None: 2 ms of traffic, at least 96 KiB; PORT: as a switch port
    burst: int | str | None = None

    def validate(self) -> "ClusterSpec":
        if self.hosts < 1:
            raise ValueError("--hosts must be at least 1.")
        if self.ranks_per_host < 1:
            raise ValueError("--ranks-per-host must be at least 1.")
        parse_rate(self.link)
        if self.cpus_per_host is not None and self.cpus_per_host < 0:
            raise ValueError("--cpus-per-host must be positive (0 = no CPU quota).")
        if isinstance(self.burst, str) and self.burst != PORT:
            raise ValueError(f"--burst must be bytes or {PORT!r}, got {self.burst!r}.")
        if isinstance(self.burst, int) and self.burst < MIN_BURST:
            raise ValueError(f"--burst must be at least {MIN_BURST} bytes (more than one GSO packet: tbf splits "
                             f"a packet larger than its bucket, at a high CPU cost), got {self.burst}.")
        if self.intra not in INTRA_CHOICES:
            raise ValueError(f"--intra must be one of {', '.join(INTRA_CHOICES)}.")
        net = self.network()
        if not net.is_private:
            raise ValueError(f"--subnet {self.subnet} is not a private network (use e.g. {DEFAULT_SUBNET}).")
        if net.num_addresses - 2 < self.hosts:
            raise ValueError(f"--subnet {self.subnet} has room for {net.num_addresses - 2} hosts, not {self.hosts}.")
        return self

    def network(self) -> ipaddress.IPv4Network:
        try:
            return ipaddress.IPv4Network(self.subnet, strict=True)
        except ValueError as exc:
            raise ValueError(f"Bad --subnet {self.subnet!r}: {exc}") from None

    def cpus(self) -> float:
        """The effective CPU quota per host (0 = none)."""
        if self.cpus_per_host is None:
            return round((os.cpu_count() or 1) / self.hosts, 3)
        return float(self.cpus_per_host)

    def rate_bits(self) -> int:
        return parse_rate(self.link)


@dataclass(frozen=True)
class Host:
    index: int
    name: str  # also the network namespace, the UTS hostname and the cgroup name
    addr: str
    veth: str  # bridge side, in the root namespace

    @property
    def netns(self) -> str:
        return self.name


def host_name(i: int) -> str:
    return f"{PREFIX}h{i}"


def plan_hosts(spec: ClusterSpec) -> tuple[Host, ...]:
    """Names and addresses of the hosts of ``spec`` (first usable addresses of the subnet, in order)."""
    addrs = spec.network().hosts()
    return tuple(Host(i, host_name(i), str(next(addrs)), f"{PREFIX}v{i}") for i in range(spec.hosts))


@dataclass(frozen=True)
class ClusterState:
    """A cluster that is up: written by ``up``, read by everything else."""

    spec: ClusterSpec
    hosts: tuple[Host, ...]
    cgroup_version: int | None  # 1, 2, or None when no CPU quota is applied
    cgroup_dir: str | None  # where the rgl-hN groups live (the cpu hierarchy's root)
    cpus: float
    created: float = field(default_factory=time.time)
    pid: int = field(default_factory=os.getpid)  # the `up` process (a foreground `up -- cmd` tears down)
    foreground: bool = False

    def host(self, name: str) -> Host:
        """Look a host up by name (``rgl-h1``), by short name (``h1``) or by index (``1``)."""
        for h in self.hosts:
            if name in (h.name, h.name[len(PREFIX):], str(h.index), h.addr):
                return h
        raise ClusterError(f"No host {name!r} in the cluster; hosts: {', '.join(h.name for h in self.hosts)}.")

    def cgroup_path(self, host: Host) -> str | None:
        return None if self.cgroup_dir is None else os.path.join(self.cgroup_dir, host.name)

    def to_json(self) -> str:
        d = asdict(self)
        d["version"] = 1
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "ClusterState":
        d = json.loads(text)
        d.pop("version", None)
        d["spec"] = ClusterSpec(**d["spec"])
        d["hosts"] = tuple(Host(**h) for h in d["hosts"])
        return cls(**d)


def save(state: ClusterState, path: Path = STATE_PATH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    os.replace(tmp, path)


def load(path: Path = STATE_PATH) -> ClusterState | None:
    """The cluster that is up, or None. A corrupt file is an error that names ``ringlet cluster down``."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return ClusterState.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"The cluster state {path} is unreadable ({exc}); run `ringlet cluster down`.") from None


def require(path: Path = STATE_PATH) -> ClusterState:
    state = load(path)
    if state is None:
        raise ClusterError("No emulated cluster is up. Start one with `ringlet cluster up --hosts N` "
                           "(or run a command in a temporary one: `ringlet cluster up --hosts N -- CMD`).")
    return state


def remove(path: Path = STATE_PATH) -> bool:
    """Delete the state file (and the remote-shell script ``ringlet run --cluster --transport mpi`` writes beside it)."""
    (path.parent / "rsh").unlink(missing_ok=True)
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
