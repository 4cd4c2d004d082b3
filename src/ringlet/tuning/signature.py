"""A schedule reduced to what its predicted time depends on, evaluated at any size in a few numpy
operations. The timing model is described in :mod:`ringlet.tuning.cost` and ``docs/cost_model.md``.

Two tables, both deduplicated:

* **step rows**, sorted by step: one per distinct transfer shape of a step — link class, flows (the
  most transfers of the step on a link the transfer crosses), reducers (for a reducing transfer, how
  many reducing transfers its receiver takes in that step: they are reduced one after the other), its
  size as a fraction ``num/den`` of the element count, and the message endpoints (sends and receives)
  of the step at its busier end: of one rank, of one host, of the whole job (the network's ``cpus``
  picks which are shared), and the same counting only endpoints of inter-host transfers (which the
  network's ``kappa_inter`` prices). They give each step's per-segment time ``τ_s``.
* **resource rows**, sorted by group: every link, every rank's reduction and the processors that
  handle messages (each rank's, each host's, the job's) are resources; resources that are used
  identically in every step form one group, kept once. A row says how a group's resource is used in
  one step: kind (intra link, inter link, reduction, rank/host/job processors), how many transfers
  (endpoints, for processors; and how many of those are of inter-host transfers) share it, and the
  largest one's fraction. They give the pipeline's
  steady state: the busiest resource's occupancy summed over the steps.

Steps whose sends the executor holds until the step before is done (:mod:`ringlet.algorithms.hold`)
start a new *stage*: the pipeline drains at a stage's end, so the steady state is taken per stage
(the busiest resource of each stage, summed over the stages). Resource rows are sorted by stage, then
by group; a group's rows within one stage form a *block*.

At ``n`` elements a row's size is ``ceil(num·n/den)`` elements: exactly the largest block of an even
split, so a signature built at a count where every split is even predicts the real schedule's time
at any count where no block is empty.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..algorithms.hold import held_between
from ..algorithms.schedule import Schedule
from .network import INTER, INTRA, Network, Topology

INTRA_LINK, INTER_LINK, REDUCTION, RANK_CPU, HOST_CPU, JOB_CPU = range(6)  # resource row kinds
_SHARED_KIND = {"host": HOST_CPU, "machine": JOB_CPU}  # Cpus.scope -> the processor rows it divides
TERMS = ("alpha", "beta", "gamma", "op", f"alpha.{INTRA}", f"alpha.{INTER}", f"beta.{INTRA}", f"beta.{INTER}")
_MIX, _MASK = 0x9E3779B97F4A7C15, (1 << 64) - 1  # a multiplicative hash of resource profiles


def fractions(counts: np.ndarray, reference: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """``counts / reference`` as reduced fractions; a denominator above ``limit`` (a split that was not
    even at the reference count) becomes the closest fraction with a denominator up to ``limit``."""
    counts = np.asarray(counts, np.int64)
    g = np.gcd(counts, reference)
    num, den = counts // g, reference // np.maximum(g, 1)
    for i in np.flatnonzero(den > limit):
        f = Fraction(int(counts[i]), reference).limit_denominator(limit)
        num[i], den[i] = f.numerator, f.denominator
    return num, den


class _Resources:
    """Builds the resource rows: per step, each used resource's (kind, load, largest count) as a code;
    resources with the same code sequence over all steps are grouped by a running hash."""

    def __init__(self, topology: Topology):
        self.p, self.nlinks, self.hosts, self.nhosts = topology.size, topology.nlinks, topology.hosts, topology.nhosts
        self.cpu0 = self.nlinks + self.p  # first processor id: ranks, then hosts, then the job
        self.hash = np.zeros(self.cpu0 + self.p + self.nhosts + 1, np.uint64)
        self.codes: dict[tuple[int, int, int], int] = {}
        self.used: list[tuple[int, np.ndarray, np.ndarray]] = []

    def add(self, s: int, links: np.ndarray, counts: np.ndarray, src: np.ndarray, dst: np.ndarray,
            red: np.ndarray) -> None:
        load = np.bincount(links, minlength=self.nlinks)
        biggest = np.zeros(self.nlinks, np.int64)
        np.maximum.at(biggest, links, counts)
        ids = np.flatnonzero(load)
        kind = np.where(ids >= 2 * self.p, INTER_LINK, INTRA_LINK)
        rows = [np.stack([ids, kind, load[ids], np.zeros(len(ids), np.int64), biggest[ids]], axis=1)]
        if red.any():
            rdst, rcount = dst[red], counts[: len(dst)][red]
            cpu_load = np.bincount(rdst, minlength=self.p)
            cpu_big = np.zeros(self.p, np.int64)
            np.maximum.at(cpu_big, rdst, rcount)
            cids = np.flatnonzero(cpu_load)
            rows.append(np.stack([cids + self.nlinks, np.full(len(cids), REDUCTION), cpu_load[cids],
                                  np.zeros(len(cids), np.int64), cpu_big[cids]], 1))
        rows.append(self._processors(src, dst, counts[: len(dst)]))
        table = np.concatenate(rows)
        shapes, inverse = np.unique(table[:, 1:], axis=0, return_inverse=True)
        code_of = np.array([self.codes.setdefault(tuple(int(v) for v in row), len(self.codes)) for row in shapes],
                           np.int64)
        codes = code_of[inverse.ravel()]
        res = table[:, 0]
        key = np.uint64(((s + 1) * _MIX) & _MASK) ^ codes.astype(np.uint64)
        self.hash[res] = (self.hash[res] ^ key) * np.uint64(_MIX) + np.uint64(1)
        self.used.append((s, res, codes))

    def _processors(self, src: np.ndarray, dst: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Rows (id, kind, endpoints, endpoints of inter-host transfers, largest transfer) of every rank,
        host and the job with endpoints."""
        ends = np.concatenate([src, dst])
        big = np.concatenate([counts, counts])
        inter = np.tile(self.hosts[src] != self.hosts[dst], 2)
        out = []
        for kind, owner, n, base in ((RANK_CPU, ends, self.p, self.cpu0),
                                     (HOST_CPU, self.hosts[ends], self.nhosts, self.cpu0 + self.p),
                                     (JOB_CPU, np.zeros(len(ends), np.int64), 1, self.cpu0 + self.p + self.nhosts)):
            load = np.bincount(owner, minlength=n)
            xload = np.bincount(owner[inter], minlength=n)
            largest = np.zeros(n, np.int64)
            np.maximum.at(largest, owner, big)
            ids = np.flatnonzero(load)
            out.append(np.stack([ids + base, np.full(len(ids), kind), load[ids], xload[ids], largest[ids]], 1))
        return np.concatenate(out)

    def rows(self, stage: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(block start indices, first block of each stage, rows of (kind, load, inter load, count)): the rows in
        order of ``stage[step]``, then resource group, then step; a group's rows in one stage are a block."""
        hashes, first = np.unique(self.hash, return_index=True)
        reps = first[hashes != 0]
        group = np.full(len(self.hash), -1, np.int64)
        group[reps] = np.arange(len(reps))
        out = []
        for s, res, codes in self.used:
            g = group[res]
            keep = g >= 0
            out.append(np.stack([g[keep], np.full(int(keep.sum()), s), codes[keep]], axis=1))
        table = np.concatenate(out) if out else np.zeros((0, 3), np.int64)
        st = np.asarray(stage, np.int64)[table[:, 1]]
        order = np.lexsort((table[:, 1], table[:, 0], st))
        table, st = table[order], st[order]
        shape = np.array(sorted(self.codes, key=self.codes.get), np.int64).reshape(-1, 4)
        if not len(table):
            return np.zeros(0, np.int64), np.zeros(1, np.int64), shape[table[:, 2]]
        starts = np.flatnonzero(np.r_[True, (table[1:, 0] != table[:-1, 0]) | (st[1:] != st[:-1])])
        block_stage = st[starts]
        stages = np.flatnonzero(np.r_[True, block_stage[1:] != block_stage[:-1]])
        return starts, stages, shape[table[:, 2]]


@dataclass(frozen=True, eq=False)
class Signature:
    """See the module doc. ``fanout``: the most transfers one rank sends in one step; ``messages``:
    transfers in the schedule. ``ends``: per step row, the step's message endpoints at the busier end
    of the transfer, columns (one rank, one host, the job); ``xends``: the same, of inter-host transfers
    only. ``rstarts``: the first resource row of each block; ``sstarts``: the first block of each stage;
    ``rxload``: per resource row, the endpoints of inter-host transfers among its ``rload``."""

    name: str
    nranks: int
    steps: int
    messages: int
    fanout: int
    starts: np.ndarray   # step rows: first row of each step
    cls: np.ndarray      # 1 inter, 0 intra
    flows: np.ndarray
    reducers: np.ndarray  # reducing receives of the step at the row's receiver (0: not reducing)
    num: np.ndarray
    den: np.ndarray
    ends: np.ndarray     # (rows, 3) float: endpoints of the step per rank, host, job
    rstarts: np.ndarray  # resource rows: first row of each block (a group within a stage)
    sstarts: np.ndarray  # blocks: first block of each stage
    rkind: np.ndarray
    rload: np.ndarray
    rnum: np.ndarray
    rden: np.ndarray
    xends: np.ndarray    # (rows, 3) float: as ends, inter-host transfers' endpoints only
    rxload: np.ndarray

    @property
    def exact_below(self) -> int:
        """Counts below this may leave blocks empty (the rows would then over-state the transfers)."""
        return int(self.den.max()) if len(self.den) else 0

    @staticmethod
    def of(schedule: Schedule, topology: Topology, reference: int = 1) -> "Signature":
        """The signature of ``schedule`` (built for ``reference`` elements; ``1`` keeps every transfer's
        count as is, so that evaluating at ``n = 1`` gives the schedule's own time). ``ValueError`` when
        the rank counts differ."""
        if schedule.nranks != topology.size:
            raise ValueError(f"schedule {schedule.name!r} has {schedule.nranks} ranks, the topology {topology.size}")
        limit = max(64, 16 * schedule.nranks)
        held, prev = np.zeros(schedule.num_steps, bool), None  # steps that start a stage
        steps, starts, messages, fanout = [], [], 0, 0
        resources = _Resources(topology)
        for s in range(schedule.num_steps):
            arr = schedule.step_arrays(s)
            held[s] = prev is not None and len(held_between(prev, arr, schedule.nranks)) > 0
            prev = arr
            src, dst = np.asarray(arr.src, np.int64), np.asarray(arr.dst, np.int64)
            count, red = np.asarray(arr.count, np.int64), np.asarray(arr.reduce, bool)
            inter, out, inl = topology.links(src, dst)
            links = np.concatenate([out, inl])
            load = np.bincount(links, minlength=topology.nlinks)
            flows = np.maximum(load[out], load[inl])
            reducers = np.where(red, np.bincount(dst[red], minlength=topology.size)[dst], 0)
            starts.append(sum(len(t) for t in steps))
            steps.append(np.unique(np.concatenate([np.stack([inter.astype(np.int64), flows, reducers, count], 1),
                                                   topology.endpoints(src, dst),
                                                   topology.endpoints(src, dst, only=inter)], axis=1), axis=0))
            resources.add(s, links, np.concatenate([count, count]), src, dst, red)
            messages += len(src)
            fanout = max(fanout, int(np.bincount(src).max()))
        t = np.concatenate(steps) if steps else np.zeros((0, 10), np.int64)
        num, den = fractions(t[:, 3], int(reference), limit)
        rstarts, sstarts, r = resources.rows(np.cumsum(held))
        rnum, rden = fractions(r[:, 3], int(reference), limit)
        return Signature(schedule.name, schedule.nranks, schedule.num_steps, messages, fanout,
                         np.asarray(starts, np.int64), t[:, 0].astype(np.int8), t[:, 1].astype(np.float64),
                         t[:, 2].astype(np.float64), num, den, t[:, 4:7].astype(np.float64), rstarts,
                         sstarts, r[:, 0].astype(np.int8),
                         r[:, 1].astype(np.float64), rnum, rden, t[:, 7:10].astype(np.float64),
                         r[:, 2].astype(np.float64))

    def _parts(self, n: int, network: Network, itemsize: int, segments: np.ndarray):
        """Per (segment size, row): segments ``k`` and the α, β, γ parts of one segment, for the step
        rows and for the resource rows."""
        lo, hi = network[INTRA], network[INTER]
        seg = segments[:, None]

        def geometry(num, den):
            b = (-(-(num * int(n)) // den)).astype(np.float64) * itemsize
            k = np.maximum(1.0, np.ceil(b[None, :] / seg))
            return k, b / k

        k, part = geometry(self.num, self.den)
        cpus = network.cpus
        load = cpus.load(self.ends)
        kload = cpus.load(network.weighted_ends(self.ends, self.xends))
        beta = np.maximum(np.where(self.cls == 1, hi.beta, lo.beta) * self.flows, kload)
        alpha = np.where(self.cls == 1, hi.alpha, lo.alpha) + network.epsilon * load
        step = (k, np.broadcast_to(alpha, k.shape), part * beta, part * (self.reducers * network.gamma))
        rk, rpart = geometry(self.rnum, self.rden)
        link = self.rkind <= INTER_LINK
        ralpha = np.where(self.rkind == INTER_LINK, hi.alpha, np.where(link, lo.alpha, 0.0))
        share = np.where(self.rkind == RANK_CPU, 1.0,
                         np.where(self.rkind == _SHARED_KIND.get(cpus.scope, -1), 1.0 / cpus.cores, 0.0))
        ralpha = ralpha + network.epsilon * share * self.rload
        cpu = share * (network.kappa * self.rload + (network.kx - network.kappa) * self.rxload)
        rbeta = np.where(self.rkind == INTER_LINK, hi.beta * self.rload, np.where(link, lo.beta * self.rload, cpu))
        res = (rk, np.broadcast_to(ralpha, rk.shape), rpart * rbeta,
               rpart * ((self.rkind == REDUCTION) * network.gamma * self.rload))
        return step, res

    def _groups(self, rem: np.ndarray) -> np.ndarray:
        """Per (segment size, block): the summed ``rem`` of its rows (fixed summation order)."""
        if rem.shape[1] == 0:
            return np.zeros((rem.shape[0], 1))
        cs = np.concatenate([np.zeros((rem.shape[0], 1)), np.cumsum(rem, axis=1)], axis=1)
        ends = np.append(self.rstarts[1:], rem.shape[1])
        return cs[:, ends] - cs[:, self.rstarts]

    def seconds(self, n: int, network: Network, itemsize: int, segments: np.ndarray) -> np.ndarray:
        """Predicted seconds at ``n`` elements for each segment size in ``segments`` (bytes; ``inf`` =
        unsegmented): the network's per-call ``op``, the first segment through every step, then per
        stage the busiest resource's remaining segments. Nothing moves (no steps, ``n <= 0``): 0."""
        segments = np.asarray(segments, np.float64)
        if self.steps == 0 or n <= 0:
            return np.zeros(len(segments))
        (k, a, b, g), (rk, ra, rb, rg) = self._parts(n, network, itemsize, segments)
        tau = np.maximum.reduceat(a + b + g, self.starts, axis=1)
        rem = np.maximum.reduceat(self._groups((rk - 1.0) * (ra + rb + rg)), self.sstarts, axis=1)
        return np.cumsum(tau, axis=1)[:, -1] + rem.sum(axis=1) + network.op

    def terms(self, n: int, network: Network, itemsize: int, segment: float) -> tuple[dict, int]:
        """The α/β/γ/op parts of the time at one segment size (keys :data:`TERMS`; α and β also per link
        class), and the most segments of any transfer."""
        terms = dict.fromkeys(TERMS, 0.0)
        if self.steps == 0 or n <= 0:
            return terms, 1
        (k, a, b, g), (rk, ra, rb, rg) = self._parts(n, network, itemsize, np.array([float(segment)]))
        k, a, b, g, rk, ra, rb, rg = (x[0] for x in (k, a, b, g, rk, ra, rb, rg))
        t = a + b + g
        step_of = np.repeat(np.arange(self.steps), np.diff(np.append(self.starts, len(t))))
        tau = np.maximum.reduceat(t, self.starts)
        idx = np.flatnonzero(t == tau[step_of])
        slow = idx[np.unique(step_of[idx], return_index=True)[1]]
        rows = self._busiest(self._groups(((rk - 1.0) * (ra + rb + rg))[None, :])[0], len(rk))
        w = rk[rows] - 1.0
        # Processors count with the links between hosts where the schedule crosses hosts, else within them.
        cpu = self.rkind[rows] >= RANK_CPU
        cpu_inter = bool((self.cls == 1).any())
        res_intra = (self.rkind[rows] == INTRA_LINK) | (cpu & (not cpu_inter))
        res_inter = (self.rkind[rows] == INTER_LINK) | (cpu & cpu_inter)
        # A step row whose bytes are bound by its processors (kappa) counts its β part with them too.
        lo_b, hi_b = network[INTRA].beta, network[INTER].beta
        kload = network.cpus.load(network.weighted_ends(self.ends[slow], self.xends[slow]))
        by_cpu = kload > np.where(
            self.cls[slow] == 1, hi_b, lo_b) * self.flows[slow]
        beta_cls = np.where(by_cpu, int(cpu_inter), self.cls[slow])
        for name, c, cls_res in ((INTRA, 0, res_intra), (INTER, 1, res_inter)):
            terms[f"alpha.{name}"] = float(a[slow][self.cls[slow] == c].sum() + (w * ra[rows])[cls_res].sum())
            terms[f"beta.{name}"] = float(b[slow][beta_cls == c].sum() + (w * rb[rows])[cls_res].sum())
        terms["gamma"] = float(g[slow].sum() + (w * rg[rows]).sum())
        terms["alpha"] = terms[f"alpha.{INTRA}"] + terms[f"alpha.{INTER}"]
        terms["beta"] = terms[f"beta.{INTRA}"] + terms[f"beta.{INTER}"]
        terms["op"] = network.op
        return terms, int(k.max())

    def _busiest(self, rem: np.ndarray, nrows: int) -> np.ndarray:
        """The resource rows of each stage's busiest block (by ``rem`` per block), in stage order."""
        if not len(self.rstarts):
            return np.zeros(0, np.int64)
        ends = np.append(self.rstarts[1:], nrows)
        stage_ends = np.append(self.sstarts[1:], len(rem))
        picks = [lo + int(np.argmax(rem[lo:hi])) for lo, hi in zip(self.sstarts, stage_ends)]
        return np.concatenate([np.arange(self.rstarts[b], ends[b]) for b in picks])


class Stack:
    """Several signatures (e.g. every algorithm on one layout) evaluated in one pass: the same
    arithmetic as :meth:`Signature.seconds` on their concatenated rows, so choosing among ``A``
    algorithms costs about one evaluation instead of ``A``. Every signature must have steps."""

    def __init__(self, signatures: list[Signature]):
        if not signatures or any(s.steps == 0 for s in signatures):
            raise ValueError("a Stack needs signatures with steps")
        rows = np.cumsum([0] + [len(s.num) for s in signatures])[:-1]
        rrows = np.cumsum([0] + [len(s.rnum) for s in signatures])[:-1]
        blocks = np.cumsum([0] + [len(s.rstarts) for s in signatures])[:-1]
        cat = np.concatenate
        self.all = Signature("stack", signatures[0].nranks, sum(s.steps for s in signatures),
                             sum(s.messages for s in signatures), max(s.fanout for s in signatures),
                             cat([s.starts + r for s, r in zip(signatures, rows)]), cat([s.cls for s in signatures]),
                             cat([s.flows for s in signatures]), cat([s.reducers for s in signatures]),
                             cat([s.num for s in signatures]), cat([s.den for s in signatures]),
                             cat([s.ends for s in signatures]),
                             cat([s.rstarts + r for s, r in zip(signatures, rrows)]),
                             cat([s.sstarts + b for s, b in zip(signatures, blocks)]),
                             cat([s.rkind for s in signatures]), cat([s.rload for s in signatures]),
                             cat([s.rnum for s in signatures]), cat([s.rden for s in signatures]),
                             cat([s.xends for s in signatures]), cat([s.rxload for s in signatures]))
        self.step_bounds = np.cumsum([0] + [s.steps for s in signatures])
        self.stage_bounds = np.cumsum([0] + [len(s.sstarts) for s in signatures])[:-1]

    def seconds(self, n: int, network: Network, itemsize: int, segments: np.ndarray) -> np.ndarray:
        """Predicted seconds, shape (signatures, segment sizes) (``n >= 1``)."""
        segments = np.asarray(segments, np.float64)
        sig = self.all
        (k, a, b, g), (rk, ra, rb, rg) = sig._parts(n, network, itemsize, segments)
        tau = np.maximum.reduceat(a + b + g, sig.starts, axis=1)
        cs = np.concatenate([np.zeros((len(segments), 1)), np.cumsum(tau, axis=1)], axis=1)
        fill = cs[:, self.step_bounds[1:]] - cs[:, self.step_bounds[:-1]]
        per_stage = np.maximum.reduceat(sig._groups((rk - 1.0) * (ra + rb + rg)), sig.sstarts, axis=1)
        rem = np.add.reduceat(per_stage, self.stage_bounds, axis=1)
        return (fill + rem).T + network.op
