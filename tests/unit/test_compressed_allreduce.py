"""The engine's compressed all-reduce (:mod:`ringlet.engine.compressed`) over the in-process transport:
every strategy x world sizes 1-8 x sizes 0, 1, 7, 13, 1021, 65537 x sum/average, against a reference
computed with the same compressor semantics, and bitwise-identical results on every rank."""
from __future__ import annotations

import pytest
import torch
from testonly_compressors import FakeCustom, FakeEF, FakeTopK

from ringlet.tuning.select import Selector
from ringlet.compression import BF16, FP16, NONE
from ringlet.engine import ops
from ringlet.engine.channel import Channel, tag_base
from ringlet.engine.compressed import compressed_allreduce_, describe, strategy_of
from ringlet.transport.inproc import InprocWorld

SIZES = (0, 1, 7, 13, 1021, 65537)
WORLDS = range(1, 9)
# (id, compressor, strategy override)
CASES = [("sum-none", NONE, None), ("scatter-fp16", FP16, None), ("scatter-bf16", BF16, None),
         ("ring-fp16", FP16, "ring"), ("gather-topk", FakeTopK(), None), ("custom", FakeCustom(), None)]


def inputs(p: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    out = []
    for r in range(p):
        g = torch.Generator().manual_seed(1000 * seed + 17 * r + n)
        out.append(torch.randn(n, generator=g) * 3)
    return out


def roundtrip(comp, x: torch.Tensor) -> torch.Tensor:
    payload, ctx = comp.compress(x.contiguous(), {})
    return comp.decompress(payload, ctx)


def blocks(n: int, p: int) -> list[slice]:
    counts, out, at = ops.split_rows(n, p), [], 0
    for c in counts:
        out.append(slice(at, at + c))
        at += c
    return out


def ref_scatter(xs, comp, average):
    p, out = len(xs), torch.empty(xs[0].numel())
    for blk in blocks(xs[0].numel(), p):
        acc = torch.zeros(blk.stop - blk.start)
        for x in xs:
            acc.add_(roundtrip(comp, x[blk]))
        if average:
            acc.mul_(1.0 / p)
        out[blk] = roundtrip(comp, acc) if acc.numel() else acc
    return out


def ref_ring(xs, comp, average):
    p, out = len(xs), torch.empty(xs[0].numel())
    for b, blk in enumerate(blocks(xs[0].numel(), p)):
        partial = xs[(b + 1) % p][blk].clone()
        for k in range(2, p + 1):
            partial = xs[(b + k) % p][blk].clone().add_(roundtrip(comp, partial))
        if average:
            partial.mul_(1.0 / p)
        out[blk] = roundtrip(comp, partial) if partial.numel() else partial
    return out


def ref_gather(xs, comp, average):
    acc = torch.zeros(xs[0].numel())
    for x in xs:
        payload, ctx = comp.compress(x, {})
        comp.accumulate_(acc, payload, ctx)
    return acc.mul_(1.0 / len(xs)) if average else acc


def ref_exact(xs, average, rounding=None):
    total = sum((x if rounding is None else roundtrip(rounding, x)).double() for x in xs)
    return total / len(xs) if average else total


def run_cases(p: int, comp, strategy, dtype=torch.float32):
    """Every size x sum/average on one world; returns {(n, average): [result per rank]}."""
    def body(tr):
        out = {}
        for i, (n, average) in enumerate((n, a) for n in SIZES for a in (False, True)):
            ch = Channel.world(tr, tag_base(0, i), timeout=30, selector=Selector())
            flat = inputs(p, n)[tr.rank].to(dtype)
            res = compressed_allreduce_(ch, flat, comp, {}, average, strategy=strategy)
            assert res is flat and flat.dtype == dtype
            out[(n, average)] = flat
        return out

    results = InprocWorld(p).run(body, timeout=120)
    return {key: [r[key] for r in results] for key in results[0]}


@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("name,comp,strategy", CASES, ids=[c[0] for c in CASES])
def test_matches_reference_and_is_identical_on_every_rank(p, name, comp, strategy):
    got = run_cases(p, comp, strategy)
    for (n, average), per_rank in got.items():
        for r in range(1, p):
            assert torch.equal(per_rank[r], per_rank[0]), f"rank {r} differs, n={n} avg={average}"
        xs = inputs(p, n)
        res = per_rank[0]
        how = strategy_of(comp, strategy)
        if how == "scatter":
            assert torch.equal(res, ref_scatter(xs, comp, average)), (n, average)
        elif how == "ring":
            assert torch.equal(res, ref_ring(xs, comp, average)), (n, average)
        elif how == "gather":
            assert torch.equal(res, ref_gather(xs, comp, average)), (n, average)
        else:  # float32 sums in the algorithm's order: within float32 rounding of the exact sum
            want = ref_exact(xs, average, FP16 if how == "custom" else None)
            torch.testing.assert_close(res.double(), want, rtol=1e-6, atol=1e-5 * p)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes_reduce_in_float32_and_come_back_in_their_own(dtype):
    p = 3
    got = run_cases(p, FP16, None, dtype)
    for (n, average), per_rank in got.items():
        xs = [x.to(dtype).float() for x in inputs(p, n)]
        assert torch.equal(per_rank[0], ref_scatter(xs, FP16, average).to(dtype))
        assert all(torch.equal(t, per_rank[0]) for t in per_rank)


def test_fp16_sum_of_large_values_does_not_overflow():
    """60000 fits float16; the sum over 4 ranks does not, but it is accumulated in float32 and the
    result (which travels as float16 again) saturates only where the sum itself is out of range."""
    def body(tr):
        ch = Channel.world(tr, 0, timeout=30, selector=Selector())
        flat = torch.tensor([60000.0, 1000.0, -60000.0])
        compressed_allreduce_(ch, flat, FP16, {}, average=True)
        return flat

    for res in InprocWorld(4).run(body):
        assert res.tolist() == [60000.0, 1000.0, -60000.0]


@pytest.mark.parametrize("strategy", ["scatter", "ring"])
def test_block_states_line_up_step_after_step(strategy):
    """One sub-dict per block and phase, the same each call: an error-feedback compressor that refuses a
    state of another size runs many steps, and its residuals carry over (the sum of the results over
    the steps is the sum of the inputs minus what the last residuals hold back)."""
    p, n, steps = 3, 1021, 4

    def body(tr):
        state, total = {}, torch.zeros(n, dtype=torch.float64)
        for s in range(steps):
            ch = Channel.world(tr, tag_base(0, s), timeout=30, selector=Selector())
            flat = inputs(p, n, seed=s)[tr.rank]
            total += compressed_allreduce_(ch, flat, FakeEF(), state, average=False, strategy=strategy).double()
        return state, total

    results = InprocWorld(p).run(body)
    state, total = results[0]
    counts = ops.split_rows(n, p)
    assert ("ag", 0) in state and state[("ag", 0)]["residual"].numel() == counts[0]
    phase = "rs" if strategy == "scatter" else "ring"
    assert {k for k in state if k[0] == phase} == ({(phase, j) for j in range(p)} if strategy == "scatter"
                                                   else {(phase, j) for j in range(p) if j != 0})
    exact = sum(sum(x.double() for x in inputs(p, n, seed=s)) for s in range(steps))
    assert all(torch.equal(t, total) for _, t in results)
    assert float((total - exact).abs().max()) < 0.5  # what the residuals hold: float16 rounding, not more


def test_custom_gets_shapes_and_may_call_allreduce_several_times():
    shapes = [(3, 4), (5,)]

    def body(tr):
        state = {}
        ch = Channel.world(tr, 0, timeout=30, selector=Selector())
        flat = torch.full((17,), float(tr.rank + 1))
        compressed_allreduce_(ch, flat, FakeCustom(), state, average=True, shapes=shapes)
        return flat, state

    for flat, state in InprocWorld(3).run(body):
        assert state["calls"] == 1 and state["shapes"] == shapes and state["count_sum"] == 6.0
        assert torch.equal(flat, torch.full((17,), 2.0))


def test_bad_arguments():
    ch = Channel.world(InprocWorld(1).transport(0), selector=Selector())
    with pytest.raises(TypeError):
        compressed_allreduce_(ch, torch.ones(3, dtype=torch.int32), FP16, {}, True)
    with pytest.raises(ValueError, match="unknown compressed all-reduce strategy"):
        compressed_allreduce_(ch, torch.ones(3), FP16, {}, True, strategy="tree")
    with pytest.raises(ValueError, match="reduces by"):
        compressed_allreduce_(ch, torch.ones(3), FP16, {}, True, strategy="sum")
    with pytest.raises(ValueError, match="reduces by"):
        strategy_of(FakeTopK(), "custom")
    assert strategy_of(FakeTopK(), "scatter") == "scatter"
    assert describe(FP16, 10) == "fp16 scatter 20B" and describe(FP16, 10, "ring") == "fp16 ring 20B"


def _known(name: str):
    from ringlet import compression

    try:
        return compression.get(name)
    except ValueError:
        return None


BUILT_IN = ["int8", "int8+ef", "topk:0.1", "topk:0.1+ef", "powersgd"]


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("name", BUILT_IN)
def test_built_in_compressors(p, name):
    comp = _known(name)
    assert comp is not None, name
    got = run_cases(p, comp, None)
    for (n, average), per_rank in got.items():
        assert all(torch.equal(t, per_rank[0]) for t in per_rank), (n, average)
        xs, how = inputs(p, n), strategy_of(comp)
        if how == "scatter":  # a fresh state sends what the inner compressor sends
            assert torch.equal(per_rank[0], ref_scatter(xs, comp, average)), (n, average)
        elif how == "gather":
            assert torch.equal(per_rank[0], ref_gather(xs, comp, average)), (n, average)
        else:  # one 1-D tensor: PowerSGD sums it exactly
            torch.testing.assert_close(per_rank[0].double(), ref_exact(xs, average), rtol=1e-6, atol=1e-5 * p)
