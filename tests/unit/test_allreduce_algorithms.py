"""Every registered all-reduce algorithm against the reference, element by element.

Three layers: the public API in an in-process world (all dtypes × ops × small counts, plus one large
count), the executor on the builders' schedules with tiny segments (pipelining) and host layouts
that the in-process world cannot fake (all its ranks share one hostname).
"""
from __future__ import annotations

import pytest
import torch
from conftest import OPS, make_input, run_world, simulate

import ringlet
from ringlet import algorithms
from ringlet.algorithms import executor, reference
from ringlet.transport.inproc import InprocWorld
from ringlet.types import SUPPORTED_DTYPES, Options, ReduceOp, dtype_name

ALGOS = sorted(n for n in algorithms.ALLREDUCE if n != algorithms.NATIVE)
WORLDS = range(1, 9)
SMALL_COUNTS = (0, 1, 2, 7, 1023)
BIG_COUNT = (1 << 20) + 3


def _check(outs, inputs, op, label, **scale):
    expected = reference.allreduce(inputs, op, **scale)
    for r, (got, exp) in enumerate(zip(outs, expected)):
        assert got.dtype == exp.dtype and got.shape == exp.shape, f"{label} rank {r}: {got.dtype}{tuple(got.shape)}"
        if not torch.equal(got, exp):
            bad = (got != exp).nonzero()[:5].flatten().tolist()
            raise AssertionError(f"{label} rank {r}: first bad elements {bad}: got {got.flatten()[bad].tolist()}, "
                                 f"expected {exp.flatten()[bad].tolist()}")


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("algo", ALGOS)
def test_public_allreduce_small(algo, p, dtype):
    # The metadata check is switched off here only to halve the cost of this 9000-call grid; every
    # other test runs with it on.
    cases = [(count, op) for count in SMALL_COUNTS for op in OPS]
    inputs = {case: [make_input(r, case[0], dtype, case[1]) for r in range(p)] for case in cases}
    originals = {case: [t.clone() for t in ts] for case, ts in inputs.items()}

    def fn(rank):
        return [ringlet.allreduce(inputs[(count, op)][rank], op=op, algorithm=algo) for count, op in cases]

    outs = run_world(p, fn, options=Options(timeout=20, check=False))
    for i, (count, op) in enumerate(cases):
        _check([o[i] for o in outs], originals[(count, op)], op, f"{algo} p={p} n={count} {op.name}")
        for r in range(p):  # out-of-place: the input is untouched
            assert torch.equal(inputs[(count, op)][r], originals[(count, op)][r])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=dtype_name)
@pytest.mark.parametrize("p", [3, 4, 8])
@pytest.mark.parametrize("algo", ALGOS)
def test_public_allreduce_large(algo, p, dtype):
    inputs = [make_input(r, BIG_COUNT, dtype) for r in range(p)]
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
def run_schedule(sched, inputs, op, segment_bytes=1 << 20):
    """Execute ``sched`` over a fresh in-process world; ``inputs`` are per-rank flat tensors (cloned)."""
    bufs = [t.clone() for t in inputs]

    def body(tr):
        executor.execute(sched, tr.rank, tr, (bufs[tr.rank],), int(op), segment_bytes=segment_bytes, timeout=20)

    InprocWorld(len(inputs)).run(body)
    return bufs


@pytest.mark.parametrize("segment_bytes,counts", [(8, (1, 7, 33)), (120, (100, 257))])
@pytest.mark.parametrize("algo", ALGOS)
def test_executor_pipelined_segments(algo, segment_bytes, counts):
    """Tiny segments make every transfer many messages: the pipelined executor must still equal the
    step-by-step meaning of the schedule, for every world size and awkward counts."""
    for p in WORLDS:
        for i, count in enumerate(counts):
            for op in (ReduceOp.SUM, (ReduceOp.MAX, ReduceOp.PRODUCT)[i % 2]):
                inputs = [make_input(r, count, torch.float64, op) for r in range(p)]
                sched = algorithms.ALLREDUCE[algo](p, count, tuple(r // 2 for r in range(p)))
                got = run_schedule(sched, inputs, op, segment_bytes)
                _check(got, inputs, op, f"{algo} p={p} n={count} seg={segment_bytes} {op.name}")


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
