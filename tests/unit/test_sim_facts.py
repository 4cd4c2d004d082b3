"""The simulator against the textbook facts of collective algorithms.

All on the modelled network of :mod:`ringlet.tuning.network`: α/β per link class, γ per reduced byte.
"""
from __future__ import annotations

import math

import pytest

from ringlet.sim import predicted, simulate, size_range
from ringlet.tuning.network import INTER, LinkCost, Network, Topology

GiB = 1 << 30
NET = Network.of(link="100gbit", latency="2us")  # intra-host: 4x the rate, 1/4 the latency
# Reductions at 5 GB/s and a slower link, so that all three terms of the formulas matter.
NET_G = Network.of(link="10gbit", latency="20us", gamma=1 / 5e9)


def flat(net: Network) -> Network:
    """The same constants for both link classes (no faster intra-host fabric)."""
    return Network({"intra": net[INTER], "inter": net[INTER]}, net.gamma)


@pytest.mark.parametrize("p, per_host", [(16, 8), (64, 8), (100, 4), (256, 8), (37, 1), (1024, 8), (1024, 1)])
def test_ring_busbw_is_flat_as_ranks_grow(p, per_host):
    """A ring's busbw at a large size is the link rate whatever the rank count: 1/(β + pα/n)."""
    base = simulate("allreduce", "ring", GiB, Topology.uniform(8, 1), NET).busbw
    busbw = simulate("allreduce", "ring", GiB, Topology.uniform(p, per_host), NET).busbw
    assert base == pytest.approx(1 / NET[INTER].beta, rel=0.001)
    assert busbw == pytest.approx(base, rel=0.05)


@pytest.mark.parametrize("p", [2, 3, 5, 8, 13, 64, 100, 1024])
def test_tree_steps_are_twice_the_depth(p):
    """The double binary tree has depth ⌊log₂p⌋: 2⌊log₂p⌋ steps, 2⌈log₂p⌉ = 20 at 1,024 ranks."""
    r = simulate("allreduce", "tree", 1 << 20, Topology.uniform(p, 1), NET)
    assert r.steps == 2 * int(math.log2(p))
    if p & (p - 1) == 0:
        assert r.steps == 2 * math.ceil(math.log2(p))
    if p == 1024:
        assert r.steps == 20


@pytest.mark.parametrize("p", [4, 16, 36, 64, 144, 1024])
def test_torus_steps_on_a_square_grid(p):
    """Without host structure the torus is the √p × √p grid: 4(√p-1) steps instead of the ring's 2(p-1)."""
    r = simulate("allreduce", "torus", 1 << 20, Topology.uniform(p, 1), NET)
    assert r.steps == 4 * (math.isqrt(p) - 1)


@pytest.mark.parametrize("p", [12, 32, 48])
def test_torus_steps_on_a_near_square_grid(p):
    r = simulate("allreduce", "torus", 1 << 20, Topology.uniform(p, 1), NET)
    assert r.steps == pytest.approx(4 * (math.sqrt(p) - 1), rel=0.1)


def crossover(p: int, segment, how=simulate) -> int:
    """The smallest size of 1K..1G at which the ring beats the tree on ``p`` ranks, one per host."""
    topo = Topology.uniform(p, 1)
    for n in size_range("1K:1G"):
        ring = how("allreduce", "ring", n, topo, NET, segment).seconds
        if ring < how("allreduce", "tree", n, topo, NET, segment).seconds:
            return n
    return 2 * GiB


@pytest.mark.parametrize("segment", [None, "auto"])
def test_ring_tree_crossover_grows_with_ranks(segment):
    """The ring pays 2(p-1) latencies, the tree 2log₂p: the size where the ring starts to win grows with p."""
    sizes = [crossover(p, segment) for p in (8, 32, 128)]
    assert sizes[0] < sizes[1] < sizes[2] <= GiB


@pytest.mark.parametrize("p", [8, 32, 128])
def test_ring_tree_crossover_is_where_the_cost_model_puts_it(p):
    assert crossover(p, None) == crossover(p, None, predicted)


@pytest.mark.parametrize("p", [2, 5, 8, 12])
@pytest.mark.parametrize("algorithm", ["ring", "halving_doubling", "recursive_doubling", "direct", "torus"])
def test_replay_agrees_with_the_cost_model_without_shared_links(p, algorithm):
    """One rank per host, whole transfers: the replay and the step-synchronous cost model within 5%.
    (Folded recursive doubling with γ > 0 replays faster than the step-synchronous sum, see
    test_recursive_doubling_folds_extra_ranks: compared without γ.)"""
    topo = Topology.uniform(p, 1)
    net = Network(NET_G.links) if algorithm == "recursive_doubling" and p & (p - 1) else NET_G
    for n in (0, 4, 4 * 1009, 1 << 20, 1 << 28):
        replayed = simulate("allreduce", algorithm, n, topo, net).seconds
        model = predicted("allreduce", algorithm, n, topo, net).seconds
        assert replayed == pytest.approx(model, rel=0.05)


