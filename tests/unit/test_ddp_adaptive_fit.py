"""The corrector under the DDP's measurements (:mod:`ringlet.tuning.adaptive`): across a lasting change of the
network (latency, bandwidth or both 5-10x) the fit ends up predicting what it measures, for messages of
nearby sizes (a DDP's buckets), far apart, or one. Each of these failed before the fixes it checks: a
constant's part of the times and the ridge are judged under the current factors (a factor grown 10x no
longer looks unobservable, nor is it pulled back as if it were), an unobservable constant falls back to
its calibrated value (not to a factor fitted in the change's transient), and outliers are judged against
earlier measurements of the same message (a change that moves small messages' ratios away from large
ones' is not an outlier for good)."""
from __future__ import annotations

import pytest

from ringlet.tuning import select
from ringlet.tuning.adaptive import Adaptive, Policy
from ringlet.tuning.network import INTER, INTRA, LinkCost, Network

BASE = Network.of(link="10gbit", latency="20us", intra_link="10gbit", intra_latency="20us", gamma=1e-9)


def scaled(alpha=1.0, beta=1.0):
    return Network({c: LinkCost(BASE[c].alpha * alpha, BASE[c].beta * beta) for c in (INTRA, INTER)}, BASE.gamma)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("after", [scaled(alpha=10), scaled(beta=10), scaled(alpha=5, beta=5)], ids=["alpha", "beta", "both"])
@pytest.mark.parametrize("sizes", [[4128, 66560, 131584, 263168], [4, 4 << 10, 4 << 20], [4 * 249_989]], ids=["buckets", "spread", "one"])
def test_the_fit_predicts_what_it_measures_after_a_change(p, after, sizes):
    host_of = (0,) * p
    model = select.Model(BASE)
    a = Adaptive(model, host_of, policy=Policy(confirmations=2, min_steps=10, half_life=16, bucket_sizes=(1 << 20,)))
    a.track({f"m{n}": n for n in sizes})
    for step in range(100):  # the window (64 measurements) then holds the new conditions only
        truth = BASE if step < 16 else after
        for n in sizes:
            c = model.choose(n, host_of)
            a.record(c.algorithm, n, model.seconds(c, n, host_of, network=truth), c.segment_bytes)
        if step % 2 == 0:
            a.apply(a.numbers(), step)
    for n in sizes:
        c = model.choose(n, host_of)
        assert model.seconds(c, n, host_of, network=a.fitted) == pytest.approx(
            model.seconds(c, n, host_of, network=after), rel=0.05), n
