"""A processor price per link class (``kappa_inter``): the endpoints of inter-host transfers priced apart
from those within a host — the closed form, the signature against the real schedule, the simulator, the
constants table, the adaptive correction, and calibration's rule that splits a fitted ``kappa``
(:func:`ringlet.tuning.wire.split_kappa`)."""
import dataclasses

import numpy as np
import pytest

from ringlet import sim
from ringlet.algorithms import ALLREDUCE
from ringlet.tuning import cost, select
from ringlet.tuning.adaptive import Adaptive
from ringlet.tuning.calibrate import LARGE_CALLS, large_call_predictor
from ringlet.tuning.network import INTER, INTRA, Cpus, LinkCost, Network, Topology
from ringlet.tuning.signature import Signature, Stack
from ringlet.tuning.wire import split_kappa

NS = 1e-9
LINKS = {INTRA: LinkCost(50e-6, 1.0 * NS), INTER: LinkCost(50e-6, 0.95 * NS)}
SINGLE = Network(LINKS, cpus=Cpus("machine", 2.0), kappa=0.35 * NS, epsilon=20e-6)
SPLIT = dataclasses.replace(SINGLE, kappa=0.25 * NS, kappa_inter=0.5 * NS)
TWO_BY_TWO, FLAT4 = Topology((0, 0, 1, 1)), Topology((0, 1, 2, 3))
ALGOS = ["ring", "tree", "halving_doubling", "recursive_doubling", "direct", "hierarchical", "torus"]
MIB16 = 16 << 20


def seconds(algorithm, topo, net, nbytes=MIB16, segment=None):
    return cost.predict_allreduce(algorithm, nbytes, topo, net, segment_bytes=segment).seconds


@pytest.mark.parametrize("algorithm", ALGOS)
@pytest.mark.parametrize("segment", [None, 1 << 20])
def test_kappa_inter_equal_to_kappa_changes_nothing(algorithm, segment):
    same = dataclasses.replace(SINGLE, kappa_inter=SINGLE.kappa)
    for topo in (TWO_BY_TWO, FLAT4):
        assert seconds(algorithm, topo, same, segment=segment) == pytest.approx(
            seconds(algorithm, topo, SINGLE, segment=segment), rel=1e-12)


