"""Every registered all-reduce algorithm against the reference, element by element.

Three layers: the public API in an in-process world (schedules over algorithm x world size x count
with one dtype and op; reductions over dtype x op with one algorithm; one large count), the executor
on the builders' schedules with tiny segments (pipelining) and host layouts that the in-process world
cannot fake (all its ranks share one hostname), where every algorithm also meets narrow and wide
dtypes and the ops that are not sums.
"""
from __future__ import annotations

import pytest
import torch
from conftest import OPS, make_input, run_world, simulate

import ringlet
from ringlet.tuning.select import Selector
from ringlet import algorithms
from ringlet.algorithms import executor, reference
from ringlet.engine.channel import Channel
from ringlet.transport.inproc import InprocWorld
from ringlet.types import SUPPORTED_DTYPES, Options, ReduceOp, dtype_name, reduction

ALGOS = sorted(n for n in algorithms.ALLREDUCE if n != algorithms.NATIVE)
WORLDS = range(1, 9)
SMALL_COUNTS = (0, 1, 2, 7, 1023)
BIG_COUNT = (1 << 20) + 3
REDUCTION_ALGO = "ring"


def _check(outs, inputs, op, label, **scale):
    expected = reference.allreduce(inputs, op, **scale)
    for r, (got, exp) in enumerate(zip(outs, expected)):
        assert got.dtype == exp.dtype and got.shape == exp.shape, f"{label} rank {r}: {got.dtype}{tuple(got.shape)}"
        if not torch.equal(got, exp):
            bad = (got != exp).nonzero()[:5].flatten().tolist()
            raise AssertionError(f"{label} rank {r}: first bad elements {bad}: got {got.flatten()[bad].tolist()}, "
                                 f"expected {exp.flatten()[bad].tolist()}")


def _public_grid(algo, p, dtype, cases):
    """Every ``(count, op)`` of ``cases`` through the public API on ``p`` in-process ranks, checked
    against the reference; the out-of-place input must stay untouched."""
    inputs = {case: [make_input(r, case[0], dtype, case[1]) for r in range(p)] for case in cases}
    originals = {case: [t.clone() for t in ts] for case, ts in inputs.items()}

    def fn(rank):
        return [ringlet.allreduce(inputs[(count, op)][rank], op=op, algorithm=algo) for count, op in cases]

    outs = run_world(p, fn)
    for i, (count, op) in enumerate(cases):
        _check([o[i] for o in outs], originals[(count, op)], op, f"{algo} p={p} n={count} {op.name} {dtype}")
        for r in range(p):
            assert torch.equal(inputs[(count, op)][r], originals[(count, op)][r])


@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("algo", ALGOS)
def test_schedule_over_every_world_and_count(algo, p):
    """Schedule correctness: every algorithm on 1..8 ranks (powers of two and not) and awkward counts,
    with one dtype and op; what dtype and op change is the combine step, covered once below."""
    _public_grid(algo, p, torch.float32, [(count, ReduceOp.SUM) for count in SMALL_COUNTS])


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=dtype_name)
def test_reduction_of_every_dtype_and_op(dtype):
    """Reduction correctness: every dtype x every op through one algorithm (``Reduction.combine`` does
    not depend on the schedule) on a world that is not a power of two. Every algorithm's handling of
    narrow and wide elements is crossed with other dtypes and ops in :func:`test_host_layouts`."""
    _public_grid(REDUCTION_ALGO, 3, dtype, [(count, op) for count in (1, 2, 1023) for op in OPS])


@pytest.mark.parametrize("p", [3, 8])
@pytest.mark.parametrize("algo", ALGOS)
def test_public_allreduce_large(algo, p):
    """A count of many segments (2^20+3 elements) on a world that is and one that is not a power of two."""
    inputs = [make_input(r, BIG_COUNT, torch.float32) for r in range(p)]
    outs = run_world(p, lambda rank: ringlet.allreduce(inputs[rank], op="sum", algorithm=algo))
    _check(outs, inputs, ReduceOp.SUM, f"{algo} p={p} n={BIG_COUNT}")


