"""Fitting the network constants to timings: pure numbers, no communication.

A link-class sample is one timed chain of steps (see :mod:`ringlet.tuning.calibrate`): ``steps``
dependent steps in which every participating rank sends ``nbytes`` to its partner as one message, with
at most ``sharing`` transfers on one link. Under the timing model shared by the cost model and the
simulator it takes

    seconds = overhead + steps · (alpha + sharing · nbytes · beta)

(``overhead``: what one executed operation costs beyond its steps). :func:`fit_link` finds
``alpha``, ``beta`` and ``overhead`` (all >= 0) minimising the *relative* squared error, so that a
microsecond at 4 bytes weighs as much as a millisecond at 16 MiB, and drops outliers once. Then each
constant is refitted where it dominates (:func:`_by_regime`): the overhead and ``alpha`` on the samples
whose bandwidth part is small, ``beta`` on those where it is most of the time. Real links are not
linear in between (a rate limiter's burst lets the first few hundred kB through at line rate; a CPU
quota stretches small messages), and one line through all sizes misses both ends; measured on the
emulated cluster, ``beta`` came out 24 % low.
:func:`fit_gamma` finds the per-byte reduction cost from timed in-place additions, :func:`fit_per_call`
the per-call and per-endpoint constants from whole collectives of one element, :func:`fit_kappa` the
per-byte processor cost from whole collectives of a large size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

_OUTLIER_MADS = 5.0     # residuals beyond this many scaled median absolute deviations are outliers...
_OUTLIER_FLOOR = 0.25   # ...and beyond this relative error: small noise never makes an outlier


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed chain: ``seconds`` for ``steps`` steps of one ``nbytes`` message per transfer, with
    ``sharing`` transfers per link."""

    nbytes: int
    steps: int
    sharing: int
    seconds: float

    def __post_init__(self) -> None:
        if self.nbytes < 0 or self.steps < 1 or self.sharing < 1:
            raise ValueError(f"bad sample {self}: need nbytes >= 0 and steps, sharing >= 1")
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise ValueError(f"bad sample {self}: seconds must be finite and > 0")

    def row(self) -> tuple[float, float, float]:
        """Coefficients of (overhead, alpha, beta) in this sample's modelled time."""
        return 1.0, float(self.steps), float(self.steps * self.sharing * self.nbytes)


@dataclass(frozen=True, slots=True)
class LinkFit:
    """Fitted ``alpha`` (s), ``beta`` (s/B), ``overhead`` (s per operation); ``residual``: RMS
    relative error of the kept samples; ``kept`` / ``dropped``: how many samples the fit used/rejected."""

    alpha: float
    beta: float
    overhead: float
    residual: float
    kept: int
    dropped: int

    def to_dict(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta, "overhead": self.overhead, "residual": self.residual,
                "kept": self.kept, "dropped": self.dropped}


def nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x >= 0`` minimising ``|a x - y|``: least squares, then the most negative coefficient is pinned
    to 0 and the rest refitted until none is negative (exact for the few columns used here)."""
    free = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        if (sol >= 0).all():
            x[:] = 0.0
            x[free] = sol
            return x
        free.pop(int(np.argmin(sol)))
    return x


def _weighted(samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
    t = np.array([s.seconds for s in samples])
    a = np.array([s.row() for s in samples]) / t[:, None]
    return a, np.ones(len(samples))


def _relative_errors(x: np.ndarray, samples: Sequence[Sample]) -> np.ndarray:
    a, ones = _weighted(samples)
    return a @ x - ones


def fit_link(samples: Sequence[Sample]) -> LinkFit:
    """Fit ``overhead``, ``alpha``, ``beta`` to ``samples`` (relative least squares, non-negative), drop
    the samples whose relative error is an outlier (beyond 5 scaled MADs and 25 %) and refit once.
    ``ValueError`` with fewer than 3 samples, or without two distinct step counts and two distinct
    byte counts (the three constants are not determined then)."""
    samples = list(samples)
    if len(samples) < 3:
        raise ValueError(f"fitting alpha, beta and the overhead needs at least 3 samples, got {len(samples)}")
    if len({s.steps for s in samples}) < 2 or len({s.nbytes for s in samples}) < 2:
        raise ValueError("fitting needs samples at two chain lengths and two message sizes at least")
    a, y = _weighted(samples)
    x = nonnegative_lstsq(a, y)
    err = _relative_errors(x, samples)
    mad = 1.4826 * float(np.median(np.abs(err - np.median(err))))
    keep = np.abs(err) <= max(_OUTLIER_MADS * mad, _OUTLIER_FLOOR)
    if keep.sum() >= 3 and not keep.all():
        kept = [s for s, k in zip(samples, keep) if k]
        if len({s.steps for s in kept}) >= 2 and len({s.nbytes for s in kept}) >= 2:
            a, y = _weighted(kept)
            x = nonnegative_lstsq(a, y)
            samples = kept
            err = _relative_errors(x, samples)
        else:
            keep[:] = True
    x = _by_regime(x, samples)
    err = _relative_errors(x, samples)
    rms = float(np.sqrt(np.mean(err ** 2)))
    return LinkFit(float(x[1]), float(x[2]), float(x[0]), rms, len(samples), int((~keep).sum()))


_SMALL_SHARE, _LARGE_SHARE = 0.1, 0.85 # bandwidth part of a sample's time: latency-bound below, bandwidth-bound above


def _by_regime(x: np.ndarray, samples: Sequence[Sample]) -> np.ndarray:
    """Refit ``(overhead, alpha)`` on the latency-bound samples with ``beta`` fixed, then ``beta`` on the
    bandwidth-bound ones with the others fixed (twice; relative least squares, non-negative). A regime
    without enough samples (two chain lengths for the first, one sample for the second) keeps ``x``."""
    x = x.copy()
    rows = np.array([s.row() for s in samples])
    t = np.array([s.seconds for s in samples])
    for _ in range(2):
        modelled = rows @ x
        share = np.where(modelled > 0, rows[:, 2] * x[2] / np.maximum(modelled, 1e-30), 0.0)
        small, large = share <= _SMALL_SHARE, share >= _LARGE_SHARE
        if len({samples[i].steps for i in np.flatnonzero(small)}) >= 2:
            rest = t[small] - rows[small, 2] * x[2]
            x[:2] = nonnegative_lstsq(rows[small, :2] / t[small, None], rest / t[small])
        if large.any():
            rest = t[large] - rows[large, :2] @ x[:2]
            x[2:] = nonnegative_lstsq(rows[large, 2:] / t[large, None], rest / t[large])
    return x


def fit_gamma(nbytes: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """``(gamma, per_call)``: seconds per byte and per call of an in-place addition, from the time of one
    addition of each size (relative least squares, non-negative). Timings too noisy to show any growth
    with size (a slope of 0) give the largest size's time per byte and no per-call part (an upper
    bound). ``ValueError`` without two distinct positive sizes or with a time that is not finite and
    positive."""
    b = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if b.shape != t.shape or len(set(b[b > 0].tolist())) < 2:
        raise ValueError("fitting gamma needs timings at two distinct positive sizes at least")
    if not (np.isfinite(t).all() and (t > 0).all()):
        raise ValueError(f"addition timings must be finite and > 0, got {t.tolist()}")
    a = np.stack([np.ones_like(b), b], axis=1) / t[:, None]
    x = nonnegative_lstsq(a, np.ones_like(t))
    if x[1] <= 0:
        big = int(np.argmax(b))
        return float(t[big] / b[big]), 0.0
    return float(x[1]), float(x[0])


def fit_per_call(calls: Sequence[tuple[float, float, float, float]]) -> tuple[float, float, float]:
    """``(op, scale, epsilon)`` from whole collectives: each of ``calls`` is ``(measured, alpha_part,
    endpoint_part, rest)`` — a call's measured seconds, the α part of its prediction (the per-message
    link terms), its message endpoints summed over its steps (each step's busiest end, as the cost
    model charges ``epsilon``) and the rest (β, γ) — fitted as
    ``measured = op + scale · alpha_part + epsilon · endpoint_part + rest`` (relative least squares, all
    three >= 0). Calls that differ in steps and in endpoints per step (many steps and few; one message
    per step and many) separate them: ``scale`` corrects the per-message constants measured on chains,
    ``epsilon`` prices each message a processor handles, ``op`` is the per-call rest. When a column
    cannot be separated it is left out (``scale`` 1, ``epsilon`` 0), down to ``op`` alone: the mean
    residual (at least 0). ``ValueError`` for no calls."""
    if not calls:
        raise ValueError("fitting the per-call constant needs at least one timed call")
    m = np.array([c[0] - c[3] for c in calls], dtype=float)
    a = np.array([c[1] for c in calls], dtype=float)
    e = np.array([c[2] for c in calls], dtype=float)
    ones = np.ones_like(m)
    for cols in ((0, 1, 2), (0, 1), (0, 2)):
        mat = np.stack([ones, a, e], axis=1)[:, cols]
        if len(calls) < len(cols) or np.linalg.matrix_rank(mat) < len(cols) or (mat <= 0).all(axis=0).any():
            continue
        x = nonnegative_lstsq(mat / np.maximum(m, 1e-12)[:, None], ones)
        full = dict(zip(cols, x.tolist()))
        if full.get(1, 1.0) > 0 or full.get(2, 0.0) > 0:
            return float(full[0]), float(full.get(1, 1.0)), float(full.get(2, 0.0))
    return max(0.0, float(np.mean(m - a))), 1.0, 0.0


_GOLD = (math.sqrt(5.0) - 1.0) / 2.0  # golden-section step
# Below this change (in log) of every call's predicted ratio to the first, between no processor bound and
# a full or the fitted one, a processor bound only scales the calls: it cannot be told from slow links.
_KAPPA_SPAN = 0.1


def _span(free: np.ndarray, predict: Callable[[float], Sequence[float]], best: float, scale: float) -> float:
    """How far (in log) a processor bound moves any call's predicted ratio to the first call's: the most
    over the other calls and over two bounds, the fitted ``best`` and a full one (``4·scale``). A ring
    against halving-doubling on several ranks per host shows it at the full bound; the same algorithm
    in small segments against whole messages shows it at the fitted one, where the processors' price
    per message, on the bytes' path, is no longer hidden under the links' time."""
    out = 0.0
    for kappa in (best, 4.0 * scale):
        bound = np.asarray(predict(kappa), dtype=float)
        if (bound > 0).all():
            out = max(out, float(np.abs(np.log((free[0] / free[1:]) / (bound[0] / bound[1:]))).max()))
    return out


def fit_kappa(measured: Sequence[float], predict: Callable[[float], Sequence[float]], scale: float) -> float:
    """``kappa`` (s per byte at a message endpoint) from whole collectives of a large size: the value
    ``>= 0`` whose predictions ``predict(kappa)`` (one per call, in the order of ``measured``) have the
    least summed squared relative error against ``measured``. ``scale`` is the size of a plausible value
    (the slowest link class's β): candidates run from 0 through ``4·scale`` on a geometric grid, then
    the best is refined between its neighbours. Calls that make the processors handle the same bytes
    but put different amounts on the links (a ring against halving-doubling on several ranks per host),
    or the same bytes as more messages (the ring in small segments), tell a processor bound from a
    slow link; where the links explain them, the answer is 0. So is it where the calls are alike in
    how they load processors and links (two whole calls on one rank per host): then a processor bound
    moves their predictions in proportion (no call's ratio to the first, at ``4·scale`` or at the best
    value, differs from the one at 0 by ``_KAPPA_SPAN`` in log), and what they say is only that all
    run slower than the chains' constants, which is no evidence about processors. Where they differ,
    ``kappa`` must still fit better than one common factor on the predictions without it.
    ``ValueError`` for no calls, a timing that is not finite and > 0, or ``scale <= 0``."""
    m = np.asarray(measured, dtype=float)
    if m.size == 0 or not (np.isfinite(m).all() and (m > 0).all()):
        raise ValueError(f"the large calls' timings must be finite and > 0, got {m.tolist()}")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be finite and > 0, got {scale}")

    def loss(kappa: float) -> float:
        return float((((np.asarray(predict(kappa), dtype=float) - m) / m) ** 2).sum())

    grid = np.concatenate([[0.0], scale * np.geomspace(1e-3, 4.0, 97)])
    losses = [loss(k) for k in grid]
    i = int(np.argmin(losses))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    for _ in range(40):  # golden-section search between the best grid point's neighbours
        a, b = hi - _GOLD * (hi - lo), lo + _GOLD * (hi - lo)
        if loss(a) <= loss(b):
            hi = b
        else:
            lo = a
    best = (lo + hi) / 2
    if loss(best) > losses[i]:
        best = grid[i]
    # Below the value at which the processors bind, kappa changes no prediction: say 0, not noise.
    if losses[0] <= loss(best) * (1 + 1e-9):
        return 0.0
    # kappa must explain how the calls differ, not only how slow all of them are: the layout must let it (a
    # processor bound, full or as fitted, changes how some call compares with the first), and one common
    # factor on the predictions without it (links slower at length than the chains said) must fit worse.
    free = np.asarray(predict(0.0), dtype=float)
    if m.size < 2 or not (free > 0).all() or _span(free, predict, best, scale) < _KAPPA_SPAN:
        return 0.0
    r = free / m
    common = float((((r.sum() / (r * r).sum()) * r - 1.0) ** 2).sum())
    return float(best) if loss(best) < common else 0.0