def test_the_intra_shift_step_pays_kappa_and_an_inter_one_kappa_inter():
    # One step, four transfers, 8 endpoints over 2 cores (a load of 4): within hosts at 4·kappa,
    # between hosts at 4·kappa_inter (the links are cheaper than either).
    free = dataclasses.replace(SPLIT, links={c: LinkCost(0.0, 0.01 * NS) for c in (INTRA, INTER)}, epsilon=0.0)
    from ringlet.tuning.patterns import chain, shift_pattern
    b = 1 << 20
    for cls, per_byte in ((INTRA, 4 * free.kappa), (INTER, 4 * free.kappa_inter)):
        sched = chain(shift_pattern(TWO_BY_TWO.host_of, cls), 4, b // 4, 1)
        assert cost.predict(sched, TWO_BY_TWO, free).seconds == pytest.approx(b * per_byte, rel=1e-9)


@pytest.mark.parametrize("algorithm", ALGOS)
def test_the_signature_at_any_size_is_the_real_schedule(algorithm):
    c = cost.AllreduceCost(algorithm, TWO_BY_TWO)
    for n in (4096 * 7, 1 << 20):
        for seg in (None, 64 << 10):
            full = cost.predict_allreduce(algorithm, 4 * n, TWO_BY_TWO, SPLIT, segment_bytes=seg).seconds
            assert c.predict(4 * n, SPLIT, segment_bytes=seg).seconds == pytest.approx(full, rel=1e-6)


def test_a_stack_prices_as_its_signatures():
    sigs = [cost.AllreduceCost(a, TWO_BY_TWO).signature for a in ALGOS]
    n, segs = 1 << 22, np.array([np.inf, 1 << 20])
    got = Stack(sigs).seconds(n, SPLIT, 4, segs)
    for i, s in enumerate(sigs):
        assert got[i] == pytest.approx(s.seconds(n, SPLIT, 4, segs), rel=1e-9)


@pytest.mark.parametrize("algorithm", ["ring", "halving_doubling", "hierarchical", "direct"])
def test_dearer_inter_endpoints_slow_what_crosses_hosts_and_the_simulator_agrees(algorithm):
    dear = dataclasses.replace(SPLIT, kappa_inter=2 * SPLIT.kappa_inter)
    assert seconds(algorithm, TWO_BY_TWO, dear) > seconds(algorithm, TWO_BY_TWO, SPLIT)
    schedule = ALLREDUCE[algorithm](4, 4096, TWO_BY_TWO.host_of)
    for net in (SPLIT, dear):  # unsegmented, every transfer of a step alike in size: the same sum
        got = sim.replay(schedule, TWO_BY_TWO, dataclasses.replace(net, epsilon=0.0)).seconds
        model = cost.predict(schedule, TWO_BY_TWO, dataclasses.replace(net, epsilon=0.0)).seconds
        assert got == pytest.approx(model, rel=0.02)


def test_the_constants_table_round_trips_kappa_inter():
    assert Network.from_dict(SPLIT.to_dict()) == SPLIT
    assert Network.from_dict(SINGLE.to_dict()) == SINGLE and SINGLE.kx == SINGLE.kappa
    old = SINGLE.to_dict()
    del old["kappa_inter"]
    assert Network.from_dict(old) == SINGLE  # profiles from before: one price
    assert "between hosts" in SPLIT.table() and "between hosts" not in SINGLE.table()
    for bad in (-1e-9, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="kx must be finite"):
            dataclasses.replace(SINGLE, kappa_inter=bad)


def test_the_corrector_moves_kappa_inter_with_kappa():
    # Processors twice as slow as calibrated on a processor-bound 2 x 2: both prices move with the
    # inter-host beta factor, and their ratio stays as calibrated.
    host_of = TWO_BY_TWO.host_of
    truth = dataclasses.replace(SPLIT, kappa=2 * SPLIT.kappa, kappa_inter=2 * SPLIT.kappa_inter)
    model = select.Model(SPLIT)
    adaptive = Adaptive(model, host_of)
    ops = [1 << k for k in range(4, 27, 2)]
    for step in range(12):
        for n in ops:
            choice = model.choose(n, host_of)
            adaptive.record(choice.algorithm, n, model.seconds(choice, n, host_of, network=truth),
                            choice.segment_bytes)
        adaptive.apply(adaptive.numbers(), step)
    fitted = adaptive.fitted
    assert fitted.kappa_inter / fitted.kappa == pytest.approx(SPLIT.kappa_inter / SPLIT.kappa)
    assert fitted.kappa_inter == pytest.approx(truth.kappa_inter, rel=0.15)
    assert adaptive.link_network().kappa_inter == SPLIT.kappa_inter


# split_kappa: the calls are predicted with a "truth" network; calibration's single kappa fit is given.
CALLS = (("ring", None), ("halving_doubling", None), ("ring", MIB16 // 32))


def _predict(net):
    return [seconds(a, TWO_BY_TWO, net, segment=seg) for a, seg in CALLS]


def test_split_kappa_recovers_a_dearer_inter_price():
    truth = dataclasses.replace(SPLIT, kappa=0.25 * NS)  # the intra shift's bound is 1.0 / 4 = 0.25 ns/B
    measured = _predict(truth)
    fitted = dataclasses.replace(SINGLE, kappa=0.4 * NS)  # what one kappa made of these calls
    out, seen = split_kappa(fitted, TWO_BY_TWO.host_of, measured, _predict)
    assert seen["split"] and seen["intra_bound"] == pytest.approx(0.25 * NS)
    assert out.kappa == pytest.approx(0.25 * NS) and out.kappa_inter == pytest.approx(0.5 * NS, rel=0.02)


def test_split_kappa_keeps_a_kappa_the_intra_shift_allows():
    fitted = dataclasses.replace(SINGLE, kappa=0.26 * NS)  # within 10% of the bound 0.25
    out, seen = split_kappa(fitted, TWO_BY_TWO.host_of, _predict(fitted), _predict)
    assert out is fitted and not seen["split"]


@pytest.mark.parametrize("host_of", [(0, 1, 2, 3), (0, 0, 0, 0)])
def test_split_kappa_needs_both_link_classes(host_of):
    out, seen = split_kappa(SINGLE, host_of, [1.0, 1.0, 1.0], _predict)
    assert out is SINGLE and seen == {}


@pytest.mark.parametrize("host_of", [(0, 1, 2, 3), (0, 0, 1, 1), (0, 0, 1, 1, 1)], ids=str)
def test_step_seven_predictor_gives_what_predict_allreduce_gives(host_of):
    # The calibration's fits evaluate one signature per large call under every network they try; the
    # seconds are predict_allreduce's (unchecked), for any kappa and per-class price.
    topo, nbytes = Topology(host_of), 4 * 3 * 5 * 7 * 1024
    calls = {c.label: (c.algorithm, nbytes // 32 if c.pieces else None) for c in LARGE_CALLS}
    base = Network({INTRA: LinkCost(20e-6, 0.3e-9), INTER: LinkCost(90e-6, 1.1e-9)}, 0.1e-9,
                   cpus=Cpus("machine", 2.0), epsilon=30e-6)
    predict = large_call_predictor(base, topo, nbytes, calls)
    for net in (dataclasses.replace(base, kappa=k) for k in (0.0, 0.4e-9, 2e-9)):
        want = [cost.predict_allreduce(a, nbytes, topo, net, segment_bytes=s).seconds for a, s in calls.values()]
        assert predict(net.kappa) == pytest.approx(want, rel=1e-12)
        split = dataclasses.replace(net, kappa_inter=3e-9)
        assert predict.under(split) == pytest.approx(
            [cost.predict_allreduce(a, nbytes, topo, split, segment_bytes=s).seconds for a, s in calls.values()], rel=1e-12)
