"""Dynamic adjustment: corrections from measured collectives, switches with hysteresis, bucket sizes,
re-trials where the model cannot attribute a move, identical decisions on every rank."""
import math
import random

import pytest

from ringlet.tuning import select
from ringlet.tuning.adaptive import NUMBERS, Adaptive, Policy, Switch
from ringlet.tuning.network import INTER, INTRA, LinkCost, Network

BASE = Network.of(link="1gbit", latency="50us", gamma=0.25e-9)
SLOW = Network({INTRA: BASE[INTRA], INTER: LinkCost(BASE[INTER].alpha, BASE[INTER].beta * 10)}, BASE.gamma)
POLICY = Policy(confirmations=3, min_steps=10)
RETRIAL = Policy(confirmations=3, min_steps=10, retrial=1.4)


def scaled(net, k):
    """Every constant of ``net`` times ``k``: every time moves alike, no choice changes."""
    return Network({c: LinkCost(net[c].alpha * k, net[c].beta * k) for c in (INTRA, INTER)}, net.gamma * k)


def layout(hosts, per_host):
    return tuple(r // per_host for r in range(hosts * per_host))


def ops_that_flip(host_of, sizes, gain=0.2):
    """Sizes whose base choice is slower than the slow network's best by more than ``gain`` there."""
    a, b = select.Model(BASE), select.Model(SLOW)
    return {f"op{n}": n for n in sizes
            if b.seconds(a.choose(n, host_of), n, host_of) * (1 - gain) > b.best(n, host_of).seconds}


class World:
    """``p`` ranks, each with its own model and corrector, measuring the same ops on ``truth``."""

    def __init__(self, p, host_of, ops, policy=POLICY, seed=0):
        self.models = [select.Model(BASE) for _ in range(p)]
        self.ranks = [Adaptive(m, host_of, policy=policy) for m in self.models]
        for a in self.ranks:
            a.track(ops)
        self.host_of, self.ops, self.rng = host_of, ops, random.Random(seed)

    def step(self, step, truth, noise=0.05, spike=0.0):
        for model, a in zip(self.models, self.ranks):
            for n in self.ops.values():
                choice = model.choose(n, self.host_of)
                t = model.seconds(choice, n, self.host_of, network=truth) * math.exp(self.rng.gauss(0, noise))
                if self.rng.random() < spike:
                    t *= 5
                a.record(choice.algorithm, n, t, choice.segment_bytes)
        summed = [sum(col) for col in zip(*(a.numbers() for a in self.ranks))]
        events = [a.apply(summed, step) for a in self.ranks]
        assert all(e == events[0] for e in events)  # every rank decides the same
        return events[0]


@pytest.mark.parametrize("host_of", [layout(4, 1), layout(2, 2), layout(5, 1), layout(4, 2)], ids=str)
def test_ten_times_worse_bandwidth_switches_within_the_bound(host_of):
    ops = ops_that_flip(host_of, [1 << k for k in range(8, 27)])
    assert ops, "the slow network must change some choice"
    world = World(4, host_of, ops)
    switched = []
    for step in range(60):
        events = world.step(step, BASE if step < 20 else SLOW)
        switched += [(step, e) for e in events]
    assert switched and all(s >= 20 for s, _ in switched)
    first = switched[0][0]
    assert first <= 20 + POLICY.confirmations + 3  # a lasting change passes after two measurements
    truth = select.Model(SLOW)
    for key, n in ops.items():  # the choice is now (within the margin) the best on the slow network
        now = world.models[0].choose(n, host_of)
        assert truth.seconds(now, n, host_of) <= truth.best(n, host_of).seconds * (1 + POLICY.margin), key
        fitted = world.models[0].seconds(now, n, host_of, network=world.ranks[0].fitted)
        assert fitted == pytest.approx(truth.seconds(now, n, host_of), rel=0.1), key  # fits what it measures
    assert all(isinstance(e, Switch) and e.old != e.new and "ms" in e.reason for _, e in switched)


def test_sizes_far_apart_separate_latency_from_bandwidth():
    host_of = layout(4, 1)
    ops = {f"op{k}": 1 << k for k in range(4, 27, 4)}  # 16 B .. 64 MiB
    world = World(2, host_of, ops, seed=3)
    for step in range(12):
        world.step(step, SLOW)
    f = world.ranks[0].factors
    assert f[3] == pytest.approx(10, rel=0.15) and f[1] == pytest.approx(1, rel=0.25)


@pytest.mark.parametrize("host_of", [layout(4, 1), layout(2, 2), layout(5, 1), layout(4, 2)], ids=str)
def test_a_move_the_model_cannot_attribute_asks_for_a_trial(host_of):
    """Every constant 2x from step 20 and back at 50: nothing is worth a switch, so the corrector asks for
    a trial after each move (within the bound), once, and installs its corrected constants with it."""
    ops = {f"op{k}": 1 << k for k in range(10, 26, 3)}
    world = World(2, host_of, ops, policy=RETRIAL)
    events = []
    for step in range(90):
        events += [(step, e) for e in world.step(step, scaled(BASE, 2.0) if 20 <= step < 50 else BASE)]
    assert [e.op for _, e in events] == ["trial", "trial"]
    (first, up), (second, down) = events
    assert 20 <= first <= 20 + RETRIAL.confirmations + 2 and 50 <= second <= 50 + RETRIAL.confirmations + 2
    ratios = [float(x[1:]) for x in (up.old, up.new, down.old, down.new)]  # against the installed constants,
    assert ratios == pytest.approx([1, 2, 1, 0.5], rel=0.1)                  # which the first trial corrected
    assert "trial" in up.reason
    assert world.models[0].network == world.ranks[0].installed != world.ranks[0].calibrated


@pytest.mark.parametrize("host_of", [layout(4, 1), layout(2, 2), layout(5, 1), layout(4, 2)], ids=str)
def test_a_move_the_model_can_attribute_switches_without_a_trial(host_of):
    ops = ops_that_flip(host_of, [1 << k for k in range(8, 27)])
    world = World(4, host_of, ops, policy=RETRIAL)
    ops_switched = {e.op for step in range(60) for e in world.step(step, BASE if step < 20 else SLOW)}
    assert ops_switched and "trial" not in ops_switched


@pytest.mark.parametrize("seed", range(3))
def test_noise_and_spikes_ask_for_no_trial(seed):
    world = World(2, layout(2, 2), {f"op{k}": 1 << k for k in range(10, 26, 3)}, seed=seed, policy=RETRIAL)
    assert all(world.step(step, BASE, noise=0.15, spike=0.05) == [] for step in range(150))


@pytest.mark.parametrize("seed", range(3))
def test_noise_and_spikes_do_not_flap(seed):
    host_of = layout(2, 2)
    ops = {f"op{k}": 1 << k for k in range(10, 26, 3)}
    world = World(2, host_of, ops, seed=seed)
    for step in range(150):
        assert world.step(step, BASE, noise=0.15, spike=0.05) == []
    assert all(abs(f - 1) < 0.3 for f in world.ranks[0].factors)


def test_at_most_one_switch_per_min_steps():
    host_of = layout(4, 1)
    ops = ops_that_flip(host_of, [1 << k for k in range(8, 27)])
    world = World(2, host_of, ops, policy=Policy(confirmations=1, min_steps=25))
    steps = []
    for step in range(100):  # the link flips every 5 steps: the model may switch only every 25
        steps += [step for _ in world.step(step, SLOW if (step // 5) % 2 else BASE)[:1]]
    assert steps and all(b - a >= 25 for a, b in zip(steps, steps[1:]))


def test_identical_summed_numbers_give_identical_decisions():
    host_of = layout(2, 2)
    ops = ops_that_flip(host_of, [1 << k for k in range(8, 27)])
    a, b = (Adaptive(select.Model(BASE), host_of, policy=Policy(confirmations=1, min_steps=0)) for _ in range(2))
    for x in (a, b):
        x.track(ops)
    rng = random.Random(1)
    for n in ops.values():  # different local measurements on the two ranks
        a.record("ring", n, 5 * rng.random() * n * 8e-8)
        b.record("tree", n, 3 * rng.random() * n * 8e-8)
    summed = [u + v for u, v in zip(a.numbers(), b.numbers())]
    assert a.apply(summed, 7) == b.apply(summed, 7)
    assert a.factors == b.factors and a.fitted == b.fitted and a.model.network == b.model.network


def test_bucket_size_follows_the_overlap():
    net = Network.of(link="10gbit", latency="50us", gamma=0.25e-9)
    a = Adaptive(select.Model(net), layout(4, 1), policy=Policy(confirmations=2, min_steps=0))
    a.set_gradient(100 << 20, 25 << 20)
    a.record_backward(5.0)  # long backward: everything but the last bucket overlaps; small buckets win
    events = [e for step in range(3) for e in a.apply(a.numbers(), step)]
    assert len(events) == 1 and events[0].op == "bucket_bytes" and a.bucket_bytes < 25 << 20
    assert a.exposed(a.bucket_bytes, 5.0) < a.exposed(25 << 20, 5.0)
    b = Adaptive(select.Model(net), layout(4, 1), policy=Policy(confirmations=2, min_steps=0))
    b.set_gradient(100 << 20, 1 << 20)
    b.record_backward(1e-4)  # nothing to overlap with: fewer, larger buckets pay fewer rounds
    events = [e for step in range(3) for e in b.apply(b.numbers(), step)]
    assert len(events) == 1 and b.bucket_bytes > 1 << 20


def test_ignored_measurements():
    a = Adaptive(select.Model(BASE), layout(2, 2))
    for alg, n, t in (("native", 1024, 1e-3), ("ring", 0, 1e-3), ("ring", 1024, 0.0), ("ring", 1024, math.nan)):
        a.record(alg, n, t)
    assert a.numbers() == [0.0] * NUMBERS
    assert a.apply(a.numbers(), 0) == [] and a.factors == [1.0] * 5


def test_bad_input():
    a = Adaptive(select.Model(BASE), layout(2, 2))
    with pytest.raises(ValueError, match="expected"):
        a.apply([0.0], 0)
    with pytest.raises(ValueError):
        a.set_gradient(0, 1)
    for bad in ({"margin": 1.0}, {"confirmations": 0}, {"outlier": 1.0}, {"bounds": (2.0, 3.0)},
                {"bucket_sizes": ()}, {"retrial": 1.0}, {"retrial": 0.5}):
        with pytest.raises(ValueError):
            Policy(**bad)


def test_the_per_call_constant_is_taken_off_before_correcting():
    """Times that are the calibrated prediction (per-call constant included) leave every factor at 1."""
    base = Network(BASE.links, BASE.gamma, op=4e-3)
    host_of, model = layout(4, 1), select.Model(base)
    a = Adaptive(model, host_of, policy=POLICY)
    sizes = {"small": 4096, "big": 64 << 20}
    a.track(sizes)
    for step in range(30):
        for n in sizes.values():
            choice = model.choose(n, host_of)
            a.record(choice.algorithm, n, model.seconds(choice, n, host_of), choice.segment_bytes)
        a.apply(a.numbers(), step)
    assert a.factors == pytest.approx([1.0] * 5, abs=1e-6) and a.fitted.op == base.op


def test_the_link_hypothesis_keeps_the_processors_calibrated():
    """``link_network``: the corrected links with ``epsilon`` and ``kappa`` as calibrated (the corrected
    model moves them with the links between hosts)."""
    base = Network(BASE.links, BASE.gamma, epsilon=20e-6, kappa=0.5e-9)
    slow = Network(SLOW.links, SLOW.gamma, epsilon=20e-6, kappa=0.5e-9)
    host_of = layout(4, 1)
    model = select.Model(base)
    a = Adaptive(model, host_of, policy=POLICY)
    for step in range(12):
        for n in (1 << 16, 1 << 22, 1 << 25):
            choice = model.choose(n, host_of)
            a.record(choice.algorithm, n, model.seconds(choice, n, host_of, network=slow), choice.segment_bytes)
        a.apply(a.numbers(), step)
    link = a.link_network()
    assert a.fitted.kappa > base.kappa and a.fitted.epsilon != base.epsilon  # moved with the links' factors
    assert (link.kappa, link.epsilon) == (base.kappa, base.epsilon) and link.links == a.fitted.links
