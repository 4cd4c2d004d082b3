"""The straggler verdict from every rank's published summary (:meth:`.stepmeter.StepMeter.summary`): pure,
so tests feed it summaries.

Compute-bound: a rank's compute time (a trimmed mean over its window) exceeds the median of the
others' (of its cohort: ranks doing different work, such as pipeline stages, are not compared) by more
than ``threshold`` (and by ``min_excess`` seconds). Network-bound: in a synchronous job a slow link
makes every rank's step equally long and leaves compute equal; what differs is where senders block. A
link (sender rank -> receiver rank on another host) is slow when the share of its large sends' time
the sender spends blocked in their waits is above ``1 + net_threshold`` times the median share of the
other links and above ``min_blocked_share``; the host common to every slow link is named (with one
slow link both ends are, and the verdict names both, as ``"A or B"``). Links are compared with those
that carried at least a quarter of their bytes (the same traffic). Links touching a host with a
compute straggler are left out: a late receiver blocks its senders too. A slow link must be seen
in ``checks`` consecutive checks to name its host. A compute straggler's evidence grows with how
much slower it is: each consecutive slow check adds ``(ratio - 1 - threshold) / (2 * threshold)`` (one
check's worth at ``1 + 3 * threshold`` times the others' median), and ``checks`` of it, over two checks
at least, name it: a rank 2.5 times slower is named in two checks, one 1.5 times slower (threshold
0.3) only after nine, so a marginal slowdown of a few seconds (a shared machine's scheduling) names
nobody. The opposite (compute within half the threshold; no link of the host slow even at half the
floor) for ``checks`` consecutive checks clears a verdict. One slow step or one slow check raises
nothing.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .options import StragglerOptions

COMPUTE, NETWORK = "compute", "network"
OR = " or "  # between the hosts of a network verdict that cannot tell which end of its slow link is slow


@dataclass(frozen=True)
class Change:
    """A rank that became a straggler (``state="straggler"``) or stopped being one (``"recovered"``).
    ``kind``: ``"compute"`` (``value``: its compute seconds per step, ``median``: the others' median) or
    ``"network"`` (``value``: the blocked share of its host's slowest link, ``median``: the median share
    of the links that are not slow);
    ``ranks``: every rank of the host for a network verdict; ``links``: the slow links as (src, dst)."""

    rank: int
    host: str
    kind: str
    state: str
    value: float
    median: float
    ranks: tuple[int, ...] = ()
    links: tuple[tuple[int, int], ...] = ()

    def describe(self) -> str:
        """The log line (without the logger's prefix)."""
        who = f"rank {self.rank} (host {self.host})" if self.kind == COMPUTE else \
            f"host {self.host} (rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))})"
        if self.kind == COMPUTE:
            nums = f"compute {self.value:.3f} s per step against the others' median {self.median:.3f} s " \
                   f"({_pct(self.value, self.median)})"
        else:
            links = ", ".join(f"{a}->{b}" for a, b in self.links)
            nums = f"its link{'s' if len(self.links) != 1 else ''} {links}: senders blocked " \
                   f"{100 * self.value:.1f}% of their large sends' time against the other links' median " \
                   f"{100 * self.median:.1f}%"
        if self.kind == NETWORK and OR in self.host:
            nums += " (one end of the slow link: the sender's upload or the receiver's download)"
        if self.state == "recovered":
            return f"straggler {who} has recovered ({self.kind}-bound before): " + \
                (nums if self.kind == COMPUTE else "no slow link any more")
        return f"straggler: {who} is {self.kind}-bound: {nums}"

    def args(self) -> dict:
        """The timeline event's arguments."""
        return {"rank": self.rank, "host": self.host, "kind": self.kind, "state": self.state,
                "value": round(self.value, 6), "median": round(self.median, 6), "ranks": list(self.ranks),
                "links": [list(x) for x in self.links]}


def _pct(value: float, median: float) -> str:
    return f"{100 * (value / median - 1):+.0f}%" if median > 0 else "median 0"


@dataclass
class _Track:
    slow: int = 0
    evidence: float = 0.0
    ok: int = 0
    flagged: Change | None = None


@dataclass
class Detector:
    """The verdict state of one job as one rank sees it. :meth:`check` takes every rank's summary and
    returns the changes since the last check; :attr:`scores` holds each rank's score of that check."""

    options: StragglerOptions
    scores: dict[int, float] = field(default_factory=dict)
    _tracks: dict = field(default_factory=dict)

    @property
    def stragglers(self) -> list[Change]:
        """The verdicts standing now."""
        return [t.flagged for t in self._tracks.values() if t.flagged is not None]

    def check(self, summaries: dict[int, dict | None], hosts: dict[int, str] | list[str]) -> list[Change]:
        hosts = dict(enumerate(hosts)) if not isinstance(hosts, dict) else hosts
        compute = self._compute(summaries)
        o = self.options
        slow_ranks = {r for r, (v, m) in compute.items() if v > m * (1 + o.threshold) and v - m > o.min_excess}
        changes = []
        self.scores = {r: max(0.0, v / m - 1) if m > 0 else 0.0 for r, (v, m) in compute.items()}
        for r, (v, m) in compute.items():
            ok = v <= m * (1 + o.threshold / 2) or v - m <= o.min_excess
            made = Change(r, hosts.get(r, "?"), COMPUTE, "straggler", v, m)
            weight = (v / m - 1 - o.threshold) / (2 * o.threshold) if r in slow_ranks else 0.0
            changes += self._step((COMPUTE, r), r in slow_ranks, ok, made, weight)
        busy_hosts = {hosts.get(r, "?") for r in slow_ranks} | \
            {t.flagged.host for k, t in self._tracks.items() if k[0] == COMPUTE and t.flagged is not None}
        return changes + self._network_changes(summaries, hosts, busy_hosts)

    def _network_changes(self, summaries, hosts, busy: set[str]) -> list[Change]:
        floor = self.options.min_blocked_share
        named = self._network(summaries, hosts, busy, floor)
        flagged = [k[1] for k, t in self._tracks.items() if k[0] == NETWORK and t.flagged is not None]
        still = self._network(summaries, hosts, busy, floor / 2) if flagged else named  # clear below half
        changes = []
        for key in sorted(set(named) | {k[1] for k in self._tracks if k[0] == NETWORK}):
            names = key.split(OR)
            ranks = tuple(sorted(r for r, x in hosts.items() if x in names))
            found = named.get(key)
            value, median, slow = found if found is not None else (0.0, 0.0, ())
            made = Change(ranks[0] if ranks else -1, key, NETWORK, "straggler", value, median, ranks, slow)
            if found is not None:
                for r in ranks:
                    self.scores[r] = max(self.scores.get(r, 0.0), value / max(median, 0.01) - 1)
            changes += self._step((NETWORK, key), found is not None, key not in still, made)
        return changes

    def _step(self, key, slow: bool, ok: bool, made: Change, weight: float = 1.0) -> list[Change]:
        """One check of one verdict: ``slow`` checks in a row, each adding ``weight`` to the evidence,
        name it once the evidence reaches ``checks`` (and after two checks at least); ``ok`` checks in a
        row clear it after ``checks``."""
        t = self._tracks.setdefault(key, _Track())
        t.slow = t.slow + 1 if slow else 0
        t.evidence = t.evidence + weight if slow else 0.0
        t.ok = t.ok + 1 if ok and not slow else 0
        n = self.options.checks
        if t.flagged is None and t.slow >= min(2, n) and t.evidence >= n - 1e-9:
            t.flagged = made
            return [made]
        if t.flagged is not None and t.ok >= n:
            was, t.flagged = t.flagged, None
            return [Change(made.rank, made.host, was.kind, "recovered", made.value, made.median, was.ranks,
                           was.links)]
        return []

    def _compute(self, summaries) -> dict[int, tuple[float, float]]:
        """rank -> (its median compute, the median of the others of its cohort) over ranks with enough
        steps, in cohorts of at least two such ranks."""
        cohorts: dict[str, dict[int, float]] = {}
        for r, s in summaries.items():
            if s and s.get("k", 0) >= self.options.min_steps and "c" in s:
                cohorts.setdefault(s.get("g", ""), {})[r] = s["c"]
        return {r: (c, statistics.median(x for q, x in members.items() if q != r))
                for members in cohorts.values() if len(members) >= 2 for r, c in members.items()}

    def _network(self, summaries, hosts, busy: set[str], floor: float) -> dict:
        """{named host: (its slowest link's blocked share, the median share of the links that are not
        slow, the slow links)}: a link is slow when its sender is blocked at least ``floor`` of the time
        and ``1 + net_threshold`` times the median of the links that carried at least a quarter of its
        bytes (at least two such). Links touching a ``busy`` host are left out. With several hosts common
        to every slow link (one slow link has two ends), the key names them all, joined by " or "."""
        links = []
        for r, s in summaries.items():
            if not s or s.get("k", 0) < self.options.min_steps:
                continue  # still starting: its links carry the set-up's waits
            for peer, (b, e, bl) in (s.get("l") or {}).items():
                p = int(peer)
                hs = (hosts.get(r, "?"), hosts.get(p, "?"))
                if e > 0 and b >= 4 * self.options.link_min_bytes and hs[0] != hs[1] and not busy & set(hs):
                    links.append((r, p, min(1.0, bl / e), b))
        slow, fine = [], []
        for i, (a, b, x, n) in enumerate(links):
            others = [y for j, (_, _, y, m) in enumerate(links) if j != i and 4 * m >= n]
            cut = max(floor, (1 + self.options.net_threshold) * statistics.median(others)) if len(others) >= 2 \
                else float("inf")
            (slow if x >= cut else fine).append((a, b, x))
        if not slow:
            return {}
        common = set.intersection(*({hosts.get(a, "?"), hosts.get(b, "?")} for a, b, _ in slow))
        if not common:
            return {}
        med = statistics.median(x for _, _, x in fine) if fine else 0.0
        return {OR.join(sorted(common)): (max(x for _, _, x in slow), med, tuple((a, b) for a, b, _ in slow))}
