"""The executor's step-order rule read off a schedule (:mod:`ringlet.algorithms.hold`): checked against a
plain per-rank statement of the rule on every all-reduce schedule, and its two other readers, the cost
model (a held step starts a stage) and the simulator (a held send waits for the step before)."""
from __future__ import annotations

import numpy as np
import pytest

from ringlet import algorithms
from ringlet.algorithms import alltoall, binomial, ring
from ringlet.algorithms.hold import held_pairs, held_steps
from ringlet.algorithms.schedule import Schedule, ScheduleBuilder
from ringlet.sim import replay
from ringlet.tuning.network import Network, Topology
from ringlet.tuning.signature import Signature

NET = Network.of(link="1gbit", latency="50us", gamma=0.25e-9)


def _reference(sched: Schedule, s: int) -> set[tuple[int, int]]:
    """(sender, peer) pairs held in step ``s``, rank by rank, as the module doc states the rule."""
    if s == 0:
        return set()
    prev, cur = sched.step_arrays(s - 1), sched.step_arrays(s)
    receivers = set(prev.dst.tolist())
    out = set()
    for r in range(sched.nranks):
        before = {int(d) for q, d in zip(prev.src, prev.dst) if q == r}
        forwards = False
        for i in np.flatnonzero(prev.src == r):
            lo, hi = int(prev.recv_offset[i]), int(prev.recv_offset[i] + prev.count[i])
            for j in np.flatnonzero((cur.src == prev.dst[i]) & (cur.src_buf == prev.dst_buf[i])):
                forwards |= bool(cur.offset[j] < hi and lo < cur.offset[j] + cur.count[j])
        for q, d in zip(cur.src.tolist(), cur.dst.tolist()):
            if q == r and before and d not in before and d in receivers and forwards:
                out.add((q, d))
    return out


def _layouts(p: int) -> list[tuple[int, ...]]:
    return sorted({tuple(range(p)), tuple(r // 2 for r in range(p)), (0,) * p})


@pytest.mark.parametrize("algo", sorted(algorithms.ALLREDUCE))
@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("n", [1, 13, 4096])
def test_held_pairs_follow_the_rule(algo, p, n):
    for host_of in _layouts(p):
        sched = algorithms.ALLREDUCE[algo](p, n, host_of)
        for s in range(sched.num_steps):
            st = sched.step_arrays(s)
            rows = held_pairs(sched, s)
            got = set(zip(st.src[rows].tolist(), st.dst[rows].tolist()))
            assert got == _reference(sched, s), (algo, p, n, host_of, s)
        assert held_steps(sched).tolist() == [bool(_reference(sched, s)) for s in range(sched.num_steps)]


def _others(p: int) -> list[Schedule]:
    counts = tuple(3 + r for r in range(p))
    return [alltoall.pairwise(p, tuple(tuple(1 + (r + d) % 3 for d in range(p)) for r in range(p))),
            binomial.broadcast(p, 17, p - 1), binomial.reduce(p, 17, 0), ring.reduce_scatter(p, counts),
            ring.allgather(p, counts), ring.shift(p, counts)]


@pytest.mark.parametrize("p", range(1, 9))
def test_other_collectives_follow_the_rule(p):
    for sched in _others(p):
        for s in range(sched.num_steps):
            st = sched.step_arrays(s)
            rows = held_pairs(sched, s)
            assert set(zip(st.src[rows].tolist(), st.dst[rows].tolist())) == _reference(sched, s), (sched.name, s)


def test_known_schedules():
    host_of = (0, 0, 1, 1)
    steps = {a: held_steps(algorithms.ALLREDUCE[a](4, 1 << 10, host_of)).tolist()
             for a in ("ring", "tree", "halving_doubling", "recursive_doubling", "direct")}
    assert steps == {"ring": [False] * 6, "tree": [False] * 4, "halving_doubling": [False, True, False, True],
                     "recursive_doubling": [False, True], "direct": [False, False]}


def _stages(sched: Schedule) -> list[Schedule]:
    """The schedule cut before every held step, each part a schedule of its own."""
    cuts = [0] + np.flatnonzero(held_steps(sched)).tolist() + [sched.num_steps]
    parts = []
    for lo, hi in zip(cuts, cuts[1:]):
        b = ScheduleBuilder(f"{sched.name}[{lo}:{hi}]", sched.nranks)
        for s in range(lo, hi):
            st = sched.step_arrays(s)
            b.new_step()
            b.add_many(st.src.tolist(), st.dst.tolist(), st.offset.tolist(), st.count.tolist(),
                       reduce=st.reduce.tolist(), dst_offset=st.recv_offset.tolist(),
                       src_buf=st.src_buf.tolist(), dst_buf=st.dst_buf.tolist())
        parts.append(b.build())
    return parts


@pytest.mark.parametrize("host_of", [(0, 0, 1, 1), (0, 1, 2, 3), (0, 0, 0, 0, 1, 1, 1, 1)], ids=str)
@pytest.mark.parametrize("algo", ["halving_doubling", "recursive_doubling", "torus", "hierarchical"])
@pytest.mark.parametrize("segment", [4096.0, 65536.0, np.inf])
def test_a_held_step_drains_the_pipeline(algo, host_of, segment):
    """The model's time of a schedule with held steps is the sum of its stages' times as schedules of
    their own; so is the simulator's, where the stages are symmetric."""
    topo, n = Topology(host_of), 1 << 16
    sched = algorithms.ALLREDUCE[algo](len(host_of), n, host_of)
    parts = _stages(sched)
    assert all(not held_steps(part).any() for part in parts)
    seg = np.array([segment])
    whole = Signature.of(sched, topo).seconds(1, NET, 4, seg)[0]
    assert whole == pytest.approx(sum(Signature.of(part, topo).seconds(1, NET, 4, seg)[0] for part in parts))
    s = None if segment == np.inf else int(segment)
    replayed = replay(sched, topo, NET, segment_bytes=s).seconds
    assert replayed == pytest.approx(sum(replay(part, topo, NET, segment_bytes=s).seconds for part in parts))
