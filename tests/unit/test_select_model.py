"""Selection with a cost model: algorithm and segment size of least predicted time, deterministic,
forced names kept; the engine runs the chosen segment size."""
import pytest
import torch

from ringlet.engine import ops
from ringlet.engine.channel import Channel
from ringlet.group import Group
from ringlet.transport.inproc import InprocWorld
from ringlet.tuning import model as select_model
from ringlet.tuning import select
from ringlet.tuning.network import Network
from ringlet.types import ReduceOp, reduction

NET = Network.of(link="1gbit", latency="50us", gamma=0.25e-9)  # 4x faster inside a host
NONE = select.Capabilities()


def hosts(n_hosts, per_host):
    return tuple(r // per_host for r in range(n_hosts * per_host))


LAYOUTS = [hosts(4, 1), hosts(2, 2), hosts(8, 1), hosts(5, 1), hosts(4, 4), hosts(3, 2), hosts(1, 4)]


@pytest.mark.parametrize("host_of", LAYOUTS, ids=str)
@pytest.mark.parametrize("nbytes", [4, 64, 1024])
def test_tiny_messages_take_few_rounds(host_of, nbytes):
    choice = select.allreduce_choice("auto", len(host_of), nbytes, host_of, NONE, select.Model(NET))
    assert choice.algorithm in ("recursive_doubling", "tree")
    assert choice.segment_bytes == nbytes  # unsegmented


@pytest.mark.parametrize("host_of", LAYOUTS + [hosts(3, 1), hosts(6, 1), hosts(4, 2), hosts(2, 3)], ids=str)
def test_large_messages_take_bandwidth_optimal_schedules(host_of):
    choice = select.allreduce("auto", len(host_of), 64 << 20, host_of, NONE, select.Model(NET))
    assert choice in ("ring", "hierarchical", "halving_doubling", "torus", "direct")
    if len(host_of) in (5, 7):  # prime: the torus is the ring; halving-doubling pays for the fold
        assert choice == "ring"
    if host_of in (hosts(2, 2), hosts(2, 3)):
        assert choice == "hierarchical"


def test_segment_size_follows_the_reduction_cost():
    host_of, nbytes = hosts(5, 1), 64 << 20
    with_gamma = select.Model(NET).choose(nbytes, host_of)
    assert with_gamma.algorithm == "ring" and with_gamma.segment_bytes < nbytes  # segments hide reductions
    no_gamma = select.Model(Network.of(link="1gbit", latency="50us")).choose(nbytes, host_of)
    assert no_gamma.segment_bytes == nbytes  # nothing to hide: every segment costs an α


@pytest.mark.parametrize("host_of", LAYOUTS, ids=str)
def test_deterministic(host_of):
    sizes = [0, 4, 1000, 4096, 65536, 99996, 1 << 20, 3 << 20, 64 << 20]
    a, b = select.Model(NET), select.Model(Network.from_dict(NET.to_dict()))
    first = [a.choose(n, host_of) for n in sizes]
    assert first == [b.choose(n, host_of) for n in reversed(sizes)][::-1]
    assert first == [a.choose(n, host_of) for n in sizes]
    assert first == [a.best(n, host_of).choice for n in sizes]


def test_forced_names_and_native_are_kept():
    m, host_of = select.Model(NET), hosts(2, 2)
    forced = select.allreduce_choice("tree", 4, 4, host_of, NONE, m)
    assert forced.algorithm == "tree" and forced.segment_bytes == 4
    assert select.allreduce_choice("native", 4, 64 << 20, host_of, NONE, m) == select.Choice("native")
    small = select.Capabilities(native_small=True)
    assert select.allreduce_choice("auto", 4, 4096, host_of, small, m).algorithm == "native"
    assert select.allreduce_choice("auto", 4, 8 << 20, host_of, small, m).algorithm == "hierarchical"


def test_without_a_model_the_size_rule_and_the_channel_segment():
    assert select.allreduce_choice("auto", 4, 8 << 20, hosts(2, 2), NONE) == select.Choice("hierarchical")
    assert select.allreduce_choice("ring", 4, 4, hosts(2, 2), NONE) == select.Choice("ring")


def test_ranking_and_top_algorithms():
    m, host_of = select.Model(NET), hosts(2, 2)
    ranked = m.ranking(16 << 20, host_of)
    assert ranked[0].choice == m.choose(16 << 20, host_of)
    # Fastest first; predictions within the model's resolution of each other count as equal (preference).
    fastest = min(r.seconds for r in ranked)
    assert all(r.seconds <= fastest * (1 + m.resolution) for r in ranked[:1])
    exact = select.Model(NET, resolution=0).ranking(16 << 20, host_of)
    # Sorted, up to the ties (within a relative 1e-9) that the preference order decides.
    assert all(a.seconds <= b.seconds * (1 + select_model.TIE) for a, b in zip(exact, exact[1:]))
    assert {r.choice.algorithm for r in ranked} == set(m.algorithms(host_of))
    assert "direct" not in m.algorithms(host_of)  # 3 sends per rank and step: above max_fanout
    assert "direct" in select.Model(NET, max_fanout=8).algorithms(host_of)
    top = m.top_algorithms([25 << 20, 25 << 20, 3 << 20], host_of, count=2)
    assert len(top) == 2 and "hierarchical" not in top  # auto's own pick for every bucket adds nothing
    assert m.top_algorithms([], host_of) == ()


def test_near_ties_go_to_the_preferred_algorithm():
    # 4 x 1: the bandwidth-optimal schedules differ by a few rounds of alpha at 64 MiB (well under 2 %):
    # without a resolution the fewest rounds win, with it the ring (first in preference).
    host_of = hosts(4, 1)
    assert select.Model(NET, resolution=0).choose(64 << 20, host_of).algorithm == "halving_doubling"
    assert select.Model(NET).choose(64 << 20, host_of).algorithm == "ring"
    assert select.Model(NET).choose(1 << 10, host_of).algorithm == "recursive_doubling"  # a clear win stays
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="resolution"):
            select.Model(NET, resolution=bad)


