"""The price of message endpoints (``epsilon``, ``cpus``): closed forms, the signature and the simulator
agreeing with the real schedule, the constants table, and ``auto``'s fan-out limit."""
import dataclasses

import numpy as np
import pytest

from ringlet import sim
from ringlet.algorithms import ALLREDUCE
from ringlet.tuning import cost, select
from ringlet.tuning.network import INTER, INTRA, Cpus, LinkCost, Network, Topology
from ringlet.tuning.signature import Signature, Stack

AE, BE, AI, BI, G, EPS = 50e-6, 8e-9, 12.5e-6, 2e-9, 0.25e-9, 30e-6
LINKS = {INTRA: LinkCost(AI, BI), INTER: LinkCost(AE, BE)}
RANK = Network(LINKS, G, epsilon=EPS)
MACHINE = Network(LINKS, G, epsilon=EPS, cpus=Cpus("machine", 2.0))
HOST = Network(LINKS, G, epsilon=EPS, cpus=Cpus("host", 1.0))
FLAT4 = Topology((0, 1, 2, 3))


def latency(algorithm, n, topo, net):
    """Seconds at ``n`` elements with no bandwidth or reduction cost: the per-message terms alone."""
    quiet = dataclasses.replace(net, links={c: LinkCost(lc.alpha, 0.0) for c, lc in net.links.items()}, gamma=0.0)
    return cost.predict_allreduce(algorithm, 4 * n, topo, quiet).seconds


def close(a, b, rel=1e-9):
    return a == pytest.approx(b, rel=rel)


def test_each_rank_pays_for_its_own_endpoints():
    # Ring and recursive doubling: one send and one receive per rank and step. Direct: p-1 of each.
    assert close(latency("ring", 4, FLAT4, RANK), 6 * (AE + 2 * EPS))
    assert close(latency("recursive_doubling", 4, FLAT4, RANK), 2 * (AE + 2 * EPS))
    assert close(latency("direct", 4, FLAT4, RANK), 2 * (AE + 6 * EPS))


def test_ranks_sharing_a_machine_share_its_cores():
    # 4 ranks busy, 8 endpoints a step over 2 cores: a load of 4. With one element the ring's steps
    # carry one transfer (the empty ones are dropped): 2 endpoints, load max(1, 2/2) = 1.
    assert close(latency("ring", 4, FLAT4, MACHINE), 6 * (AE + 4 * EPS))
    assert close(latency("ring", 1, FLAT4, MACHINE), 6 * (AE + 1 * EPS))
    assert close(latency("direct", 4, FLAT4, MACHINE), 2 * (AE + 12 * EPS))


def test_ranks_of_one_host_share_its_cores():
    topo = Topology((0, 0, 1, 1))
    # Recursive doubling on 2 x 2: each step, each host's two ranks send and receive one message each
    # (4 endpoints on 1 core); the first step stays inside the hosts, the second crosses them.
    assert close(latency("recursive_doubling", 4, topo, HOST), (AI + 4 * EPS) + (AE + 4 * EPS))
    assert close(latency("recursive_doubling", 4, topo, RANK), (AI + 2 * EPS) + (AE + 2 * EPS))


