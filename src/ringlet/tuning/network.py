"""The modelled network: the one table of constants (α, β per link class; γ) and the links a transfer
crosses. The cost model (:mod:`ringlet.tuning.cost`) and the simulator (:mod:`ringlet.sim`) both read
it; calibration (:mod:`ringlet.tuning.calibrate`) fills it from measurements.

Topology. Ranks sit on hosts (``host_of[r]``). Every rank has a full-duplex port into its host's
fabric: a transfer between two ranks of one host is of class ``intra`` and crosses the sender's
*out* port and the receiver's *in* port. Every host has one full-duplex uplink to a non-blocking
switch: a transfer between hosts is of class ``inter`` and crosses the sending host's *up* link and
the receiving host's *down* link (the ranks' ports are not counted again). A link carrying ``k``
transfers at once gives each ``1/k`` of its bandwidth. This is the emulated cluster's shape (one
rate-limited veth per host, loopback or shared memory inside) and a fat-tree's first-order shape.

Costs. A message of ``b`` bytes over class ``c`` alone on its links takes ``alpha[c] + b·beta[c]``
seconds; reducing ``b`` bytes into a buffer takes ``b·gamma`` (float32 sum; other dtypes scale by
bytes). ``alpha`` is everything per message (wire latency plus software), ``beta`` is 1/bandwidth as
seen by the collective, so calibrated values already contain protocol overheads. ``op`` is what one
collective call costs beyond its steps (choosing, compiling, scaling: software, whatever the size), and
``check`` what the metadata agreement of a checked call adds; both are per call, not per message, so
they shift every algorithm alike and never change a choice, only the predicted time.

CPU. ``epsilon`` is the processor time of one message endpoint (posting a send or a receive of one
segment and completing it). A rank handles its endpoints of a step one after another; ``cpus`` says
which ranks also share processors for it (:class:`Cpus`): none (``rank``), the ranks of one host
(``host``) or every rank of the job (``machine``: hosts emulated on one machine). A step's transfer
pays ``epsilon`` times the *load* of the busier of its two ends: the most endpoints one rank has in
the step, or the endpoints of its sharing scope divided by ``cpus.cores``, whichever is larger. This
is what makes a rank that sends to many peers at once (``direct``) pay for each message, and, on an
emulated cluster, a step in which every rank works dearer than one in which two do. ``kappa`` is the
processor time per byte at a message endpoint (copies and protocol work), counted with the same load:
a transfer of ``b`` bytes moves at the slower of its links' share (``b·beta·flows``) and its busier
end's processors (``b·kappa·load``). Where processors are plentiful the links bind and ``kappa`` changes
nothing; where many ranks share few cores (hosts emulated on one machine) it is what binds.
``kappa_inter`` prices the endpoints of transfers between hosts when they cost the processors more per
byte than those within a host (a longer kernel path: bridges, shapers); unset, it is ``kappa``. The
load is then weighted: ``kappa`` per endpoint of an intra-host transfer, ``kappa_inter`` per endpoint
of an inter-host one.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

INTRA, INTER = "intra", "inter"
LINK_CLASSES = (INTRA, INTER)
SCOPES = ("rank", "host", "machine")  # who shares the processors that handle messages (Cpus.scope)


@dataclass(frozen=True, slots=True)
class LinkCost:
    """One link class: ``alpha`` seconds per message, ``beta`` seconds per byte."""

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        if not (self.alpha >= 0 and self.beta >= 0 and math.isfinite(self.alpha) and math.isfinite(self.beta)):
            raise ValueError(f"alpha and beta must be finite and >= 0, got {self.alpha}, {self.beta}")

    @property
    def gbit(self) -> float:
        """Bandwidth in Gbit/s (inf for beta 0)."""
        return math.inf if self.beta == 0 else 8e-9 / self.beta


@dataclass(frozen=True, slots=True)
class Cpus:
    """Who shares the processors that handle message endpoints: ``scope`` ``"rank"`` (nobody: each rank
    only serialises its own), ``"host"`` (the ranks of one host share ``cores``) or ``"machine"`` (every
    rank of the job shares ``cores``: hosts emulated on one machine)."""

    scope: str = "rank"
    cores: float = 1.0

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"cpus scope must be one of {SCOPES}, got {self.scope!r}")
        if not (self.cores > 0 and math.isfinite(self.cores)):
            raise ValueError(f"cpus cores must be finite and > 0, got {self.cores}")

    def load(self, ends: np.ndarray) -> np.ndarray:
        """Endpoint loads from :meth:`Topology.endpoints` columns (rank, host, job): a rank's own, or
        its scope's divided by ``cores`` where that is more."""
        if self.scope == "rank":
            return ends[..., 0]
        return np.maximum(ends[..., 0], ends[..., 1 if self.scope == "host" else 2] / self.cores)


