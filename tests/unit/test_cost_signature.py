"""Signatures (one schedule per algorithm and layout) predict what the real schedule at each size predicts."""
import numpy as np
import pytest

from ringlet.algorithms import ALLREDUCE
from ringlet.algorithms.schedule import ScheduleBuilder
from ringlet.tuning import cost
from ringlet.tuning.network import Network, Topology
from ringlet.tuning.signature import Signature, Stack

NET = Network.of(link="1gbit", latency="50us", gamma=0.25e-9)
LAYOUTS = [(0, 1, 2, 3), (0, 0, 1, 1), (0, 0, 0, 0, 1, 1, 1, 1), (0, 1, 2, 3, 4), (0, 0, 1, 1, 1), (0, 0, 0, 1, 1, 1, 2),
           tuple(range(7)), (0, 0, 0), tuple(r // 4 for r in range(16))]


def sizes(p):
    return sorted({0, 1, 2, 3, 5, 7, 13, p - 1, p, p + 1, 97, 1009, 65537, 1 << 20, 12345679})


@pytest.mark.parametrize("host_of", LAYOUTS, ids=str)
@pytest.mark.parametrize("algorithm", sorted(ALLREDUCE))
def test_signature_matches_the_real_schedule(algorithm, host_of):
    topo = Topology(host_of)
    c = cost.AllreduceCost(algorithm, topo)
    for n in sizes(len(host_of)):
        full = cost.predict_allreduce(algorithm, 4 * n, topo, NET).seconds
        assert c.predict(4 * n, NET).seconds == pytest.approx(full, rel=1e-3, abs=1e-12), n
        # Segmented, at sizes whose blocks split evenly (elsewhere a block one element larger can
        # need one more segment than its neighbours: the model's k = ceil(b/S) is not smooth there).
        even = n * c.signature.exact_below
        for seg in (4096, 1 << 16, 1 << 20):
            full = cost.predict_allreduce(algorithm, 4 * even, topo, NET, segment_bytes=seg).seconds
            assert c.predict(4 * even, NET, segment_bytes=seg).seconds == pytest.approx(full, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("algorithm", sorted(ALLREDUCE))
def test_vectorised_over_segment_sizes(algorithm):
    topo = Topology((0, 0, 1, 1, 2, 2))
    c = cost.AllreduceCost(algorithm, topo)
    segs = [None, 1 << 12, 1 << 16, 1 << 20]
    many = c.seconds(12 << 20, NET, 4, np.array([np.inf if s is None else s for s in segs], float))
    one = [c.predict(12 << 20, NET, segment_bytes=s).seconds for s in segs]
    assert list(many) == one


def test_small_counts_use_the_real_schedule_and_fractions_stay_exact():
    topo = Topology(tuple(range(6)))
    c = cost.AllreduceCost("ring", topo)
    assert c.signature.exact_below == 6
    sig, n = c.at(4)
    assert n == 1 and sig is not c.signature and sig.messages < c.signature.messages  # empty blocks dropped
    assert c.at(6) == (c.signature, 6)


def test_identical_resources_are_kept_once():
    p = 64
    sig = cost.AllreduceCost("ring", Topology(tuple(range(p)))).signature
    assert sig.steps == 2 * (p - 1) and sig.messages == 2 * (p - 1) * p
    assert len(sig.num) == sig.steps  # one transfer shape per step
    # Every host link alike (up and down), every rank's reductions alike, every rank's and every host's
    # processors alike, and the job's.
    assert len(sig.rstarts) == 5


def test_empty_schedule():
    sig = Signature.of(ScheduleBuilder("none", 3).build(), Topology((0, 1, 2)))
    assert sig.steps == 0 and sig.seconds(10, NET, 4, np.array([np.inf]))[0] == 0.0


@pytest.mark.parametrize("host_of", LAYOUTS[:6], ids=str)
def test_stacked_algorithms_match_one_by_one(host_of):
    topo = Topology(host_of)
    costs = [cost.AllreduceCost(a, topo) for a in sorted(ALLREDUCE)]
    stack = Stack([c.signature for c in costs])
    segs = np.array([np.inf, 4096.0, 1 << 20])
    n = max(c.exact_from for c in costs) * 1001
    together = stack.seconds(n, NET, 4, segs)
    for c, row in zip(costs, together):
        assert row == pytest.approx(c.seconds(4 * n, NET, 4, segs), rel=1e-12)
    with pytest.raises(ValueError):
        Stack([])