RING_SIZES = [0, 4, 1 << 10, (1 << 20) + 4, 1 << 28]


@pytest.mark.parametrize("p", [2, 3, 5, 8, 13])
@pytest.mark.parametrize("n", RING_SIZES)
def test_ring_agrees_with_the_analytic_formula(p, n):
    """One rank per host, no shared link: 2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ within 5%."""
    a, b, g = NET_G[INTER].alpha, NET_G[INTER].beta, NET_G.gamma
    formula = 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g
    r = simulate("allreduce", "ring", n, Topology.uniform(p, 1), NET_G)
    assert r.seconds == pytest.approx(formula if n else 0.0, rel=0.05)


@pytest.mark.parametrize("p", [2, 4, 8, 16, 64])
@pytest.mark.parametrize("n", RING_SIZES)
def test_recursive_doubling_agrees_with_the_analytic_formula(p, n):
    """log₂p·(α + nβ + nγ): every round swaps the whole vector."""
    a, b, g = NET_G[INTER].alpha, NET_G[INTER].beta, NET_G.gamma
    r = simulate("allreduce", "recursive_doubling", n, Topology.uniform(p, 1), NET_G)
    assert r.seconds == pytest.approx(math.log2(p) * (a + n * b + n * g) if n else 0.0, rel=0.05)


@pytest.mark.parametrize("p", [3, 5, 6, 12])
def test_recursive_doubling_folds_extra_ranks(p):
    """A non-power of two adds a step before and after the log₂p' rounds: (log₂p' + 2)(α + nβ) without
    reduction cost. With γ > 0 the replay lies below the step-synchronous sum: ranks that were not folded
    start their rounds while their partners still reduce the folded vectors."""
    net = Network(NET_G.links, 0.0)
    a, b = net[INTER].alpha, net[INTER].beta
    n = 1 << 20
    rounds = int(math.log2(p))
    r = simulate("allreduce", "recursive_doubling", n, Topology.uniform(p, 1), net)
    assert r.steps == rounds + 2
    assert r.seconds == pytest.approx((rounds + 2) * (a + n * b), rel=0.05)
    slower = simulate("allreduce", "recursive_doubling", n, Topology.uniform(p, 1), NET_G).seconds
    sync = (rounds + 1) * (a + n * b + n * NET_G.gamma) + (a + n * b)
    assert r.seconds < slower <= sync * 1.001


@pytest.mark.parametrize("p", [2, 3, 8, 13])
def test_direct_shares_the_uplink_fairly(p):
    """Two-shot on one rank per host: p-1 flows share each uplink, p-1 reductions one CPU:
    2α + 2(p-1)/p·nβ + (p-1)/p·nγ."""
    a, b, g = NET_G[INTER].alpha, NET_G[INTER].beta, NET_G.gamma
    n = 1 << 24
    r = simulate("allreduce", "direct", n, Topology.uniform(p, 1), NET_G)
    assert r.seconds == pytest.approx(2 * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g, rel=0.05)


@pytest.mark.parametrize("n", [1 << 20, 1 << 26])
def test_contention_on_a_shared_uplink(n):
    """Direct all-reduce on 8 ranks: one per host, each uplink carries 7 flows of n/8; four per host
    (2 hosts), each uplink carries 16 flows of n/8 — the same links, 16/7 the time."""
    net = flat(NET)
    alone = simulate("allreduce", "direct", n, Topology.uniform(8, 1), net)
    shared = simulate("allreduce", "direct", n, Topology.uniform(8, 4), net)
    assert shared.seconds / alone.seconds == pytest.approx(16 / 7, rel=0.05)


def test_hierarchical_relieves_a_shared_uplink():
    """With 8 ranks per host the flat ring crosses every uplink once per step, the two-level scheme
    moves 1/8 of the data across in fewer steps: faster at mid sizes on a slow inter-host link."""
    net = Network({"intra": LinkCost(0.5e-6, 8 / 400e9), "inter": LinkCost(20e-6, 8 / 10e9)})
    topo = Topology.uniform(64, 8)
    ring = simulate("allreduce", "ring", 1 << 20, topo, net)
    hier = simulate("allreduce", "hierarchical", 1 << 20, topo, net)
    assert hier.seconds < ring.seconds / 2
