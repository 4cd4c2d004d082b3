"""The cost model against the textbook α-β-γ formulas, and its bad-input errors."""
import math

import pytest

from ringlet.algorithms import alltoall, binomial, direct, ring
from ringlet.algorithms.schedule import ScheduleBuilder
from ringlet.tuning import cost
from ringlet.tuning.network import INTER, INTRA, LinkCost, Network, Topology

AE, BE, AI, BI, G = 50e-6, 8e-9, 12.5e-6, 2e-9, 0.25e-9  # 1 Gbit/s and 50 us between hosts
NET = Network({INTRA: LinkCost(AI, BI), INTER: LinkCost(AE, BE)}, G)
ITEM = 4


def seconds(algorithm, n, host_of, **kw):
    return cost.predict_allreduce(algorithm, n * ITEM, Topology(tuple(host_of)), NET, **kw).seconds


def flat(p):
    return tuple(range(p))  # one rank per host: every transfer crosses hosts


def close(a, b, rel=0.01):
    return a == pytest.approx(b, rel=rel)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("k", [1, 7, 1000])
def test_ring(p, k):
    n = p * k
    b = n * ITEM
    assert close(seconds("ring", n, flat(p)), 2 * (p - 1) * AE + 2 * (p - 1) / p * b * BE + (p - 1) / p * b * G)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize("n", [1, 97, 65536])
def test_recursive_doubling_and_halving_doubling_on_powers_of_two(p, n):
    b, lg = n * ITEM, int(math.log2(p))
    assert close(seconds("recursive_doubling", n, flat(p)), lg * (AE + b * BE + b * G))
    n *= p  # even blocks
    b = n * ITEM
    assert close(seconds("halving_doubling", n, flat(p)), 2 * lg * AE + 2 * (p - 1) / p * b * BE + (p - 1) / p * b * G)


@pytest.mark.parametrize("p", [2, 3, 4, 7])
def test_direct_counts_the_flows_sharing_a_host_link(p):
    n = p * 4099
    b = n * ITEM
    # Each uplink carries p-1 chunks of b/p at once; each rank reduces p-1 chunks.
    assert close(seconds("direct", n, flat(p)), 2 * AE + 2 * (p - 1) / p * b * BE + (p - 1) / p * b * G)


def test_double_binary_tree_on_four_hosts():
    n = 2 * 5003
    b = n * ITEM
    # Up: rank 1 (tree 0) and rank 2 (tree 1) take two children's halves at once, then one each; down:
    # the roots send one half, then ranks 1 and 2 send to two children at once (see tree.py).
    expect = 4 * AE + 3 * b * BE + 1.5 * b * G
    assert close(seconds("tree", n, flat(4)), expect)


