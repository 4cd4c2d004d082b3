"""The replay engine and the one-row API: pipelining, link serialisation, other collectives, bad input."""
from __future__ import annotations

import math

import pytest

from ringlet.algorithms.schedule import ScheduleBuilder
from ringlet.sim import COLLECTIVES, REPLAY, Auto, Fixed, SimResult, policy, replay, simulate
from ringlet.tuning.network import INTER, Network, Topology

NET = Network.of(link="10gbit", latency="20us")
NET_G = Network.of(link="10gbit", latency="20us", gamma=1 / 5e9)
A, B = NET[INTER].alpha, NET[INTER].beta


def chain(p: int, count: int):
    """A pipeline broadcast: rank s sends the whole vector to rank s+1 at step s."""
    b = ScheduleBuilder("chain", p)
    for s in range(p - 1):
        b.new_step()
        b.add(s, s + 1, 0, count)
    return b.build()


@pytest.mark.parametrize("p", [2, 3, 7, 16])
@pytest.mark.parametrize("segment", [None, 1 << 12, 1 << 16, 3000])
def test_chain_pipelines_segments(p, segment):
    """Over distinct links a chain of p-1 steps with k segments takes (p-1 + k-1)·(α + (b/k)β)."""
    nbytes = 1 << 20
    r = replay(chain(p, nbytes // 4), Topology.uniform(p, 1), NET, segment_bytes=segment)
    k = 1 if segment is None else math.ceil(nbytes / segment)
    assert r.seconds == pytest.approx((p - 1 + k - 1) * (A + nbytes / k * B), rel=1e-9)
    assert (r.steps, r.transfers, r.largest, r.segment_bytes) == (p - 1, p - 1, nbytes, segment)


@pytest.mark.parametrize("p", [2, 5, 8])
def test_ring_segments_do_not_beat_the_link(p):
    """A ring uses the same links every step: segments add latency and cannot beat 2(p-1)/p·nβ per link."""
    topo, n = Topology.uniform(p, 1), 1 << 24
    whole = simulate("allreduce", "ring", n, topo, NET)
    cut = simulate("allreduce", "ring", n, topo, NET, 1 << 16)
    assert cut.seconds >= whole.seconds
    assert cut.seconds >= 2 * (p - 1) / p * n * B


def test_segments_hide_the_reduction():
    """With γ > 0, segments let the reduction of one segment overlap the transfer of the next: a ring
    whose reductions run at the link's speed takes about 2(p-1)(kα + bβ) instead of 2(p-1)(α + bβ) + (p-1)bγ."""
    net = Network(NET.links, gamma=B)
    topo, n, p = Topology.uniform(4, 1), 1 << 24, 4
    whole = simulate("allreduce", "ring", n, topo, net)
    cut = simulate("allreduce", "ring", n, topo, net, 1 << 20)
    b, k = n / p, 4
    assert whole.seconds == pytest.approx(2 * (p - 1) * (A + b * B) + (p - 1) * b * B)
    assert cut.seconds == pytest.approx(2 * (p - 1) * (k * A + b * B), rel=0.05)


def test_pipelined_tree_beats_whole_tree_at_large_sizes():
    topo, n = Topology.uniform(64, 1), 1 << 26
    whole = simulate("allreduce", "tree", n, topo, NET)
    auto = simulate("allreduce", "tree", n, topo, NET, "auto")
    assert auto.segment_bytes is not None and auto.seconds < 0.6 * whole.seconds


@pytest.mark.parametrize("p", [2, 3, 8, 13])
@pytest.mark.parametrize("collective_name", ["allgather", "reduce_scatter"])
def test_ring_phases_agree_with_the_formula(p, collective_name):
    """Ring all-gather / reduce-scatter of a total of n bytes: (p-1)(α + n/p·β) (+ (p-1)/p·nγ to reduce)."""
    n = 4 * p * 1000
    g = NET_G.gamma if collective_name == "reduce_scatter" else 0.0
    r = simulate(collective_name, "ring", n, Topology.uniform(p, 1), NET_G)
    assert r.seconds == pytest.approx((p - 1) * (A + n / p * B + n / p * g), rel=1e-6)
    assert r.factor == pytest.approx((p - 1) / p)


@pytest.mark.parametrize("p", [2, 5, 8, 16])
def test_binomial_broadcast_takes_log_rounds(p):
    n = 1 << 20
    r = simulate("broadcast", "binomial", n, Topology.uniform(p, 1), NET)
    rounds = math.ceil(math.log2(p))
    assert r.steps == rounds and r.seconds == pytest.approx(rounds * (A + n * B), rel=1e-9)
    assert r.busbw == pytest.approx(r.algbw)


@pytest.mark.parametrize("p", [2, 3, 8])
def test_pairwise_alltoall(p):
    n = 4 * p * 256
    r = simulate("alltoall", "pairwise", n, Topology.uniform(p, 1), NET)
    assert r.steps == p - 1 and r.seconds == pytest.approx((p - 1) * (A + n / p * B), rel=1e-9)


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_every_collective_replays_on_a_prime_rank_count(name):
    coll = COLLECTIVES[name]
    for algorithm in coll.algorithms:
        r = simulate(name, algorithm, 4 * 7 * 11, Topology.uniform(7, 3), NET_G)
        assert r.source == REPLAY and r.seconds > 0 and r.ranks == 7 and r.collective == name


@pytest.mark.parametrize("p", [1, 2, 7])
def test_empty_and_single_rank(p):
    for algorithm in COLLECTIVES["allreduce"].algorithms:
        r = simulate("allreduce", algorithm, 0, Topology.uniform(p, 1), NET)
        assert r.seconds == 0.0 and r.algbw == 0.0 and r.busbw == 0.0
    r = simulate("allreduce", "ring", 1 << 20, Topology.uniform(1, 1), NET)
    assert r.seconds == 0.0 and r.steps == 0


def test_aliases_and_case():
    r = simulate("AllReduce", "Rabenseifner", 1 << 16, Topology.uniform(4, 1), NET)
    assert r.algorithm == "halving_doubling" and r.collective == "allreduce"


def test_busbw_convention():
    r = simulate("allreduce", "ring", 1 << 20, Topology.uniform(8, 1), NET)
    assert r.algbw == pytest.approx((1 << 20) / r.seconds)
    assert r.busbw == pytest.approx(r.algbw * 2 * 7 / 8)
    d = r.to_dict()
    assert d["source"] == "replay" and d["busbw_GBps"] == pytest.approx(r.busbw / 1e9)


def test_auto_never_loses_to_whole_transfers():
    topo = Topology.uniform(16, 4)
    for algorithm in COLLECTIVES["allreduce"].algorithms:
        for n in (1 << 10, 1 << 20, 1 << 26):
            auto = simulate("allreduce", algorithm, n, topo, NET, Auto())
            whole = simulate("allreduce", algorithm, n, topo, NET)
            assert auto.seconds <= whole.seconds


@pytest.mark.parametrize("bad", [
    dict(coll="allsum"), dict(algorithm="ringg"), dict(nbytes=-4), dict(nbytes=6), dict(nbytes=1.5),
    dict(segment=0), dict(segment="lots"), dict(segment=-1), dict(itemsize=0)])
def test_bad_input_raises(bad):
    args = dict(coll="allreduce", algorithm="ring", nbytes=1 << 10, segment=None, itemsize=4) | bad
    with pytest.raises(ValueError):
        simulate(args["coll"], args["algorithm"], args["nbytes"], Topology.uniform(4, 1), NET, args["segment"],
                 itemsize=args["itemsize"])


def test_replay_checks_its_arguments():
    sched = chain(4, 100)
    with pytest.raises(ValueError, match="4 ranks"):
        replay(sched, Topology.uniform(5, 1), NET)
    with pytest.raises(ValueError, match="itemsize"):
        replay(sched, Topology.uniform(4, 1), NET, itemsize=0)
    with pytest.raises(ValueError, match="segment_bytes"):
        replay(sched, Topology.uniform(4, 1), NET, segment_bytes=0)


def test_result_rejects_an_unknown_source():
    with pytest.raises(ValueError, match="source"):
        SimResult("allreduce", "ring", 4, 2, 1.0, 2, None, "guess", 1.0)


def test_segment_policies():
    assert policy(None).candidates(10, 1 << 20, NET) == (None,)
    assert policy("none").candidates(10, 1 << 20, NET) == (None,)
    assert policy("64K") == Fixed(65536) and policy(4096) == Fixed(4096)
    assert policy("auto").candidates(1, 1 << 20, NET) == (None,)
    assert policy("auto").candidates(2, 1 << 10, NET) == (None,)
    seg = policy("auto").candidates(40, 1 << 26, NET)[1]
    assert seg & (seg - 1) == 0 and 4096 <= seg < 1 << 26
    for bad in (0, -5, True, 2.5, "x"):
        with pytest.raises(ValueError):
            policy(bad)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "recursive_doubling"])
def test_the_per_call_constant_is_added_once_as_the_cost_model_adds_it(algorithm):
    topo, n = Topology.uniform(8, 2), 4 << 20
    net = Network(NET.links, NET.gamma, op=2e-3, check=5e-3)  # check: the caller's, never the replay's
    base, with_op = (simulate("allreduce", algorithm, n, topo, x).seconds for x in (NET, net))
    assert with_op == pytest.approx(base + 2e-3, rel=1e-9)
    assert simulate("allreduce", algorithm, 0, topo, net).seconds == 0.0
