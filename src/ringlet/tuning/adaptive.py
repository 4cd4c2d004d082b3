"""Dynamic adjustment: the cost model's constants corrected from measured collectives while training
runs, algorithm switches with hysteresis, and a proposed bucket (fusion) size. Framework-free: the
caller times its collectives, runs the one small all-reduce, logs and applies what comes back.

Protocol (every rank, at the same steps)::

    adaptive = Adaptive(model, host_of)              # model: the installed select.Model
    adaptive.track({"bucket0": nbytes0, ...})        # the ops the caller wants switch events for
    adaptive.set_gradient(total_bytes, bucket_bytes) # optional: to have bucket sizes proposed
    ... each step:
    adaptive.record(algorithm, nbytes, seconds, segment_bytes)   # per measured collective (this rank's)
    adaptive.record_backward(seconds)                            # optional, once per step
    ... every few steps (the same steps on every rank):
    summed = sum_over_ranks(adaptive.numbers())      # a fixed-length list of floats (NUMBERS of them)
    for switch in adaptive.apply(summed, step):      # identical on every rank
        log(switch); timeline.mark(switch)
    bucket = adaptive.bucket_bytes                   # re-bucket when a "bucket_bytes" switch said so

**Correction.** The corrected model is the calibrated one with each constant scaled by a factor ``f_j``.
A measurement ``y`` of an all-reduce is compared with the model's terms for it ``(α_intra, α_inter,
β_intra, β_inter, γ)`` (from :meth:`~ringlet.tuning.model.Model.predict`) under the corrected constants,
each divided by its factor (``x``), so the corrected model predicts ``x·f``: the model is linear in its
constants only piecewise (which resource binds a stage moves with them), so it is linearised at the
current factors, and ``x`` is taken again whenever they change. Factors are fitted by least squares on
relative errors (rows ``x/(x·f)``, targets ``y/(x·f)``) over a rolling window of this rank's last
``window`` measurements, weighted by age (half-life ``half_life`` measurements); a measurement whose
ratio to the prediction is off the median of its neighbours (the two measurements of the same message
before and after it; the two in order while there are fewer) by more than ``outlier``× gets weight 0
(one slow measurement does not move the model; a lasting change passes after two measurements of each
message, also one that moves small and large messages' ratios apart for good). The normal equations are
summed over ranks; :meth:`apply` solves them with a small ridge pulling towards the calibrated
constants, stronger on α than on β (what the measured sizes cannot separate, e.g. α from β at nearby
sizes, is put on the bandwidth: a link's rate is what changes while a job runs); a constant whose part
of the measured times (under the current factors) is below ``min_share`` (root mean square) is held at
its calibrated value: what the measurements cannot tell falls back to the calibration, not to a factor
fitted earlier (possibly in a change's transient). The ridge is scaled like those parts, so its pull
does not grow with a factor. The solve runs in plain Python arithmetic, so every rank gets the same
factors bit for bit.

**Switching.** The installed model (what ``"auto"`` uses) changes only at a switch: when, for some
tracked op, the corrected model's best choice beats the installed model's choice (both predicted by
the corrected model) by more than ``margin``, at ``confirmations`` consecutive agreements, and the
last switch is at least ``min_steps`` steps back. Then the corrected constants are installed and one
:class:`Switch` per tracked op whose choice changed is returned. The bucket size follows the same
rule with its own streak: the proposal minimises the communication left after the backward pass
(buckets become ready uniformly over the measured backward time and are reduced one after another).

**Re-trial.** The corrector only measures what runs, and from one algorithm's times it cannot always
tell which constant moved: a slower link between hosts and processors busier with the training both
slow the ring, and the constants that take the blame decide which algorithm looks better. So, with
``retrial`` set, it also watches the measured times against what the installed model expected of the
same messages (the mean log ratio per round, summed over the ranks). Once that level has moved by more
than ``retrial``× from where it stood after the last switch, at ``confirmations`` consecutive rounds
(rounds where the corrected model is on its way to a switch of its own are not counted: that switch
comes first) and ``min_steps`` after the last such event, :meth:`apply` installs the corrected
constants and returns a ``"trial"`` :class:`Switch`. The caller should time its candidates again (the
DDP puts ``"auto"`` on trial against the best other algorithms under :meth:`link_network`): that
measures what the model cannot attribute. The level is re-anchored after every switch, skipping the
round that straddles it.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

from .model import Choice, Model
from .network import INTER, INTRA, LinkCost, Network

__all__ = ["Adaptive", "Policy", "Switch", "FEATURES", "NUMBERS"]

FEATURES = (f"alpha.{INTRA}", f"alpha.{INTER}", f"beta.{INTRA}", f"beta.{INTER}", "gamma")
_F = len(FEATURES)
_PAIRS = [(i, j) for i in range(_F) for j in range(i, _F)]
# normal matrix (upper triangle), right-hand side, weight, backward sum and count, log-ratio sum and count
_WEIGHT = len(_PAIRS) + _F
_BACKWARD = _WEIGHT + 1
_DRIFT = _BACKWARD + 2
NUMBERS = _DRIFT + 2
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Policy:
    """How eagerly the model follows measurements (see the module doc). ``ValueError`` when out of range."""

    margin: float = 0.10
    confirmations: int = 3
    min_steps: int = 50
    window: int = 64
    half_life: float = 4.0
    outlier: float = 3.0
    ridge: tuple[float, float, float] = (0.005, 0.002, 0.002)  # for the α, β and γ factors
    min_share: float = 0.1
    bounds: tuple[float, float] = (0.02, 50.0)
    bucket_sizes: tuple[int, ...] = tuple(MIB << i for i in range(7))  # 1..64 MiB
    retrial: float = 0.0  # > 1: the ratio of measured to expected times that asks for a trial; 0: never

    def __post_init__(self) -> None:
        if not (0 <= self.margin < 1 and self.confirmations >= 1 and self.min_steps >= 0 and self.window >= 1
                and self.half_life > 0 and self.outlier > 1 and len(self.ridge) == 3 and min(self.ridge) > 0 and 0 <= self.min_share < 1
                and 0 < self.bounds[0] < 1 < self.bounds[1] and self.bucket_sizes
                and all(b >= 1 for b in self.bucket_sizes) and (self.retrial == 0 or self.retrial > 1)):
            raise ValueError(f"policy out of range: {self}")


@dataclass(frozen=True, slots=True)
class Switch:
    """A change the caller logs and marks on the timeline: ``op`` (a tracked op's key, or
    ``"bucket_bytes"``), what it was and is now, and why."""

    op: str
    old: str
    new: str
    reason: str


class Adaptive:
    """The online corrector and switch policy over ``model`` (the installed :class:`Model`) for a group
    on hosts ``host_of`` (see the module doc for the protocol). Not thread-safe: one caller thread."""

    def __init__(self, model: Model, host_of: Sequence[int], *, itemsize: int = 4, policy: Policy = Policy()):
        self.model = model
        self.host_of = tuple(host_of)
        self.itemsize = itemsize
        self.policy = policy
        self.calibrated = model.network
        self.factors = [1.0] * _F
        self.fitted = model.network
        self.installed = model.network  # the constants in force: the model's at the start, then each switch's
        self._samples: collections.deque = collections.deque(maxlen=policy.window)
        self._backward: collections.deque = collections.deque(maxlen=policy.window)
        self._features: dict = {}
        self._ops: dict[str, int] = {}
        self._gradient: int | None = None
        self.bucket_bytes: int | None = None
        self._streak = {"model": 0, "bucket": 0, "trial": 0}
        self._last = {"model": -math.inf, "bucket": -math.inf, "trial": -math.inf}
        self._expected: dict = {}          # message -> the installed model's seconds for it (op taken off)
        self._drift = [0.0, 0.0]           # this rank's log(measured / expected) sum and count since the last round
        self._anchor: float | None = None  # the level after the last switch
        self._settle = 0                   # rounds to skip before anchoring

    # ---- local measurements -------------------------------------------------------------------
    def track(self, ops: Mapping[str, int]) -> None:
        """The ops (key -> bytes) whose choice switches are reported; replaces the previous set.
        Every rank must track the same ops."""
        self._ops = {str(k): int(v) for k, v in ops.items()}

    def set_gradient(self, total_bytes: int, bucket_bytes: int) -> None:
        """Bytes reduced per step and the bucket size in use: enables bucket size proposals."""
        if total_bytes < 1 or bucket_bytes < 1:
            raise ValueError(f"need positive sizes, got {total_bytes} and {bucket_bytes}")
        self._gradient, self.bucket_bytes = int(total_bytes), int(bucket_bytes)

    def record(self, algorithm: str, nbytes: int, seconds: float, segment_bytes: int | None = None) -> None:
        """One measured all-reduce on this rank. Algorithms without a schedule (``native``), empty
        messages and non-positive times are ignored."""
        if nbytes <= 0 or not seconds > 0 or not math.isfinite(seconds):
            return
        key = (algorithm, int(nbytes), segment_bytes)
        try:
            x = self._terms(key)
        except ValueError:
            return
        seconds -= self.calibrated.op  # the per-call constant is not corrected: only what the features carry
        if sum(x) > 0 and seconds > 0:
            self._samples.append((key, float(seconds)))
            expected = self._expect(key)
            if expected > 0:
                self._drift[0] += math.log(seconds / expected)
                self._drift[1] += 1.0

    def record_backward(self, seconds: float) -> None:
        """This rank's backward time of one step (for bucket size proposals)."""
        if seconds > 0 and math.isfinite(seconds):
            self._backward.append(float(seconds))

    def _terms(self, key: tuple) -> tuple[float, ...]:
        """The message's terms per unit factor at the current factors: its parts under the fitted
        constants, each divided by its factor (so that ``Σ x·factors`` is the fitted prediction). The
        model is linear in its constants only piecewise (which resource binds a stage can change), so
        the fit is linearised where it stands, not at the calibration."""
        x = self._features.get(key)
        if x is None:
            algorithm, nbytes, segment_bytes = key
            pred = self.model.predict(Choice(algorithm, segment_bytes), nbytes, self.host_of, self.itemsize,
                                      self.fitted)
            x = self._features[key] = tuple(pred.terms[f] / k for f, k in zip(FEATURES, self.factors))
            if len(self._features) > 4096:
                self._features.pop(next(iter(self._features)))
        return x

    def _expect(self, key: tuple) -> float:
        """What the installed constants predict for the message (the per-call constant taken off)."""
        t = self._expected.get(key)
        if t is None:
            algorithm, nbytes, segment_bytes = key
            t = self._expected[key] = self.model.seconds(Choice(algorithm, segment_bytes), nbytes, self.host_of,
                                                         self.itemsize, self.installed) - self.calibrated.op
            if len(self._expected) > 4096:
                self._expected.pop(next(iter(self._expected)))
        return t

    def numbers(self) -> list[float]:
        """This rank's contribution to the agreement (:data:`NUMBERS` floats) — sum over ranks, then
        :meth:`apply`."""
        rows = []
        for key, y in self._samples:
            x = self._terms(key)
            pred = sum(a * f for a, f in zip(x, self.factors))
            rows.append(([a / pred for a in x], y / pred))
        n = len(rows)
        logs = [math.log(t) for _, t in rows]
        near = _neighbours(logs, [key for key, _ in self._samples])
        decay = 0.5 ** (1.0 / self.policy.half_life)
        mat, rhs, weight = [0.0] * len(_PAIRS), [0.0] * _F, 0.0
        for i, (a, t) in enumerate(rows):
            if abs(logs[i] - near[i]) > math.log(self.policy.outlier):
                continue
            w = decay ** (n - 1 - i)
            for k, (p, q) in enumerate(_PAIRS):
                mat[k] += w * a[p] * a[q]
            for p in range(_F):
                rhs[p] += w * a[p] * t
            weight += w
        return mat + rhs + [weight, sum(self._backward), float(len(self._backward))] + self._drift

    # ---- agreed decisions ---------------------------------------------------------------------------
    def apply(self, summed: Sequence[float], step: int) -> list[Switch]:
        """Update the corrected constants from ``summed`` (:meth:`numbers` summed over ranks) and
        return the switches made at ``step`` (the same on every rank). ``ValueError`` for a list of the
        wrong length."""
        if len(summed) != NUMBERS:
            raise ValueError(f"expected {NUMBERS} numbers, got {len(summed)}")
        summed = [float(v) for v in summed]
        self._fit(summed)
        events = self._algorithms(step)
        if summed[_BACKWARD + 1] > 0:
            events += self._bucket(step, summed[_BACKWARD] / summed[_BACKWARD + 1])
        if self.policy.retrial:
            events += self._retrial(step, summed[_DRIFT], summed[_DRIFT + 1], bool(events))
        self._drift = [0.0, 0.0]
        return events

    def _fit(self, summed: list[float]) -> None:
        weight = summed[_WEIGHT]
        if not weight > 0:
            return
        mat = [[0.0] * _F for _ in range(_F)]
        for k, (p, q) in enumerate(_PAIRS):
            mat[p][q] = mat[q][p] = summed[k]
        rhs = summed[len(_PAIRS):len(_PAIRS) + _F]
        ra, rb, rg = self.policy.ridge
        for p, r in enumerate((ra, ra, rb, rb, rg)):
            # A row holds the calibrated term: the constant's part of the times is the row times the factor,
            # and the ridge is scaled the same way, so that its pull relative to the data does not grow
            # with the factor.
            scale = self.factors[p] ** 2
            if mat[p][p] * scale < self.policy.min_share ** 2 * weight:  # too small a part to tell: the
                mat[p][p] += 1e6 * weight                                 # calibrated constant (a factor
                rhs[p] += 1e6 * weight                                    # kept could be a transient's)
            else:
                mat[p][p] += r * weight / scale
                rhs[p] += r * weight / scale  # towards the calibrated constants (factor 1)
        lo, hi = self.policy.bounds
        factors = [min(hi, max(lo, f)) for f in _solve(mat, rhs)]
        if factors != self.factors:
            self._features.clear()  # the terms are taken at the factors in force
        self.factors = factors
        c, f = self.calibrated, self.factors
        # The endpoint prices are part of the α and β terms of the transfers that pay them: they move with
        # the α and β factors of the job's slower class (between hosts, when there are several).
        slower = 1 if len(set(self.host_of)) > 1 else 0
        self.fitted = dataclasses.replace(
            c, links={INTRA: LinkCost(c[INTRA].alpha * f[0], c[INTRA].beta * f[2]),
                      INTER: LinkCost(c[INTER].alpha * f[1], c[INTER].beta * f[3])}, gamma=c.gamma * f[4],
            epsilon=c.epsilon * f[slower], kappa=c.kappa * f[2 + slower],
            kappa_inter=None if c.kappa_inter is None else c.kappa_inter * f[2 + slower])

    def link_network(self) -> Network:
        """The corrected constants with the processors' (``epsilon``, ``kappa``) at calibration: the
        hypothesis that what moved is the links. A re-trial ranks its alternatives with it, so that the
        trial measures the algorithms a slower link would favour beside what ``"auto"`` runs."""
        c = self.calibrated
        return dataclasses.replace(self.fitted, epsilon=c.epsilon, kappa=c.kappa, kappa_inter=c.kappa_inter)

    def _due(self, kind: str, better: bool, step: int) -> bool:
        """Hysteresis: ``better`` at enough consecutive agreements, and far enough from the last switch."""
        self._streak[kind] = self._streak[kind] + 1 if better else 0
        if self._streak[kind] >= self.policy.confirmations and step - self._last[kind] >= self.policy.min_steps:
            self._streak[kind], self._last[kind] = 0, step
            return True
        return False

    def _algorithms(self, step: int) -> list[Switch]:
        # The choices in force are computed from self.installed, not read from the model: ranks that share
        # one model object (threads) must not see another rank's switch before making their own.
        m, h, item = self.model, self.host_of, self.itemsize
        before = {key: m.best(n, h, item, network=self.installed).choice for key, n in sorted(self._ops.items())}
        gains = []
        for key, old in before.items():
            nbytes = self._ops[key]
            now = m.seconds(old, nbytes, h, item, self.fitted)
            best = m.best(nbytes, h, item, network=self.fitted)
            if best.seconds < now * (1 - self.policy.margin):
                gains.append(key)
        if not self._due("model", bool(gains), step):
            return []
        m.set_network(self.fitted)
        self.installed = self.fitted
        self._expected.clear()
        scale = ", ".join(f"{name} x{f:.2f}" for name, f in zip(FEATURES, self.factors) if f != 1.0)
        events = []
        for key, old in before.items():
            n = self._ops[key]
            new = m.best(n, h, item, network=self.fitted).choice
            if new != old:
                a, b = m.seconds(old, n, h, item, self.fitted), m.seconds(new, n, h, item, self.fitted)
                events.append(Switch(key, old.describe(), new.describe(),
                                     f"predicted {a * 1e3:.3f} ms -> {b * 1e3:.3f} ms; corrected: {scale or 'none'}"))
        return events

    def exposed(self, bucket_bytes: int, backward_seconds: float) -> float:
        """Predicted communication left after a backward pass of ``backward_seconds`` with buckets of
        ``bucket_bytes`` (corrected constants, each bucket at its best choice)."""
        total, item = self._gradient or 0, self.itemsize
        size = max(item, bucket_bytes // item * item)
        full, rest = divmod(total, size)
        times = {s: self.model.best(s, self.host_of, item, network=self.fitted).seconds for s in {size, rest} if s}
        done, sent = 0.0, 0
        for s in [size] * full + ([rest] if rest else []):
            sent += s
            done = max(done, backward_seconds * sent / total) + times[s]
        return max(0.0, done - backward_seconds)

    def _bucket(self, step: int, backward: float) -> list[Switch]:
        if self._gradient is None or self.bucket_bytes is None:
            return []
        cost = {b: self.exposed(b, backward) for b in self.policy.bucket_sizes}
        best = min(self.policy.bucket_sizes, key=lambda b: (cost[b], b))
        now = self.exposed(self.bucket_bytes, backward)
        if not self._due("bucket", best != self.bucket_bytes and cost[best] < now * (1 - self.policy.margin), step):
            return []
        old, self.bucket_bytes = self.bucket_bytes, best
        return [Switch("bucket_bytes", str(old), str(best),
                       f"exposed communication {now * 1e3:.3f} ms -> {cost[best] * 1e3:.3f} ms "
                       f"(backward {backward * 1e3:.1f} ms)")]

    def _retrial(self, step: int, total: float, count: float, switched: bool) -> list[Switch]:
        """A ``"trial"`` switch when the measured times moved against the installed model's (module doc)."""
        if switched:
            self._anchor, self._settle, self._streak["trial"] = None, 1, 0
            return []
        if count <= 0:
            return []
        level = total / count
        if self._settle:
            self._settle -= 1
            return []
        if self._anchor is None:
            self._anchor = level
            return []
        if abs(level - self._anchor) <= math.log(self.policy.retrial):
            self._streak["trial"] = 0
            return []
        if self._streak["model"] or self._streak["bucket"]:
            return []  # the model is about to act on it: its switch comes first (the streak waits)
        if not self._due("trial", True, step):
            return []
        old, self._anchor, self._settle = self._anchor, None, 1
        self.model.set_network(self.fitted)  # what "auto" runs on trial
        self.installed = self.fitted
        self._expected.clear()
        return [Switch("trial", f"x{math.exp(old):.2f}", f"x{math.exp(level):.2f}",
                       f"measured all-reduce times moved from x{math.exp(old):.2f} to x{math.exp(level):.2f} "
                       "of the installed model's: the algorithms go on trial again")]


def _neighbours(logs: list[float], keys: list) -> list[float]:
    """Per measurement, the median log-ratio of its neighbours: the two measurements of the same message
    (``keys``: the message's (algorithm, bytes, segment)) before and after it, or, while it has fewer
    than two such neighbours, the two measurements before and after it in order."""
    same: dict = collections.defaultdict(list)
    for i, key in enumerate(keys):
        same[key].append(i)
    out = [0.0] * len(logs)
    for idx in same.values():
        for j, i in enumerate(idx):
            around = idx[max(0, j - 2):j + 3]
            if len(around) < 3:
                around = range(max(0, i - 2), min(len(logs), i + 3))
            out[i] = statistics.median(logs[k] for k in around)
    return out


def _solve(mat: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting in Python floats (the same bits on every machine)."""
    n = len(rhs)
    a = [row[:] + [rhs[i]] for i, row in enumerate(mat)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: (abs(a[r][c]), -r))
        a[c], a[piv] = a[piv], a[c]
        if a[c][c] == 0.0:
            continue
        for r in range(c + 1, n):
            k = a[r][c] / a[c][c]
            if k:
                for j in range(c, n + 1):
                    a[r][j] -= k * a[c][j]
    x = [0.0] * n
    for r in reversed(range(n)):
        s = a[r][n] - sum(a[r][j] * x[j] for j in range(r + 1, n))
        x[r] = s / a[r][r] if a[r][r] else 0.0
    return x