@pytest.mark.parametrize("algo", ALGOS)
def test_multidim_and_aliases(algo):
    """Shapes are flattened and restored; aliases and 'auto' resolve to registered algorithms."""
    p = 4
    inputs = [make_input(r, 60, torch.float64, shape=(3, 4, 5)) for r in range(p)]
    names = [algo] + [a for a, target in algorithms.ALIASES.items() if target == algo] + ["auto"]

    def fn(rank):
        return [ringlet.allreduce(inputs[rank], algorithm=name) for name in names]

    outs = run_world(p, fn)
    for i, name in enumerate(names):
        _check([o[i] for o in outs], inputs, ReduceOp.SUM, f"{name} (3,4,5)")


@pytest.mark.parametrize("p", [5, 8])
@pytest.mark.parametrize("algo", ALGOS)
def test_bitwise_identical_on_every_rank(algo, p):
    """With inexact float data every rank must still get the same bits (each element is reduced once)."""
    g = torch.Generator().manual_seed(p)
    inputs = [torch.randn(999, generator=g, dtype=torch.float32) for _ in range(p)]
    outs = run_world(p, lambda rank: ringlet.allreduce(inputs[rank], algorithm=algo),
                     options=Options(timeout=20, segment_bytes=256))
    for r in range(1, p):
        assert torch.equal(outs[0], outs[r])
    torch.testing.assert_close(outs[0], torch.stack(inputs).sum(0), rtol=1e-5, atol=1e-5)


