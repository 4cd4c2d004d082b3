"""Calibration: measure the network constants (α, β per link class, γ) on the live job.

Run by every rank of a job at once (``ringlet tune``, or ``ringlet.init()`` with ``RINGLET_TUNE=auto``);
every rank returns the identical :class:`~ringlet.tuning.profile.Profile`. Framework-free: every buffer,
timing and exchange between ranks is the prober's it is handed (:class:`ringlet.engine.probe.Prober`).

Protocol (docs/tuning.md gives the reasons):

1. **Links.** For each link class that occurs in the job's host layout, a *shift pattern*
   (:func:`~ringlet.tuning.patterns.shift_pattern`): ``intra`` — every rank sends to the next rank of its
   host; ``inter`` — every rank sends to its counterpart on the next host. All ranks send at once, as
   in an algorithm's step, so a host's uplink carries its ranks' transfers together (``sharing``,
   counted with :meth:`Topology.links`, as the cost model counts it).
2. The pattern is run as a *chain* of dependent steps (each rank forwards what it just received, as a
   ring step does) through the executor and the transport's ``isend``/``irecv``, so what is measured
   is what a collective's steps cost on this path: Python dispatch, transport and wire. Every transfer
   is one message (the chain runs with a segment as large as its messages): the constants are those
   of one segment, and how segments pipeline is the cost model's part, not folded into α and β. Each
   size (``plan.sizes``, ascending) is timed at two chain lengths (``plan.chains``, alternating),
   ``plan.reps`` times each (three times as often up to 64 KiB), after a barrier (small sizes several
   times back to back per timing); a sample's time is the slowest rank's, and the median over
   repetitions is kept.
3. **Fit.** :func:`~ringlet.tuning.fit.fit_link` on ``seconds = overhead + steps·(α + sharing·b·β)``:
   relative least squares, non-negative, one round of outlier rejection. ``overhead`` (per executed
   schedule, not per step) is reported in ``info`` (``op_overhead``); back-to-back metadata agreements
   are timed too (slowest rank, median; ``info["check_overhead"]``), the network's ``check`` until
   step 6 replaces it.
4. **γ.** Every rank times ``dst.add_(src)`` on float32 buffers of ``plan.gamma_sizes`` (cut to the
   segment size: the executor reduces one segment at a time) at the same time (the ranks of a host
   share its CPUs, as reductions in a collective do), the destination moving through 64 MiB so it
   comes from memory as a large buffer's does; per-size medians are averaged over ranks and
   :func:`~ringlet.tuning.fit.fit_gamma` gives seconds per byte.
5. **Agreement.** Timings travel between ranks (all-gather) after every size, so every decision (the
   time budget drops the sizes from the first whose projected cost — its time per step extrapolated
   from the two sizes before — would exceed it) is taken on identical numbers; the profile rank 0
   builds is broadcast, so every rank holds the same bytes.
6. **Per call.** First who shares the processors that handle messages (the network's ``cpus``): every
   rank, when all run on one kernel (the same boot id: hosts emulated on one machine), else the ranks
   of a host. Then whole unchecked all-reduces of one element per rank through the engine's operation
   — ring, recursive doubling and direct (many steps and few, one message per rank and step and p−1)
   — are timed back to back for about a quarter of a second per timing (sustained, as training calls
   them: a CPU quota lets short bursts run faster) and fitted as
   ``measured = op + scale · (their α part under the chain constants) + epsilon · (their endpoint
   load) + the rest`` (:func:`~ringlet.tuning.fit.fit_per_call`): ``op`` is what a call costs beyond
   its steps (choosing, building, compiling, scaling), ``scale`` corrects both classes' α to what a
   step of a whole collective pays, ``epsilon`` what each message endpoint costs the processors that
   handle it. The same calls timed checked (each agreeing on its metadata first; unchecked and checked
   timings alternate) give the network's ``check``: the median over the calls of checked minus
   unchecked, which is more than back-to-back agreements cost
   (``info["check_overhead"]``, the value before). ``info["per_call"]`` keeps the timings and the fit.
7. **Per byte.** Whole unchecked all-reduces of ``plan.large_bytes`` per rank with the ring and with
   halving-doubling — each rank sends and receives the same bytes in both, but on several ranks per
   host halving-doubling puts fewer of them on the uplinks — and the ring again cut into 32 messages
   per buffer (the same bytes as more messages) are timed in turn, seven times each (slowest rank,
   median), and :func:`~ringlet.tuning.fit.fit_kappa` gives ``kappa``, the processors' time per byte
   at a message endpoint: 0 where the links explain all three, more where the processors are what
   binds, and 0 where no call compares with the first differently under a processor bound (then it
   cannot be told from a slow link) or one common factor explains the calls as well. With one rank
   per host only the segmented call can tell: where the processors bind, they pay each message's
   price on the bytes' path. ``info["large_calls"]`` keeps, per call, the algorithm, segment,
   timing and the prediction without ``kappa``, and the fit.
8. **The wire.** One inter-host transfer of ``plan.large_bytes`` alone, against the inter-host shift
   pattern at that size, seven times each in turn (:mod:`~ringlet.tuning.wire`): where the lone
   transfer runs faster and the processors can explain the shift, the inter link's β is the lone
   transfer's and ``kappa`` the processors' share, so that steps with fewer ranks moving bytes are
   priced as they run. ``info["wire"]`` keeps the timings and the decision.

A class absent from the layout (one host; one rank per host) is not measured; its row copies the
measured class (the cost model never uses it for this layout) and ``info["measured"]`` says which were.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
import zlib
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from .cost import allreduce_signature, predict_allreduce
from .fit import LinkFit, Sample, fit_gamma, fit_kappa, fit_link, fit_per_call
from .network import INTER, INTRA, LINK_CLASSES, Cpus, LinkCost, Network, Topology
from .patterns import chain, sharing, shift_pattern
from .profile import Fingerprint, Profile
from .wire import measure_wire, split_kappa

KiB, MiB = 1 << 10, 1 << 20
_BUDGET_SHARE = {INTRA: 0.4, INTER: 0.5}  # of plan.budget_s per class; γ takes what is left
_GAMMA_SPAN = 64 * MiB  # destinations of the γ timings cycle through this much memory
_ALWAYS = 3  # the first sizes are measured whatever the budget says (the fit needs them)


@dataclass(frozen=True)
class CalibrationPlan:
    """What :func:`calibrate` measures. ``sizes``: bytes per transfer (ascending; ≥ 4); ``chains``: two
    distinct step counts; ``reps``: timings per (size, chain length); ``gamma_sizes``: bytes added per
    reduction timing; ``budget_s``: seconds the link measurements may take (sizes beyond it are
    dropped, never the first three); ``large_bytes``: bytes per rank of the whole all-reduces that
    price the processors' work per byte (step 7; 0: not measured, ``kappa`` stays 0)."""

    name: str
    sizes: tuple[int, ...]
    chains: tuple[int, int]
    reps: int
    gamma_sizes: tuple[int, ...]
    budget_s: float
    large_bytes: int = 0

    def __post_init__(self) -> None:
        if len(self.sizes) < _ALWAYS or list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 4:
            raise ValueError(f"plan {self.name!r}: need >= {_ALWAYS} distinct ascending sizes >= 4 B, got {self.sizes}")
        if len(set(self.chains)) != 2 or min(self.chains) < 1:
            raise ValueError(f"plan {self.name!r}: need two distinct chain lengths >= 1, got {self.chains}")
        if self.reps < 1 or not self.budget_s > 0:
            raise ValueError(f"plan {self.name!r}: need reps >= 1 and budget_s > 0")
        if len({s for s in self.gamma_sizes if s >= 4}) < 2:
            raise ValueError(f"plan {self.name!r}: need two distinct gamma sizes >= 4 B, got {self.gamma_sizes}")
        if self.large_bytes < 0 or self.large_bytes % 4:
            raise ValueError(f"plan {self.name!r}: large_bytes must be a multiple of 4 and >= 0, "
                             f"got {self.large_bytes}")