@dataclass(frozen=True)
class Network:
    """The constants table: axes are link class (``intra``, ``inter``) × (``alpha``, ``beta``), and
    ``gamma`` (s/B), ``op`` (s per collective call), ``check`` (s per metadata agreement), ``epsilon``
    (s per message endpoint) and ``kappa`` (s per byte at a message endpoint) with ``cpus`` (who shares
    the processors handling them)."""

    links: Mapping[str, LinkCost]
    gamma: float = 0.0
    op: float = 0.0
    check: float = 0.0
    epsilon: float = 0.0
    cpus: Cpus = Cpus()
    kappa: float = 0.0
    kappa_inter: float | None = None

    def __post_init__(self) -> None:
        missing = [c for c in LINK_CLASSES if c not in self.links]
        if missing:
            raise ValueError(f"network lacks link classes {missing}")
        for name in ("gamma", "op", "check", "epsilon", "kappa", "kx"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")

    @property
    def kx(self) -> float:
        """The processors' time per byte at an endpoint of an inter-host transfer (``kappa_inter``, else
        ``kappa``)."""
        return self.kappa if self.kappa_inter is None else self.kappa_inter

    def weighted_ends(self, ends: np.ndarray, inter_ends: np.ndarray) -> np.ndarray:
        """Endpoint columns (:meth:`Topology.endpoints`) priced per byte: ``kappa`` per endpoint,
        ``kappa_inter`` instead for those of inter-host transfers (``inter_ends``: the same columns
        counting only those); :meth:`Cpus.load` of the result is a transfer's processor time per byte."""
        if self.kappa_inter is None:
            return self.kappa * ends
        return self.kappa * ends + (self.kappa_inter - self.kappa) * inter_ends

    def __getitem__(self, cls: str) -> LinkCost:
        return self.links[cls]

    @staticmethod
    def of(*, link: str | float, latency: str | float, intra_link: str | float | None = None,
           intra_latency: str | float | None = None, gamma: float = 0.0) -> "Network":
        """From rates and latencies (``"100gbit"``, ``"2us"`` or numbers in bit/s and seconds). Without
        ``intra_link`` the intra-host class gets 4× the inter rate; without ``intra_latency``, 1/4 the latency."""
        beta = 8.0 / parse_rate(link)
        alpha = parse_time(latency)
        intra_beta = beta / 4 if intra_link is None else 8.0 / parse_rate(intra_link)
        intra_alpha = alpha / 4 if intra_latency is None else parse_time(intra_latency)
        return Network({INTRA: LinkCost(intra_alpha, intra_beta), INTER: LinkCost(alpha, beta)}, gamma)

    def to_dict(self) -> dict:
        return {"links": {c: asdict(self.links[c]) for c in LINK_CLASSES}, "gamma": self.gamma, "op": self.op,
                "check": self.check, "epsilon": self.epsilon, "cpus": asdict(self.cpus), "kappa": self.kappa,
                "kappa_inter": self.kappa_inter}

    @staticmethod
    def from_dict(d: Mapping) -> "Network":
        try:
            links = {c: LinkCost(float(v["alpha"]), float(v["beta"])) for c, v in d["links"].items()}
            cpus = d.get("cpus") or {}
            return Network(links, float(d.get("gamma", 0.0)), float(d.get("op", 0.0)), float(d.get("check", 0.0)),
                           float(d.get("epsilon", 0.0)),
                           Cpus(str(cpus.get("scope", "rank")), float(cpus.get("cores", 1.0))),
                           float(d.get("kappa", 0.0)),
                           None if d.get("kappa_inter") is None else float(d["kappa_inter"]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a network table: {d!r}") from exc

    def table(self) -> str:
        """The constants as a small text table (for logs and ``ringlet tune``)."""
        rows = [f"{'class':<6} {'alpha (us)':>11} {'beta (ns/B)':>12} {'Gbit/s':>8}"]
        for c in LINK_CLASSES:
            lc = self.links[c]
            rows.append(f"{c:<6} {lc.alpha * 1e6:11.2f} {lc.beta * 1e9:12.4f} {lc.gbit:8.2f}")
        rows.append(f"gamma  {self.gamma * 1e9:.4f} ns/B ({'inf' if not self.gamma else f'{1e-9 / self.gamma:.2f}'} GB/s)")
        rows.append(f"per call {self.op * 1e6:.2f} us, metadata check {self.check * 1e6:.2f} us")
        per_byte = f"{self.kappa * 1e9:.4f} ns/B" + (
            "" if self.kappa_inter is None else f" ({self.kappa_inter * 1e9:.4f} between hosts)")
        rows.append(f"per message endpoint {self.epsilon * 1e6:.2f} us + {per_byte}, shared by "
                    f"{self.cpus.scope}" + ("" if self.cpus.scope == "rank" else f" ({self.cpus.cores:g} cores)"))
        return "\n".join(rows)


@dataclass(frozen=True)
class Topology:
    """Where ranks sit: ``host_of[r]`` is rank ``r``'s host index (any integers; compared for equality)."""

    host_of: tuple[int, ...]
    _hosts: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _, dense = np.unique(np.asarray(self.host_of, dtype=np.int64), return_inverse=True)
        object.__setattr__(self, "_hosts", dense.astype(np.int32))

    @staticmethod
    def uniform(ranks: int, per_host: int) -> "Topology":
        """``ranks`` ranks, ``per_host`` consecutive ranks on each host (the last host may have fewer)."""
        if ranks < 1 or per_host < 1:
            raise ValueError(f"need ranks >= 1 and per_host >= 1, got {ranks} and {per_host}")
        return Topology(tuple(r // per_host for r in range(ranks)))

    @property
    def size(self) -> int:
        return len(self.host_of)

    @property
    def hosts(self) -> np.ndarray:
        """Every rank's host as a dense index ``0..nhosts-1`` (read-only view)."""
        view = self._hosts.view()
        view.flags.writeable = False
        return view

    @property
    def nhosts(self) -> int:
        return int(self._hosts.max()) + 1 if self.size else 0

    def links(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For transfers ``src[i] -> dst[i]``: ``(inter, out_link, in_link)``. ``inter[i]`` is true for a
        transfer between hosts. Link ids are dense and disjoint across kinds: ranks' out ports are
        ``0..p-1``, in ports ``p..2p-1``, hosts' up links ``2p..2p+H-1``, down links ``2p+H..2p+2H-1``
        (so ``np.bincount`` over both arrays counts the transfers on every link)."""
        p, nh = self.size, self.nhosts
        hs, hd = self._hosts[src], self._hosts[dst]
        inter = hs != hd
        out_link = np.where(inter, 2 * p + hs, src)
        in_link = np.where(inter, 2 * p + nh + hd, p + dst)
        return inter, out_link, in_link

    @property
    def nlinks(self) -> int:
        return 2 * self.size + 2 * self.nhosts

    def endpoints(self, src: np.ndarray, dst: np.ndarray, only: np.ndarray | None = None) -> np.ndarray:
        """For the transfers ``src[i] -> dst[i]`` of one step: ``(n, 3)`` int64, the step's message
        endpoints (sends plus receives) at the busier of transfer ``i``'s two ends, counted for one
        rank, for one host and for the whole job (:meth:`Cpus.load` turns them into a load). ``only``
        (a mask over the transfers): count only the endpoints of those transfers."""
        if only is not None:
            only = np.asarray(only, bool)
            ends = np.bincount(src[only], minlength=self.size) + np.bincount(dst[only], minlength=self.size)
        else:
            ends = np.bincount(src, minlength=self.size) + np.bincount(dst, minlength=self.size)
        per_host = np.bincount(self._hosts, weights=ends, minlength=self.nhosts).astype(np.int64)
        hs, hd = self._hosts[src], self._hosts[dst]
        return np.stack([np.maximum(ends[src], ends[dst]), np.maximum(per_host[hs], per_host[hd]),
                         np.full(len(src), int(ends.sum()), np.int64)], axis=1)


@dataclass(frozen=True)
class _Quantity:
    """How to read one kind of quantity: a number is taken as it is; a string must match ``pattern``,
    whose group 1 is the number and from which ``unit`` gives the factor to the base unit. A value that
    ``valid`` rejects raises ``ValueError`` saying that it must be ``requirement``."""

    what: str
    pattern: re.Pattern
    unit: Callable[[re.Match], float]
    examples: str
    valid: Callable[[float], bool]
    requirement: str

    def parse(self, text: str | float) -> float:
        if isinstance(text, (int, float)):
            value = float(text)
        else:
            m = self.pattern.match(text)
            if not m:
                raise ValueError(f"not a {self.what}: {text!r} (try {self.examples})")
            value = float(m.group(1)) * self.unit(m)
        if not self.valid(value):
            raise ValueError(f"a {self.what} must be {self.requirement}, got {text!r}")
        return value


_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_RATE = _Quantity("link rate", re.compile(r"^\s*([0-9.]+(?:e[+-]?\d+)?)\s*([kmgt]?)(bit|bps|b)?(?:/s)?\s*$", re.I),
                  lambda m: _SCALE[m.group(2).lower()] * (8.0 if m.group(3) == "B" else 1.0),  # "B": bytes
                  "100gbit, 400mbit", lambda v: v > 0, "positive")
_TIME = _Quantity("duration", re.compile(r"^\s*([0-9.]+(?:e[+-]?\d+)?)\s*(s|ms|us|µs|ns)?\s*$", re.I),
                  lambda m: _SECONDS[(m.group(2) or "s").lower().replace("µ", "u")],
                  "2us, 0.5ms", lambda v: v >= 0 and math.isfinite(v), "finite and >= 0")


def parse_rate(rate: str | float) -> float:
    """Bits per second from ``"100gbit"``, ``"1gbit/s"``, ``"400mbit"``, ``"12.5GB"`` (bytes) or a number;
    ``ValueError`` for anything else or a rate that is not positive."""
    return _RATE.parse(rate)


def parse_time(t: str | float) -> float:
    """Seconds from ``"2us"``, ``"0.5ms"``, ``"1s"`` or a number of seconds; ``ValueError`` for anything
    else or a duration that is negative or not finite."""
    return _TIME.parse(t)


def host_layout(host_of: Sequence[int]) -> tuple[int, ...]:
    """Ranks per host, hosts in order of first appearance: the layout part of a cluster fingerprint."""
    counts: dict[int, int] = {}
    for h in host_of:
        counts[h] = counts.get(h, 0) + 1
    return tuple(counts.values())