def test_new_constants_drop_cached_decisions():
    m, host_of = select.Model(NET), hosts(2, 2)
    assert m.choose(65536, host_of).algorithm == "hierarchical"
    m.set_network(Network.of(link="1gbit", latency="5ms", gamma=0.25e-9))  # rounds now dominate
    assert m.choose(65536, host_of).algorithm == "recursive_doubling"


def test_a_new_algorithm_gets_a_cost_without_new_code(monkeypatch):
    from ringlet.algorithms import ALLREDUCE, ring

    monkeypatch.setitem(ALLREDUCE, "zz_copy_of_ring", lambda p, n, host_of: ring.allreduce(p, n))
    m, host_of = select.Model(NET), hosts(5, 1)
    assert m.algorithms(host_of)[-1] == "zz_copy_of_ring"
    a, b = (m.best(64 << 20, host_of, algorithm=x) for x in ("ring", "zz_copy_of_ring"))
    assert a.seconds == b.seconds and m.choose(64 << 20, host_of).algorithm == "ring"  # ties go to the known name


def test_selector_holds_one_model():
    m = select.Model(NET)
    assert select.Selector(m).model is m and select.Selector().model is None
    assert select.Selector(m).allreduce("auto", 4, 64 << 20, hosts(2, 2), NONE) == \
        select.allreduce_choice("auto", 4, 64 << 20, hosts(2, 2), NONE, m)
    with pytest.raises(TypeError):
        select.Selector(NET)


def test_bad_model_arguments():
    with pytest.raises(ValueError):
        select.Model({"intra": 1})
    with pytest.raises(ValueError):
        select.Model(NET, segments=(0,))
    with pytest.raises(ValueError):
        select.Model(NET, max_fanout=0)
    with pytest.raises(ValueError):
        select.Model(NET).set_network(None)


@pytest.mark.parametrize("count", [1, 7, 65537])
def test_engine_runs_the_chosen_algorithm_and_segment_size(monkeypatch, count):
    host_of = hosts(2, 2)
    model = select.Model(NET, segments=(4096,))  # one candidate segment size: 1024 float32
    seen = []
    original = Channel.run

    def spy(self, schedule, buffers, combine=None):
        seen.append((schedule.name, self.segment_bytes))
        return original(self, schedule, buffers, combine)

    monkeypatch.setattr(Channel, "run", spy)

    def body(transport):
        ch = Channel(transport, Group(0, (0, 1, 2, 3), host_of), transport.rank, 0, selector=select.Selector(model))
        flat = torch.full((count,), float(transport.rank + 1))
        ran = ops.allreduce_(ch, flat, reduction(ReduceOp.SUM))
        return ran, flat

    out = InprocWorld(4).run(body, timeout=60)
    expect = model.choose(4 * count, host_of)
    for ran, flat in out:
        assert ran == expect.algorithm and torch.equal(flat, torch.full((count,), 10.0))
    assert set(seen) == {(expect.algorithm, 4096)}
