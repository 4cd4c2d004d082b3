"""The calibration fit recovers known constants from synthetic timings: noise, outliers, the bounds."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ringlet.tuning.fit import LinkFit, Sample, fit_gamma, fit_link, fit_per_call, nonnegative_lstsq

SIZES = (4, 1 << 10, 16 << 10, 128 << 10, 1 << 20, 4 << 20, 16 << 20)


def synthetic(alpha, beta, overhead, sharing, *, noise=0.0, seed=0, chains=(1, 4), sizes=SIZES):
    rng = np.random.default_rng(seed)
    out = []
    for b in sizes:
        for steps in chains:
            t = overhead + steps * (alpha + sharing * b * beta)
            out.append(Sample(b, steps, sharing, t * float(np.exp(rng.normal(0, noise)))))
    return out


CASES = [  # alpha (s), beta (s/B), overhead (s), sharing: shared memory, Gloo over 10 and 1 Gbit/s
    (20e-6, 0.1e-9, 10e-6, 1),
    (150e-6, 0.8e-9, 50e-6, 2),
    (400e-6, 8e-9, 0.0, 1),
    (60e-6, 1e-9, 300e-6, 4),
]


@pytest.mark.parametrize("alpha,beta,overhead,sharing", CASES)
def test_exact_timings_give_the_constants_back(alpha, beta, overhead, sharing):
    fit = fit_link(synthetic(alpha, beta, overhead, sharing))
    assert fit.alpha == pytest.approx(alpha, rel=1e-6, abs=1e-12)
    assert fit.beta == pytest.approx(beta, rel=1e-6)
    assert fit.overhead == pytest.approx(overhead, rel=1e-6, abs=1e-12)
    assert fit.residual < 1e-9 and fit.dropped == 0 and fit.kept == 2 * len(SIZES)


@pytest.mark.parametrize("alpha,beta,overhead,sharing", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noisy_timings_give_the_constants_within_noise(alpha, beta, overhead, sharing, seed):
    fit = fit_link(synthetic(alpha, beta, overhead, sharing, noise=0.03, seed=seed))
    assert fit.alpha == pytest.approx(alpha, rel=0.15)
    assert fit.beta == pytest.approx(beta, rel=0.05)
    assert 0.0 < fit.residual < 0.1


@pytest.mark.parametrize("alpha,beta,overhead,sharing", CASES)
def test_outliers_are_dropped(alpha, beta, overhead, sharing):
    samples = synthetic(alpha, beta, overhead, sharing, noise=0.02, seed=7)
    for i in (3, 10):  # a stalled timing at 16 KiB and one at 4 MiB: several times too slow
        s = samples[i]
        samples[i] = Sample(s.nbytes, s.steps, s.sharing, s.seconds * 4)
    fit = fit_link(samples)
    assert fit.dropped == 2 and fit.kept == len(samples) - 2
    assert fit.alpha == pytest.approx(alpha, rel=0.1)
    assert fit.beta == pytest.approx(beta, rel=0.05)


def test_a_zero_latency_stays_zero_instead_of_negative():
    fit = fit_link(synthetic(0.0, 1e-9, 0.0, 1, noise=0.02, seed=3))
    assert fit.alpha >= 0 and fit.overhead >= 0 and fit.beta == pytest.approx(1e-9, rel=0.05)


def test_nonnegative_lstsq_pins_the_negative_coefficient():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([1.0, 3.0, 5.0])  # y = -1 + 2 x: the intercept is pinned to 0
    x = nonnegative_lstsq(a, y)
    assert x[0] == 0.0 and x[1] > 0
    assert nonnegative_lstsq(a, -y).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("samples,match", [
    (synthetic(1e-5, 1e-9, 0, 1)[:2], "at least 3"),
    (synthetic(1e-5, 1e-9, 0, 1, chains=(2,)), "two chain lengths"),
    (synthetic(1e-5, 1e-9, 0, 1, sizes=(4096,), chains=(1, 2, 3)), "two message sizes"),
])
def test_underdetermined_fits_are_refused(samples, match):
    with pytest.raises(ValueError, match=match):
        fit_link(samples)


@pytest.mark.parametrize("kw", [dict(nbytes=-1), dict(steps=0), dict(sharing=0),
                                dict(seconds=0.0), dict(seconds=math.inf), dict(seconds=math.nan)])
def test_bad_samples_are_refused(kw):
    args = dict(nbytes=4, steps=1, sharing=1, seconds=1e-3) | kw
    with pytest.raises(ValueError, match="bad sample"):
        Sample(**args)


@pytest.mark.parametrize("gamma,per_call", [(0.05e-9, 2e-6), (0.5e-9, 0.0), (2e-9, 20e-6)])
@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_gamma_fit(gamma, per_call, noise):
    rng = np.random.default_rng(5)
    sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20]
    secs = [(per_call + b * gamma) * float(np.exp(rng.normal(0, noise))) for b in sizes]
    g, c = fit_gamma(sizes, secs)
    assert g == pytest.approx(gamma, rel=0.1 if noise else 1e-6)
    assert c >= 0


@pytest.mark.parametrize("sizes,secs,match", [
    ([4096, 4096], [1e-6, 1e-6], "two distinct"),
    ([0, 4096], [1e-6, 2e-6], "two distinct"),
    ([1024, 4096], [1e-6], "two distinct"),
    ([1024, 4096], [1e-6, 0.0], "finite and > 0"),
    ([1024, 4096], [1e-6, math.nan], "finite and > 0"),
])
def test_gamma_fit_refuses_bad_input(sizes, secs, match):
    with pytest.raises(ValueError, match=match):
        fit_gamma(sizes, secs)


def test_link_fit_as_dict():
    d = LinkFit(1e-5, 1e-9, 2e-6, 0.01, 10, 1).to_dict()
    assert d == {"alpha": 1e-5, "beta": 1e-9, "overhead": 2e-6, "residual": 0.01, "kept": 10, "dropped": 1}


def test_gamma_without_growth_is_the_largest_sizes_time_per_byte():
    g, c = fit_gamma([4096, 65536], [1e-4, 4e-5])  # noise: the larger addition was faster
    assert g == pytest.approx(4e-5 / 65536) and c == 0.0


def test_beta_comes_from_the_bandwidth_bound_sizes():
    """A link whose mid sizes run faster than its rate (a rate limiter's burst) and whose small messages
    are stretched (a CPU quota): one relative line through all sizes gets beta low; the regime refit
    takes beta from the largest sizes and alpha from the smallest."""
    alpha, beta, overhead = 2e-3, 8.4e-9, 2e-3
    samples = []
    for nbytes in (4, 1024, 16384, 131072, 1 << 20, 4 << 20, 16 << 20):
        burst = min(nbytes, 250_000)  # sent at line rate x4
        for steps in (1, 4):
            t = overhead + steps * (alpha + (nbytes - burst) * beta + burst * beta / 4)
            samples.append(Sample(nbytes, steps, 1, t))
    fit = fit_link(samples)
    assert fit.beta == pytest.approx(beta, rel=0.03)
    assert fit.alpha == pytest.approx(alpha, rel=0.1)


@pytest.mark.parametrize("op, scale, eps", [(0.0, 1.0, 0.0), (2e-3, 0.15, 1e-4), (5e-4, 1.8, 0.0), (1e-3, 0.0, 2e-4)])
def test_per_call_fit_separates_the_call_from_its_steps_and_endpoints(op, scale, eps):
    # Many steps and few, one endpoint per step and several: the three constants are determined.
    parts = ((3e-3, 24.0, 1e-5), (1e-3, 8.0, 2e-6), (1e-3, 24.0, 2e-6), (3e-3, 6.0, 0.0))
    calls = [(op + scale * a + eps * e + rest, a, e, rest) for a, e, rest in parts]
    got = fit_per_call(calls)
    assert got == pytest.approx((op, scale, eps), abs=1e-9)


def test_per_call_fit_with_what_it_cannot_separate():
    # Endpoints proportional to the α part: it cannot tell them apart, keeps ``scale`` and no ``epsilon``.
    calls = [(2e-3 + 0.5 * a + rest, a, 4e3 * a, rest) for a, rest in ((3e-3, 1e-5), (1e-3, 2e-6))]
    assert fit_per_call(calls) == pytest.approx((2e-3, 0.5, 0.0), abs=1e-9)
    assert fit_per_call([(5e-3, 2e-3, 4.0, 0.0)]) == pytest.approx((3e-3, 1.0, 0.0))
    assert fit_per_call([(1e-3, 2e-3, 4.0, 0.0), (1e-3, 2e-3, 4.0, 0.0)]) == (0.0, 1.0, 0.0)  # never a negative op
    with pytest.raises(ValueError, match="at least one"):
        fit_per_call([])
