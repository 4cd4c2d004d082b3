"""The executor's scratch: a receive into scratch is posted only once the earlier receives occupying
its range have been applied. Steps whose receives fit in one segment alternate between two regions
(every receive of step s+1 posted before step s is applied); larger ones share one region, so the
scratch is the largest step's non-direct receives, not two steps' worth. Checked on every rank's
compiled plan of every all-reduce schedule, world sizes 1..8, counts 0, 1, primes and larger, several
segment sizes."""
from __future__ import annotations

import pytest

from ringlet import algorithms
from ringlet.algorithms.executor import APPLY, POST_RECV, compile_plan

COUNTS = [0, 1, 7, 1031]
SEGMENTS = [1, 64, 1 << 20]


def _layout(p: int) -> tuple[int, ...]:
    return tuple(r // 2 for r in range(p))  # two ranks per host: the hierarchical and torus cases


def _check_plan(plan, segment: int) -> None:
    busy: dict[int, tuple[int, int]] = {}  # posted, not yet applied: message id -> scratch range
    need: dict[int, int] = {}
    for act in plan.actions:
        kind, mid = act[0], act[1]
        m = plan.msgs[mid]
        if m.is_send or m.direct:
            continue
        lo, hi = m.scratch, m.scratch + m.count
        if kind == POST_RECV:
            assert 0 <= lo and hi <= plan.scratch_elems, (m, plan.scratch_elems)
            for other, (a, b) in busy.items():
                assert hi <= a or b <= lo, f"receive {m} posted into scratch still held by {plan.msgs[other]}"
            busy[mid] = (lo, hi)
            need[m.step] = need.get(m.step, 0) + m.count
        elif kind == APPLY:
            assert busy.pop(mid) == (lo, hi)
    assert not busy
    largest = max(need.values(), default=0)
    assert plan.scratch_elems == (2 * largest if largest <= segment else largest)


@pytest.mark.parametrize("algo", sorted(algorithms.ALLREDUCE))
@pytest.mark.parametrize("p", range(1, 9))
def test_no_receive_lands_in_scratch_still_unapplied(algo, p):
    for n in COUNTS:
        sched = algorithms.ALLREDUCE[algo](p, n, _layout(p))
        for rank in range(p):
            for seg in SEGMENTS:
                _check_plan(compile_plan(sched, rank, seg), seg)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_scratch_of_large_steps_is_one_step_of_receives(p):
    n = 1 << 16
    worst = {algo: max(compile_plan(algorithms.ALLREDUCE[algo](p, n, _layout(p)), r, 1 << 12).scratch_elems
                       for r in range(p)) for algo in algorithms.ALLREDUCE}
    assert worst["recursive_doubling"] == n  # it receives the whole vector every step
    assert worst["ring"] == -(-n // p)  # one chunk
    assert worst["direct"] <= n


def test_steps_within_one_segment_post_every_receive_ahead():
    n = 1 << 10
    plan = compile_plan(algorithms.ALLREDUCE["recursive_doubling"](4, n, _layout(4)), 0, 1 << 12)
    assert plan.scratch_elems == 2 * n
    kinds = [(a[0], plan.msgs[a[1]].step) for a in plan.actions if a[0] in (POST_RECV, APPLY)]
    assert kinds.index((POST_RECV, 1)) < kinds.index((APPLY, 0))  # step 1's receive before step 0's apply