PLANS: dict[str, CalibrationPlan] = {
    "full": CalibrationPlan("full", (4, KiB, 16 * KiB, 128 * KiB, MiB, 4 * MiB, 16 * MiB), (1, 4), 5,
                            (64 * KiB, MiB, 4 * MiB, 16 * MiB), 24.0, 16 * MiB),
    "quick": CalibrationPlan("quick", (4, 16 * KiB, 256 * KiB, MiB, 4 * MiB), (1, 3), 3,
                             (256 * KiB, 4 * MiB), 6.0, 4 * MiB),
}


def plan_named(name: str) -> CalibrationPlan:
    """The plan called ``name`` (``full``, ``quick``); ``ValueError`` for another name."""
    try:
        return PLANS[name]
    except KeyError:
        raise ValueError(f"unknown calibration plan {name!r}; choose one of {', '.join(PLANS)}") from None


def _repeat(nbytes: int) -> int:
    """Back-to-back runs per timing: more for small sizes, so a barrier's exit skew is amortised."""
    return max(1, min(8, (64 * KiB) // max(nbytes, 1)))


def _reps(plan: CalibrationPlan, nbytes: int) -> int:
    """Timings per chain length: three times the plan's up to 64 KiB, where they cost little and the
    noise of a shared machine is largest relative to the time."""
    return plan.reps * (3 if nbytes <= 64 * KiB else 1)


class _ClassRun:
    """Measuring one link class: its pattern, samples and the agreed seconds spent so far."""

    def __init__(self, prober, cls: str, host_of: Sequence[int], plan: CalibrationPlan):
        self.prober, self.cls, self.plan = prober, cls, plan
        self.pattern = shift_pattern(host_of, cls)
        self.sharing = sharing(self.pattern, Topology(tuple(host_of)))
        self.samples: list[Sample] = []
        self.spent = 0.0

    def measure(self, budget: float) -> list[Sample]:
        p = self.prober.group.size
        buf = self.prober.buffer(3 * (self.plan.sizes[-1] // 4))
        per_step: list[tuple[int, float]] = []  # (bytes, agreed seconds per step) of each size measured
        for i, size in enumerate(self.plan.sizes):
            if i >= _ALWAYS and self.spent + self._projected(size, per_step) > budget:
                break  # every rank decides on the same agreed numbers
            count = size // 4
            per_step.append((size, self._measure_size(p, count, buf[:3 * count])))
        return self.samples

    def _projected(self, size: int, per_step: list[tuple[int, float]]) -> float:
        """Seconds that measuring ``size`` would take: the time per step extrapolated linearly from the
        last two sizes (never below the last), times the steps its timings run."""
        (b1, t1), (b2, t2) = per_step[-2:]
        tau = t2 + max(0.0, (t2 - t1) / (b2 - b1)) * (size - b2)
        runs = _reps(self.plan, size) * _repeat(size) + 1
        return runs * tau * sum(self.plan.chains)

    def _measure_size(self, p: int, count: int, buf) -> float:
        """Time ``count`` elements per transfer at both chain lengths; add the samples; return the agreed
        seconds per step of the longer chain."""
        plan, repeat = self.plan, _repeat(count * 4)
        scheds = [chain(self.pattern, p, count, steps) for steps in plan.chains]
        for s in scheds:
            self.prober.time_chain(s, buf, 1)  # warm-up: plans compiled, transport buffers set up
        reps = _reps(plan, count * 4)
        mine = [self.prober.time_chain(s, buf, repeat) for _ in range(reps) for s in scheds]
        agreed = self.prober.gather(mine).max(axis=0).reshape(reps, len(scheds))
        medians = [max(float(np.median(agreed[:, j])), 1e-9) for j in range(len(scheds))]
        for steps, t in zip(plan.chains, medians):
            self.samples.append(Sample(count * 4, steps, self.sharing, t))
        self.spent += float(agreed.sum()) * (repeat + 1 / reps)
        longest = int(np.argmax(plan.chains))
        return medians[longest] / plan.chains[longest]


def _measure_gamma(prober, plan: CalibrationPlan, segment_bytes: int) -> tuple[float, float, list]:
    """Per-size medians of an in-place float32 addition, averaged over ranks, and the fit. Sizes beyond
    the executor's segment are cut to it (the executor never reduces more at once); destinations cycle
    through ``_GAMMA_SPAN`` bytes of memory."""
    sizes = sorted({min(s, max(segment_bytes, 8)) // 4 * 4 for s in plan.gamma_sizes if s >= 4})
    if len(sizes) < 2:
        sizes = [sizes[0] // 2 // 4 * 4 or 4, sizes[0]]
    big = max(_GAMMA_SPAN, 2 * sizes[-1]) // 4
    dst, src = prober.buffer(big), prober.buffer(sizes[-1] // 4, 0.5)
    medians = []
    for size in sizes:
        n, repeat = size // 4, max(2, min(64, (8 * MiB) // size))
        dsts = [dst[i:i + n] for i in range(0, big - n + 1, n)]
        prober.time_add(dsts, src[:n], 1)
        medians.append(statistics.median(prober.time_add(dsts, src[:n], repeat) for _ in range(plan.reps)))
    mean = prober.gather(medians).mean(axis=0)
    gamma, per_call = fit_gamma(sizes, mean.tolist())
    return gamma, per_call, [[s, float(t)] for s, t in zip(sizes, mean)]


def _network(fits: dict[str, LinkFit], gamma: float, check: float) -> Network:
    links = {c: LinkCost(f.alpha, f.beta) for c, f in fits.items()}
    for c in LINK_CLASSES:
        if c not in links:
            links[c] = next(iter(links.values())) if links else LinkCost(0.0, 0.0)
    return Network(links, gamma, check=check)


# The whole calls of step 6: many steps and few, one message per rank and step and many (direct's fan-out).
_PER_CALL = ("ring", "recursive_doubling", "direct")
# Each per-call timing runs calls back to back for about this long (within these counts), three times: a
# CPU quota (100 ms periods) lets a short burst run unthrottled, while training's calls are sustained.
_SUSTAIN_S, _SUSTAIN_CALLS, _SUSTAIN_REPS = 0.25, (8, 512), 3
_BOOT_ID = "/proc/sys/kernel/random/boot_id"  # one per running kernel: emulated hosts share it


def _machine_key() -> float:
    """A number naming this rank's kernel (equal for processes of one machine, containers and network
    namespaces included); NaN where the system does not say."""
    try:
        with open(_BOOT_ID) as fh:
            return float(zlib.crc32(fh.read().strip().encode()))
    except OSError:
        return math.nan


def _measure_cpus(prober, host_of: tuple[int, ...]) -> Cpus:
    """Who shares the processors that handle messages (agreed on every rank): every rank of a job whose
    hosts run on one kernel (``machine``, its cores), else the ranks of a host when some host has
    several (``host``, the fewest cores any rank sees), else nobody (``rank``)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    got = prober.gather([_machine_key(), float(cores)])
    keys, fewest = got[:, 0], float(got[:, 1].min())
    if len(set(host_of)) > 1 and not np.isnan(keys).any() and (keys == keys[0]).all():
        return Cpus("machine", fewest)
    if len(set(host_of)) < len(host_of):
        return Cpus("host", fewest)
    return Cpus("rank")


def per_call_parts(algorithm: str, nbytes: int, topology: Topology, network: Network) -> tuple[float, float, float]:
    """The α part, the summed endpoint load (what ``epsilon`` multiplies) and the rest of a call's
    prediction under ``network`` (its ``epsilon`` and ``op`` ignored)."""
    base = dataclasses.replace(network, epsilon=0.0, op=0.0)
    pred = predict_allreduce(algorithm, nbytes, topology, base)
    zero = LinkCost(0.0, 0.0)
    ends = predict_allreduce(algorithm, nbytes, topology,
                             Network({c: zero for c in LINK_CLASSES}, epsilon=1.0, cpus=network.cpus)).seconds
    return pred.terms["alpha"], ends, pred.seconds - pred.terms["alpha"]


def _measure_op(prober, plan: CalibrationPlan, network: Network,
                host_of: tuple[int, ...]) -> tuple[Network, dict]:
    """Step 6 of the protocol: ``network`` with the per-call constant, the α correction and the price
    of a message endpoint from whole all-reduces, and, per call, the agreed measured and predicted
    seconds they came from."""
    p = len(host_of)
    if p < 2:
        return network, {}
    flat, topology = prober.buffer(p), Topology(host_of)
    network = dataclasses.replace(network, cpus=_measure_cpus(prober, host_of))
    seen, calls, extra = {}, [], []
    for algorithm in _PER_CALL:
        first = prober.gather([prober.time_allreduce(algorithm, flat, 4, checked=True)]).max()  # builds, compiles
        repeat = int(min(_SUSTAIN_CALLS[1], max(_SUSTAIN_CALLS[0], math.ceil(_SUSTAIN_S / max(first, 1e-6)))))
        # Unchecked and checked in turn, so that a slow phase of a shared machine falls on both alike.
        mine = [prober.time_allreduce(algorithm, flat, repeat, checked=c)
                for _ in range(_SUSTAIN_REPS) for c in (False, True)]
        slowest = prober.gather(mine).max(axis=0).reshape(_SUSTAIN_REPS, 2)
        measured, checked = (float(np.median(slowest[:, j])) for j in range(2))
        alpha, ends, rest = per_call_parts(algorithm, 4 * p, topology, network)
        seen[algorithm] = {"measured": measured, "checked": checked, "predicted": alpha + rest, "endpoints": ends}
        calls.append((measured, alpha, ends, rest))
        extra.append(checked - measured)
    op, scale, epsilon = fit_per_call(calls)
    # What a check adds to a whole call, which back-to-back agreements alone under-state (docs/tuning.md);
    # the median over the calls, so that one call timed in a slow phase does not decide it.
    check = max(0.0, float(np.median(extra)))
    seen["fit"] = {"op": op, "alpha_scale": scale, "epsilon": epsilon, "check": check,
                   "cpus": dataclasses.asdict(network.cpus)}
    links = {c: LinkCost(network[c].alpha * scale, network[c].beta) for c in LINK_CLASSES}
    return dataclasses.replace(network, links=links, op=op, check=check, epsilon=epsilon), seen


def large_call_predictor(network: Network, topology: Topology, nbytes: int, calls: dict[str, tuple[str, int]]):
    """``predict(kappa)``: the step-7 calls' predicted seconds under ``network`` with that ``kappa``
    (``calls``: label -> (algorithm, segment bytes), in order; unchecked), as
    :func:`~ringlet.tuning.fit.fit_kappa` takes it; ``predict.under(net)``: the same under ``net``."""
    # One signature per call, evaluated under every network the fits try (predict_allreduce's seconds).
    sigs = [(allreduce_signature(a, nbytes, topology), np.array([math.inf if seg is None else float(seg)]))
            for a, seg in calls.values()]

    def under(net: Network) -> list[float]:
        return [float(sig.seconds(1, net, 4, seg)[0]) for sig, seg in sigs]

    def predict(kappa: float) -> list[float]:
        return under(dataclasses.replace(network, kappa=kappa))

    predict.under = under
    return predict


class LargeCall(NamedTuple):
    """One whole all-reduce of step 7: ``algorithm``, at the executor's own segment (``pieces`` 0) or
    cut into ``pieces`` messages per ``large_bytes`` (the same bytes as more, smaller messages)."""
    label: str
    algorithm: str
    pieces: int = 0


# The large calls of step 7. The ring and halving-doubling: the same bytes through the processors, not
# (several ranks per host) the same bytes over the uplinks. The ring again in small segments: the same
# bytes on every path as more messages, whose price per message the processors pay on the bytes' path
# where they bind (one rank per host: the calls before cannot tell).
LARGE_CALLS = (LargeCall("ring", "ring"), LargeCall("halving_doubling", "halving_doubling"),
               LargeCall("ring_segmented", "ring", 32))
# Timings of each, taken in turn; their median is used, as single large calls scatter on a shared machine.
_LARGE_REPS = 7


def _large_segment(prober, call: LargeCall, flat, nbytes: int) -> int:
    if not call.pieces:
        return prober.segment(call.algorithm, flat)
    return prober.capped(max(4, nbytes // call.pieces // 4 * 4))


def _measure_kappa(prober, plan: CalibrationPlan, network: Network,
                   host_of: tuple[int, ...]) -> tuple[Network, dict]:
    """Step 7 of the protocol: ``network`` with ``kappa`` fitted to whole unchecked all-reduces of
    ``plan.large_bytes`` per rank, and per call the agreed measured seconds and the prediction
    without it."""
    p = len(host_of)
    if p < 2 or plan.large_bytes < 4:
        return network, {}
    flat, topology = prober.buffer(plan.large_bytes // 4), Topology(host_of)
    calls = {c.label: (c.algorithm, _large_segment(prober, c, flat, plan.large_bytes // 4 * 4)) for c in LARGE_CALLS}
    predict = large_call_predictor(network, topology, plan.large_bytes, calls)

    def timed(c: LargeCall) -> float:
        return prober.time_allreduce(c.algorithm, flat, 1, segment=calls[c.label][1] if c.pieces else None)

    for c in LARGE_CALLS:
        timed(c)  # builds, compiles, touches the buffers
    # Alternated, so that a slow phase of a shared machine falls on all calls alike: kappa is read from
    # how they differ.
    mine = [timed(c) for _ in range(_LARGE_REPS) for c in LARGE_CALLS]
    slowest = prober.gather(mine).max(axis=0).reshape(_LARGE_REPS, len(LARGE_CALLS))
    seen, measured = {}, []
    for j, (c, without) in enumerate(zip(LARGE_CALLS, predict(0.0))):
        t = float(np.median(slowest[:, j]))
        seen[c.label] = {"algorithm": c.algorithm, "measured": t, "predicted": without,
                         "segment_bytes": calls[c.label][1]}
        measured.append(t)

    scale = max(network[c].beta for c in LINK_CLASSES) or 1e-9
    kappa = fit_kappa(measured, predict, scale)
    network, split = split_kappa(dataclasses.replace(network, kappa=kappa), host_of, measured, predict.under)
    seen["fit"] = {"bytes": plan.large_bytes, "kappa": kappa, "per_class": split}
    return network, seen


class _StepClock:
    """Seconds each step of the protocol took on this rank, in order (``info["step_seconds"]``)."""

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def done(self, step: str) -> None:
        now = time.perf_counter()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self.last
        self.last = now


def _measure(prober, plan: CalibrationPlan, host_of: tuple[int, ...]) -> Profile:
    clock, rt = _StepClock(), prober.rt
    fits: dict[str, LinkFit] = {}
    samples: dict[str, list] = {}
    for cls in LINK_CLASSES:
        run = _ClassRun(prober, cls, host_of, plan)
        if not run.pattern:
            continue
        got = run.measure(plan.budget_s * _BUDGET_SHARE[cls])
        fits[cls] = fit_link(got)
        samples[cls] = {"sharing": run.sharing,
                        "points": [[s.nbytes, s.steps, s.seconds] for s in got]}
        clock.done(cls)
    gamma, per_add, gamma_points = _measure_gamma(prober, plan, rt.options.segment_bytes)
    check = [prober.time_check(8) for _ in range(plan.reps)]
    check_s = float(np.median(prober.gather(check).max(axis=0)))
    clock.done("gamma")
    network, per_call = _measure_op(prober, plan, _network(fits, gamma, check_s), host_of)
    clock.done("per_call")
    network, large = _measure_kappa(prober, plan, network, host_of)
    clock.done("large")
    overhead = max((f.overhead for f in fits.values()), default=0.0)
    network, wire = measure_wire(prober, plan.large_bytes, network, host_of, overhead)
    clock.done("wire")
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "plan": plan.name,
            "seconds": clock.last - clock.t0, "step_seconds": clock.seconds,
            "segment_bytes": rt.options.segment_bytes,
            "measured": sorted(fits), "fit": {c: f.to_dict() for c, f in fits.items()},
            "op_overhead": overhead, "check_overhead": check_s,
            "samples": samples, "gamma": {"per_call": per_add, "points": gamma_points}, "per_call": per_call,
            "large_calls": large, "wire": wire, "hostnames": list(rt.hostnames)}
    return Profile(Fingerprint.of(host_of, rt.transport.name), network, info)


def calibrate(prober, plan: CalibrationPlan | str = "full", *, host_of: Sequence[int] | None = None) -> Profile:
    """Measure this job's network (see the module's protocol) with ``prober`` (a
    :class:`ringlet.engine.probe.Prober` of the job's runtime) and return its profile, identical on every
    rank. A collective of the runtime's world: every rank calls it with the same arguments, in order with
    its other collectives. ``host_of`` replaces the job's host layout (tests give several hosts to one
    machine); ``plan``: a :class:`CalibrationPlan` or a name in :data:`PLANS`. A 1-rank job measures γ
    only. ``ValueError`` for an unknown plan name or a ``host_of`` of the wrong length."""
    plan = plan_named(plan) if isinstance(plan, str) else plan
    rt = prober.rt
    layout = tuple(rt.world.host_of if host_of is None else host_of)
    if len(layout) != rt.size:
        raise ValueError(f"host_of names {len(layout)} ranks; the job has {rt.size}")

    def job() -> Profile:
        mine = _measure(prober, plan, layout)
        data = prober.broadcast_bytes(json.dumps(mine.to_dict()).encode() if rt.rank == 0 else None)
        return Profile.from_dict(json.loads(data))

    return rt.submit(job, sync=True).wait()