@pytest.mark.parametrize("net", [RANK, MACHINE, HOST], ids=["rank", "machine", "host"])
@pytest.mark.parametrize("host_of", [(0, 1, 2, 3), (0, 0, 1, 1), (0, 0, 1, 1, 1), (0, 1, 2, 3, 4, 5, 6)], ids=str)
@pytest.mark.parametrize("algorithm", sorted(ALLREDUCE))
def test_signature_and_stack_match_the_real_schedule(algorithm, host_of, net):
    topo = Topology(host_of)
    c = cost.AllreduceCost(algorithm, topo)
    for n in (1, 3, len(host_of), 97, 65537, 1 << 20):
        full = cost.predict_allreduce(algorithm, 4 * n, topo, net)
        assert c.predict(4 * n, net).seconds == pytest.approx(full.seconds, rel=1e-3), n
        t = full.terms
        assert close(t["alpha"] + t["beta"] + t["gamma"] + t["op"], full.seconds)
        even = n * c.signature.exact_below
        for seg in (4096, 1 << 20):
            full = cost.predict_allreduce(algorithm, 4 * even, topo, net, segment_bytes=seg)
            assert c.predict(4 * even, net, segment_bytes=seg).seconds == pytest.approx(full.seconds, rel=1e-6)
            assert close(sum(full.terms[k] for k in ("alpha", "beta", "gamma", "op")), full.seconds)
    sigs = [cost.AllreduceCost(a, topo).signature for a in sorted(ALLREDUCE)]
    n, segs = 12345 * sigs[0].exact_below, np.array([np.inf, 65536.0])
    stacked = Stack(sigs).seconds(n, net, 4, segs)
    one_by_one = np.array([s.seconds(n, net, 4, segs) for s in sigs])
    assert np.allclose(stacked, one_by_one, rtol=1e-12)


@pytest.mark.parametrize("net", [RANK, MACHINE], ids=["rank", "machine"])
@pytest.mark.parametrize("algorithm", ["ring", "direct", "recursive_doubling", "halving_doubling", "hierarchical"])
def test_the_simulator_charges_endpoints_as_the_model_does(algorithm, net):
    # Unsegmented, one rank per host (every transfer of a step alike): the replay and the model are the same sum.
    topo = FLAT4
    schedule = ALLREDUCE[algorithm](4, 4096, topo.host_of)
    got = sim.replay(schedule, topo, net).seconds
    assert got == pytest.approx(cost.predict(schedule, topo, net).seconds, rel=1e-9)
    assert got > sim.replay(schedule, topo, dataclasses.replace(net, epsilon=0.0)).seconds


def test_segments_each_pay_their_endpoints():
    # A ring's remaining segments are bound by the busiest resource: with epsilon large, the ranks' processors.
    topo, n, seg = FLAT4, 4 * 65536, 65536
    slow = dataclasses.replace(RANK, epsilon=1e-3)
    sig = Signature.of(ALLREDUCE["ring"](4, n, topo.host_of), topo)
    k = n * 4 // 4 // seg  # segments per transfer (blocks of n/4 elements)
    got = float(sig.seconds(1, slow, 4, np.array([float(seg)]))[0])
    assert got >= 6 * 2 * 1e-3 * k  # every step's 2 endpoints, k times


def test_the_constants_table_round_trips_the_endpoint_price():
    for net in (RANK, MACHINE, HOST):
        assert Network.from_dict(net.to_dict()) == net
    old = MACHINE.to_dict()
    del old["epsilon"], old["cpus"]
    assert Network.from_dict(old) == Network(LINKS, G)  # profiles from before the endpoint price
    assert "per message endpoint 30.00 us + 0.0000 ns/B, shared by machine (2 cores)" in MACHINE.table()
    with pytest.raises(ValueError, match="finite and >= 0"):
        Network(LINKS, G, epsilon=-1.0)
    with pytest.raises(ValueError, match="scope"):
        Cpus("rack", 2.0)
    with pytest.raises(ValueError, match="cores"):
        Cpus("host", 0.0)
    with pytest.raises(ValueError, match="scope"):
        Network.from_dict({**MACHINE.to_dict(), "cpus": {"scope": "rack", "cores": 2}})


def test_auto_considers_fan_out_once_endpoints_are_priced():
    host_of = (0, 1, 2, 3)
    assert "direct" not in select.Model(Network(LINKS, G)).algorithms(host_of)  # unpriced: flattered, left out
    assert "direct" in select.Model(RANK).algorithms(host_of)
    assert "direct" not in select.Model(RANK, max_fanout=2).algorithms(host_of)  # an explicit limit holds
    # Priced, direct's fan-out costs what it should: at 4 B recursive doubling (2 steps of 2 endpoints)
    # beats it (2 steps of 6).
    assert select.Model(RANK).choose(4, host_of).algorithm == "recursive_doubling"
