"""The executor's send order: when a rank sends in step s data that its receiver sends on in step s+1,
a send of step s+1 to a peer it did not send to in step s and that receives in step s (it would apply
the message only after its own step s) is posted after step s is applied and after waiting for this
rank's step-s sends. Other sends of step s+1 go out as soon as their data is ready: to the same peer
(the ring), to a peer idle in step s (the pipelined tree), or data nobody sends on (all-to-all).
Checked on compiled plans: the rule on every rank of every all-reduce schedule, and the cases on named
schedules."""
from __future__ import annotations

import pytest

from ringlet.tuning.select import Selector
from ringlet import algorithms
from ringlet.algorithms.executor import APPLY, POST_SEND, compile_plan

SEG = 1 << 10
N = 1 << 14  # every step several segments long


def _layout(p: int) -> tuple[int, ...]:
    return tuple(r // 2 for r in range(p))


def _receivers(sched, s: int) -> set[int]:
    return set(sched.step_arrays(s).dst.tolist()) if 0 <= s < sched.num_steps else set()


def _walk(plan):
    """For each send of the plan: (its step, its peer, applies done before it per step, sends waited
    for before it, by any action)."""
    applied: dict[int, int] = {}
    waited: set[int] = set()
    out = []
    for act in plan.actions:
        m = plan.msgs[act[1]]
        if act[0] == POST_SEND:
            waited.update(act[2])
            out.append((m.step, m.peer, dict(applied), set(waited)))
        else:
            waited.update(act[2])
            if act[0] == APPLY:
                applied[m.step] = applied.get(m.step, 0) + 1
    return out


def _forwarded(sched, rank: int, s: int) -> bool:
    """A receiver of ``rank``'s step-``s`` data sends some of it on in step ``s+1``."""
    if s + 1 >= sched.num_steps:
        return False
    st, nxt = sched.step_arrays(s), sched.step_arrays(s + 1)
    for i in range(len(st.src)):
        if st.src[i] != rank:
            continue
        lo = st.recv_offset[i]
        hi = lo + st.count[i]
        for j in range(len(nxt.src)):
            if (nxt.src[j] == st.dst[i] and nxt.src_buf[j] == st.dst_buf[i]
                    and nxt.offset[j] < hi and lo < nxt.offset[j] + nxt.count[j]):
                return True
    return False


def _held(sched, plan, rank: int, step: int, peer: int) -> bool:
    before = {m.peer for m in plan.msgs if m.is_send and m.step == step - 1}
    return (bool(before) and peer not in before and peer in _receivers(sched, step - 1)
            and _forwarded(sched, rank, step - 1))


@pytest.mark.parametrize("algo", sorted(algorithms.ALLREDUCE))
@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_a_held_send_waits_for_the_older_step(algo, p):
    sched = algorithms.ALLREDUCE[algo](p, N, _layout(p))
    for rank in range(p):
        plan = compile_plan(sched, rank, SEG)
        applies = {}
        for m in plan.msgs:
            if not m.is_send:
                applies[m.step] = applies.get(m.step, 0) + 1
        older_sends = {s: {i for i, m in enumerate(plan.msgs) if m.is_send and m.step == s}
                       for s in range(sched.num_steps)}
        for step, peer, applied, waited in _walk(plan):
            if step and _held(sched, plan, rank, step, peer):
                assert applied.get(step - 1, 0) == applies.get(step - 1, 0), (algo, p, rank, step, peer)
                assert older_sends[step - 1] <= waited, (algo, p, rank, step, peer)


def _first_send(plan, step: int, peer: int):
    return next(w for w in _walk(plan) if w[0] == step and w[1] == peer)


def test_halving_doublings_second_step_waits():
    sched = algorithms.ALLREDUCE["halving_doubling"](4, N, _layout(4))
    for rank in range(4):
        plan = compile_plan(sched, rank, SEG)
        peer = next(m.peer for m in plan.msgs if m.is_send and m.step == 1)
        _, _, applied, waited = _first_send(plan, 1, peer)
        total = sum(1 for m in plan.msgs if not m.is_send and m.step == 0)
        assert applied[0] == total
        assert {i for i, m in enumerate(plan.msgs) if m.is_send and m.step == 0} <= waited
        early = compile_plan(sched, rank, SEG, False)
        assert _first_send(early, 1, peer)[2].get(0, 0) < total  # without the rule: released early


def test_the_ring_still_pipelines_its_steps():
    sched = algorithms.ALLREDUCE["ring"](4, N, _layout(4))
    plan = compile_plan(sched, 0, SEG)
    peer = next(m.peer for m in plan.msgs if m.is_send and m.step == 1)
    total = sum(1 for m in plan.msgs if not m.is_send and m.step == 0)
    assert _first_send(plan, 1, peer)[2][0] < total
    assert plan == compile_plan(sched, 0, SEG, False)


def test_the_tree_forwards_to_an_idle_root_at_once():
    sched = algorithms.ALLREDUCE["tree"](4, N, _layout(4))
    # rank 1 sends to 2 in step 0 and forwards the reduced first half to 3 in step 1; 3 receives
    # nothing in step 0, so the forward starts with the first segment reduced from both children.
    assert 3 not in _receivers(sched, 0)
    plan = compile_plan(sched, 1, SEG)
    total = sum(1 for m in plan.msgs if not m.is_send and m.step == 0)
    assert _first_send(plan, 1, 3)[2][0] < total
    assert _first_send(plan, 1, 3)[2] == _first_send(compile_plan(sched, 1, SEG, False), 1, 3)[2]


@pytest.mark.parametrize("algo", ["ring", "halving_doubling", "direct"])
def test_the_transports_segment_cap_bounds_every_message(algo):
    """A transport's ``max_segment_bytes`` caps the options' segment; the result is unchanged."""
    import dataclasses

    import torch

    from ringlet.engine.channel import Channel
    from ringlet.transport.inproc import InprocWorld
    from ringlet.types import ReduceOp, reduction
    from ringlet.algorithms import executor

    p, n = 4, 1000
    sched = algorithms.ALLREDUCE[algo](p, n, _layout(p))
    bufs = [torch.full((n,), float(r + 1), dtype=torch.float64) for r in range(p)]
    sizes: list[int] = []

    def body(tr):
        tr.capabilities = dataclasses.replace(tr.capabilities, max_segment_bytes=64 * 8)
        isend = tr.isend

        def counted(buf, peer, tag):
            sizes.append(buf.numel())
            return isend(buf, peer, tag)

        tr.isend = counted
        ch = Channel.world(tr, segment_bytes=1 << 20, timeout=20, selector=Selector())
        executor.execute(sched, ch, (bufs[tr.rank],), reduction(ReduceOp.SUM).combine)

    InprocWorld(p).run(body)
    assert sizes and max(sizes) == 64
    assert all(torch.equal(b, torch.full((n,), 10.0, dtype=torch.float64)) for b in bufs)


def test_all_to_all_sends_wait_for_no_one():
    from ringlet.algorithms import alltoall

    p = 5
    counts = tuple(tuple(64 for _ in range(p)) for _ in range(p))
    sched = alltoall.pairwise(p, counts)
    plan = compile_plan(sched, 0, 16)
    assert plan == compile_plan(sched, 0, 16, False)