@pytest.mark.parametrize("hosts,local", [(2, 2), (4, 2), (2, 4), (3, 3)])
def test_hierarchical(hosts, local):
    host_of = tuple(r // local for r in range(hosts * local))
    n = hosts * local * 1009
    b = n * ITEM
    intra = 2 * (local - 1) * (AI + b / local * BI)
    inter = 2 * (hosts - 1) * (AE + b / hosts * BE)  # `local` column rings share each uplink
    gamma = ((local - 1) / local + (hosts - 1) / (hosts * local)) * b * G
    assert close(seconds("hierarchical", n, host_of), intra + inter + gamma)


@pytest.mark.parametrize("p,rows", [(4, 2), (6, 2), (8, 2), (9, 3), (5, 1)])
def test_torus_on_one_rank_per_host(p, rows):
    cols = p // rows
    n = p * 1013
    b = n * ITEM
    expect = (2 * (cols + rows) - 4) * AE + 2 * (p - 1) / p * b * BE + (p - 1) / p * b * G
    assert close(seconds("torus", n, flat(p)), expect)


@pytest.mark.parametrize("p,k", [(3, 4), (5, 16)])
def test_segmented_ring_is_bound_by_its_links(p, k):
    s = 4096  # segment bytes; chunk = k segments
    n = p * k * s // ITEM
    # Every step uses the same links: segments cost an α each and hide all but one segment's reduction.
    expect = 2 * (p - 1) * k * (AE + s * BE) + (p - 1) * s * G
    assert close(seconds("ring", n, flat(p), segment_bytes=s), expect)


def test_segmented_chain_pipelines_over_distinct_links():
    p, k, s = 5, 8, 1 << 16
    b = ScheduleBuilder("chain", p)
    for r in range(p - 1):
        b.new_step()
        b.add(r, r + 1, 0, k * s // ITEM)
    sched = b.build()
    pred = cost.predict(sched, Topology(flat(p)), NET, itemsize=ITEM, segment_bytes=s)
    tau = AE + s * BE
    assert close(pred.seconds, (p - 1) * tau + (k - 1) * tau) and pred.segments == k and pred.steps == p - 1


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_other_collectives(p):
    topo, blk = Topology(flat(p)), 1013
    b = blk * ITEM

    def t(schedule):
        return cost.predict(schedule, topo, NET, itemsize=ITEM).seconds

    counts = (blk,) * p
    assert close(t(ring.reduce_scatter(p, counts)), (p - 1) * (AE + b * BE + b * G))
    assert close(t(ring.allgather(p, counts)), (p - 1) * (AE + b * BE))
    assert close(t(direct.allgather(p, counts)), AE + (p - 1) * b * BE)
    rounds = math.ceil(math.log2(p))
    assert close(t(binomial.broadcast(p, blk, 1)), rounds * (AE + b * BE))
    assert close(t(binomial.reduce(p, blk, 0)), rounds * (AE + b * BE + b * G))
    sends = tuple(tuple(blk for _ in range(p)) for _ in range(p))
    assert close(t(alltoall.pairwise(p, sends)), (p - 1) * (AE + b * BE))


def test_terms_add_up_and_split_by_link_class():
    pred = cost.predict_allreduce("hierarchical", 4 << 20, Topology((0, 0, 1, 1)), NET, segment_bytes=1 << 18)
    t = pred.terms
    assert close(t["alpha"] + t["beta"] + t["gamma"], pred.seconds, 1e-9) and t["op"] == t["check"] == 0
    assert close(t["alpha.intra"] + t["alpha.inter"], t["alpha"], 1e-9)
    assert t["beta.inter"] > t["beta.intra"] > 0 and t["gamma"] > 0
    assert pred.steps == 4 and pred.segments == 8 and pred.messages == 16 and pred.segment_bytes == 1 << 18


@pytest.mark.parametrize("algorithm", ["ring", "tree", "direct", "recursive_doubling"])
def test_nothing_to_move_costs_nothing(algorithm):
    pred = cost.predict_allreduce(algorithm, 0, Topology(flat(4)), NET)
    assert pred.seconds == 0.0 and pred.steps == 0
    assert cost.predict_allreduce(algorithm, 64, Topology((0,)), NET).seconds == 0.0


@pytest.mark.parametrize("algorithm", ["ring", "tree", "halving_doubling", "hierarchical"])
def test_the_per_call_constant_and_the_check_are_added_once(algorithm):
    topo, net = Topology((0, 0, 1, 1)), Network(NET.links, G, op=3e-3, check=2e-3)
    base = cost.predict_allreduce(algorithm, 1 << 20, topo, NET)
    pred = cost.predict_allreduce(algorithm, 1 << 20, topo, net)
    checked = cost.predict_allreduce(algorithm, 1 << 20, topo, net, checked=True)
    assert close(pred.seconds, base.seconds + 3e-3, 1e-9) and close(checked.seconds, pred.seconds + 2e-3, 1e-9)
    t = checked.terms
    assert t["op"] == 3e-3 and t["check"] == 2e-3
    assert close(t["alpha"] + t["beta"] + t["gamma"] + t["op"] + t["check"], checked.seconds, 1e-9)
    model = cost.AllreduceCost(algorithm, topo)  # the per-size path (selection) adds it too
    assert close(float(model.seconds(1 << 20, net, 4, [float("inf")])[0]), pred.seconds, 1e-9)
    assert cost.predict_allreduce(algorithm, 0, topo, net).seconds == 0.0  # nothing moves, nothing is called
    assert cost.predict_allreduce(algorithm, 0, topo, net, checked=True).seconds == 2e-3  # but the ranks agree


def test_the_constants_table_round_trips_and_refuses_bad_values():
    net = Network(NET.links, G, op=3e-3, check=2e-3)
    assert Network.from_dict(net.to_dict()) == net
    old = net.to_dict()
    del old["op"], old["check"]
    assert Network.from_dict(old) == Network(NET.links, G)  # profiles from before the per-call constant
    assert "per call 3000.00 us, metadata check 2000.00 us" in net.table()
    for bad in ({"op": -1.0}, {"check": float("nan")}):
        with pytest.raises(ValueError, match="finite and >= 0"):
            Network(NET.links, G, **bad)


def test_bad_input():
    topo = Topology(flat(4))
    with pytest.raises(ValueError, match="ranks"):
        cost.predict(ring.allreduce(3, 30), topo, NET)
    with pytest.raises(ValueError, match="itemsize"):
        cost.predict(ring.allreduce(4, 40), topo, NET, itemsize=0)
    with pytest.raises(ValueError, match="segment_bytes"):
        cost.predict(ring.allreduce(4, 40), topo, NET, segment_bytes=0)
    with pytest.raises(ValueError, match="no schedule"):
        cost.predict_allreduce("bogus", 40, topo, NET)
    with pytest.raises(ValueError, match="multiple of itemsize"):
        cost.predict_allreduce("ring", 41, topo, NET)
    with pytest.raises(ValueError, match="no schedule"):
        cost.AllreduceCost("native", topo)
