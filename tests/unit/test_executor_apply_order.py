"""The executor's apply order: a step's segments from several peers are applied in turn, one from each
(each peer's in schedule order), so that a send of the next step waits only for the segments it needs —
the first segment of each peer, not all of the first peer's. Checked on compiled plans of every
all-reduce schedule, and on the pipelined tree's reduction."""
from __future__ import annotations

import pytest

from ringlet import algorithms
from ringlet.algorithms.executor import APPLY, POST_RECV, POST_SEND, compile_plan

SEG = 1 << 10
N = 1 << 14  # every step several segments long


def _applies(plan, step):
    return [plan.msgs[a[1]] for a in plan.actions if a[0] == APPLY and plan.msgs[a[1]].step == step]


@pytest.mark.parametrize("p", [3, 4, 5, 8])
@pytest.mark.parametrize("algo", sorted(algorithms.ALLREDUCE))
def test_peers_take_turns_and_each_keeps_its_order(algo, p):
    sched = algorithms.ALLREDUCE[algo](p, N, tuple(r // 2 for r in range(p)))
    for rank in range(p):
        plan = compile_plan(sched, rank, SEG)
        for s in range(sched.num_steps):
            got = _applies(plan, s)
            peers = list(dict.fromkeys(m.peer for m in got))
            for peer in peers:  # each peer's segments in schedule order (the order they were posted in)
                mine = [m.offset for m in got if m.peer == peer]
                posted = [plan.msgs[a[1]].offset for a in plan.actions
                          if a[0] == POST_RECV and plan.msgs[a[1]].step == s and plan.msgs[a[1]].peer == peer]
                assert mine == posted, (rank, s, peer)
            rounds = min(sum(m.peer == q for m in got) for q in peers) if peers else 0
            head = [m.peer for m in got[:rounds * len(peers)]]
            assert head == peers * rounds, (rank, s)  # in turn while every peer has segments left


def test_the_tree_forwards_its_first_segment_after_one_from_each_child():
    p = 4
    sched = algorithms.ALLREDUCE["tree"](p, N, tuple(range(p)))
    for rank in range(p):
        plan = compile_plan(sched, rank, SEG)
        children = {m.peer for m in _applies(plan, 0)}
        if len(children) < 2:
            continue
        applied = 0
        for act in plan.actions:
            m = plan.msgs[act[1]]
            if act[0] == APPLY and m.step == 0:
                applied += 1
            if act[0] == POST_SEND and m.step == 1:
                assert applied == len(children)  # one segment of each child, then the first send goes
                break
        else:
            pytest.fail(f"rank {rank} reduces from {children} but sends nothing in step 1")


def test_without_the_rule_peers_are_applied_one_after_another():
    # The A/B arm of benchmarks/step_order/step_order.py --rule interleave: each peer's segments in schedule order,
    # peer after peer, and the plan is cached apart from the default one.
    sched = algorithms.ALLREDUCE["tree"](4, N, (0, 1, 2, 3))
    plan = compile_plan(sched, 1, SEG, True, False)
    got = [m.peer for m in _applies(plan, 0)]
    first = got[0]
    assert len(set(got)) == 2 and got == [first] * got.count(first) + [p for p in got if p != first]
    assert compile_plan(sched, 1, SEG) is not plan