# ---- the executor on the schedules directly ------------------------------------------------------
def run_schedule(sched, inputs, op, segment_bytes=1 << 20, lazy=False):
    """Execute ``sched`` over a fresh in-process world; ``inputs`` are per-rank flat tensors (cloned).
    ``lazy``: sends are read when waited for, as on a zero-copy transport (buffer hazards show)."""
    bufs = [t.clone() for t in inputs]

    def body(tr):
        ch = Channel.world(tr, segment_bytes=segment_bytes, timeout=20, selector=Selector())
        executor.execute(sched, ch, (bufs[tr.rank],), reduction(op).combine)

    InprocWorld(len(inputs), lazy=lazy).run(body)
    return bufs


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("segment_bytes,counts", [(8, (1, 7, 33)), (120, (100, 257))])
@pytest.mark.parametrize("algo", ALGOS)
def test_executor_pipelined_segments(algo, segment_bytes, counts, lazy):
    """Tiny segments make every transfer many messages: the pipelined executor must still equal the
    step-by-step meaning of the schedule, for every world size and awkward counts. With lazy sends a
    buffer range overwritten while a send of it is still unread gives wrong data."""
    op = ReduceOp.SUM
    for p in WORLDS:
        for count in counts:
            inputs = [make_input(r, count, torch.float64, op) for r in range(p)]
            sched = algorithms.ALLREDUCE[algo](p, count, tuple(r // 2 for r in range(p)))
            got = run_schedule(sched, inputs, op, segment_bytes, lazy)
            _check(got, inputs, op, f"{algo} p={p} n={count} seg={segment_bytes} lazy={lazy}")


HOST_LAYOUTS = [(0, 0, 1, 1), (0, 0, 0, 1, 1, 1), (0, 1, 0, 1), (0, 0, 0, 1), (0, 1, 1, 1, 2),
                (0, 0, 1, 1, 2, 2, 3, 3), (0, 1, 2, 3), (1, 1, 0, 0, 0), (0, 0, 1, 1, 1, 2, 2, 2)]


@pytest.mark.parametrize("host_of", HOST_LAYOUTS, ids=lambda h: "".join(map(str, h)))
@pytest.mark.parametrize("algo", ALGOS)
def test_host_layouts(algo, host_of):
    p = len(host_of)
    others = ((ReduceOp.MIN, torch.float16), (ReduceOp.PRODUCT, torch.int8), (ReduceOp.MAX, torch.uint8))
    for i, count in enumerate((1, 5, 1001)):
        for op, dtype in ((ReduceOp.SUM, torch.int64), others[i]):
            inputs = [make_input(r, count, dtype, op) for r in range(p)]
            sched = algorithms.ALLREDUCE[algo](p, count, host_of)
            label = f"{algo} hosts={host_of} n={count} {op.name}"
            simulated = [b[0] for b in simulate(sched, [(t,) for t in inputs], op)]
            _check(simulated, inputs, op, label + " (simulated)")
            _check(run_schedule(sched, inputs, op, segment_bytes=256), inputs, op, label)
            _check(run_schedule(sched, inputs, op, segment_bytes=256, lazy=True), inputs, op, label + " (lazy)")


# ---- when a copy-receive may land in place ---------------------------------------------------------
def _hand_schedule(steps):
    from ringlet.algorithms.schedule import ScheduleBuilder

    b = ScheduleBuilder("hand", 3)
    for step in steps:
        b.new_step()
        for src, dst, off, cnt, red in step:
            b.add(src, dst, off, cnt, reduce=red)
    return b.build()


N = 6
DIRECT_CASES = {
    # rank 0 sends [0, N) to 1 and receives [0, N) from 2 in the same step: the send must be read first.
    "same_step_send": ([[(0, 1, 0, N, False), (2, 0, 0, N, False)]], False),
    # the send of step 0 goes to rank 1, the receive of step 1 comes from rank 2, which does not wait for it.
    "older_send_other_peer": ([[(0, 1, 0, N, False)], [(2, 0, 0, N, False)]], False),
    # rank 1 reduces what rank 0 sent and sends the result back: the reply implies the send was read.
    "reply_from_same_peer": ([[(0, 1, 0, N, True)], [(1, 0, 0, N, False)]], True),
    # rank 1 replies with a range rank 0's data did not land in: no such guarantee.
    "unrelated_reply": ([[(0, 1, 0, N // 2, True)], [(1, 0, 0, N, False)]], False),
}


@pytest.mark.parametrize("case", sorted(DIRECT_CASES))
def test_copy_receives_land_in_place_only_when_safe(case):
    steps, expect_direct = DIRECT_CASES[case]
    sched = _hand_schedule(steps)
    plan = executor.compile_plan(sched, 0, 1 << 20)
    recv = [m for m in plan.msgs if not m.is_send and not m.reduce]
    assert recv and all(m.direct == expect_direct for m in recv), (case, recv)
    inputs = [torch.arange(N, dtype=torch.float64) * 10 + r for r in range(3)]
    expected = [b[0] for b in simulate(sched, [(t,) for t in inputs], ReduceOp.SUM)]
    for lazy in (False, True):
        got = run_schedule(sched, inputs, ReduceOp.SUM, lazy=lazy)
        for r in range(3):
            assert torch.equal(got[r], expected[r]), (case, lazy, r)


@pytest.mark.parametrize("algo", ["ring", "halving_doubling", "direct"])
def test_allreduce_all_gather_halves_receive_in_place(algo):
    """The reduced chunks come back from the rank they were sent to, so no all-gather receive of
    these all-reduces goes through scratch (a copy of up to the whole buffer per call, measured)."""
    for p in (3, 4, 5, 8):
        sched = algorithms.ALLREDUCE[algo](p, 1 << 16, (0,) * p)
        for rank in range(p):
            plan = executor.compile_plan(sched, rank, 1 << 12)
            assert all(m.direct for m in plan.msgs if not m.is_send and not m.reduce), (algo, p, rank)


def test_lazy_inproc_reads_send_buffers_late():
    """What makes the lazy mode a hazard detector: a send carries the buffer as it is at the first wait."""
    import threading

    def body(tr, filled):
        buf = torch.zeros(3)
        if tr.rank == 0:
            h = tr.isend(buf, 1, 7)
            buf.fill_(5.0)  # after posting, before anyone waited
            filled.set()
            h.wait(5)
            return None
        out = torch.empty(3)
        h = tr.irecv(out, 0, 7)
        filled.wait(5)
        h.wait(5)
        return out

    for lazy, value in ((True, 5.0), (False, 0.0)):
        filled = threading.Event()
        got = InprocWorld(2, lazy=lazy).run(lambda tr, f=filled: body(tr, f))[1]
        assert torch.equal(got, torch.full((3,), value)), lazy
