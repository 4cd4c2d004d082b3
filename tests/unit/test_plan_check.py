"""Every compiled plan, run on all ranks together, neither deadlocks nor races under any message timing
(:mod:`ringlet.algorithms.plan_check`), and the checker itself finds each kind of fault planted in a
sound plan."""
from __future__ import annotations

import dataclasses

import pytest

from ringlet import algorithms
from ringlet.algorithms import alltoall, binomial, direct, ring
from ringlet.algorithms.executor import APPLY, POST_RECV, POST_SEND, Plan, compile_plan
from ringlet.algorithms.plan_check import check_plans

COUNTS = (0, 1, 100)
SEGMENTS = (1, 7, 64)


def _layouts(algo: str, p: int) -> list[tuple[int, ...]]:
    if algo in ("torus", "hierarchical"):
        return [tuple(r // 2 for r in range(p)), tuple(min(r, 1) for r in range(p)), (0,) * p]
    return [tuple(range(p))]


@pytest.mark.parametrize("p", [*range(1, 9), 12, 16])
@pytest.mark.parametrize("algo", sorted(algorithms.ALLREDUCE))
def test_every_allreduce_plan_is_sound(algo, p):
    for n in COUNTS:
        for host_of in _layouts(algo, p):
            sched = algorithms.ALLREDUCE[algo](p, n, host_of)
            for seg in SEGMENTS:
                assert check_plans(sched, seg) == [], (algo, p, n, host_of, seg)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_the_other_collectives_plans_are_sound(p):
    ragged = tuple((r * 7 + 3) % 5 for r in range(p))
    scheds = [ring.allgather(p, ragged), ring.reduce_scatter(p, ragged), direct.allgather(p, ragged),
              binomial.broadcast(p, 37, p // 2), binomial.reduce(p, 37, p - 1),
              alltoall.pairwise(p, tuple(tuple((r + d) % 3 for d in range(p)) for r in range(p)))]
    for sched in scheds:
        for seg in (1, 4):
            assert check_plans(sched, seg) == [], (sched.name, seg)


@pytest.mark.parametrize("rules", [(False, True), (True, False)])
def test_plans_with_a_rule_off_are_sound_too(rules):
    """The A/B arms of benchmarks/step_order/step_order.py run the same code paths with one rule off."""
    for algo in sorted(algorithms.ALLREDUCE):
        for p in (3, 4, 6):
            sched = algorithms.ALLREDUCE[algo](p, 100, tuple(r // 2 for r in range(p)))
            assert check_plans(sched, 7, hold=rules[0], interleave=rules[1]) == [], (algo, p)


# ---- the checker finds planted faults -----------------------------------------------------------------
def _tree_plans(p=4, n=100, seg=7):
    sched = algorithms.ALLREDUCE["tree"](p, n, tuple(range(p)))
    return sched, [compile_plan(sched, r, seg) for r in range(p)]


def _check(sched, plans):
    from ringlet.algorithms import plan_check

    run = plan_check._Run(plans)
    if run.problems:
        return run.problems
    vc = run.clocks()
    return run.problems if vc is None else plan_check.races(run, vc)


def test_a_send_posted_before_the_reduction_it_carries_is_a_race():
    sched, plans = _tree_plans()
    pl = plans[1]  # an interior rank of tree 0: reduces its children's data, then sends it up
    acts = sorted(pl.actions, key=lambda a: a[0] != POST_SEND)  # every send first
    got = _check(sched, plans[:1] + [dataclasses.replace(pl, actions=tuple(acts))] + plans[2:])
    assert got and all("may overlap in time" in g for g in got)
    assert any("apply" in g and "send" in g for g in got)


def test_two_receives_in_one_scratch_range_are_a_race():
    sched = algorithms.ALLREDUCE["ring"](4, 100, (0, 1, 2, 3))
    plans = [compile_plan(sched, r, 7) for r in range(4)]
    pl = plans[1]
    msgs = tuple(dataclasses.replace(m, scratch=0) if not (m.is_send or m.direct) else m for m in pl.msgs)
    got = _check(sched, plans[:1] + [dataclasses.replace(pl, msgs=msgs)] + plans[2:])
    assert any("on scratch" in g for g in got)


def test_waiting_for_data_before_sending_it_is_a_deadlock():
    sched = algorithms.ALLREDUCE["ring"](2, 10, (0, 1))
    plans = [compile_plan(sched, r, 10) for r in range(2)]
    bad = []
    for pl in plans:  # apply step 0 before posting anything else: each rank waits for the other's send
        first = [a for a in pl.actions if a[0] == POST_RECV and pl.msgs[a[1]].step == 0]
        apply0 = [a for a in pl.actions if a[0] == APPLY and pl.msgs[a[1]].step == 0]
        rest = [a for a in pl.actions if a not in first and a not in apply0]
        bad.append(dataclasses.replace(pl, actions=tuple(first + apply0 + rest)))
    got = _check(sched, bad)
    assert len(got) == 1 and got[0].startswith("deadlock")


def test_unmatched_and_unwaited_messages_are_reported():
    sched, plans = _tree_plans()
    pl = plans[0]
    dropped = next(a for a in pl.actions if a[0] == POST_SEND)
    acts = tuple(a for a in pl.actions if a is not dropped)
    got = _check(sched, [Plan(pl.msgs, acts, pl.tail_waits, pl.scratch_elems)] + plans[1:])
    assert any("posts" in g and "receives" in g for g in got)
    assert any("never matched" in g for g in got)
