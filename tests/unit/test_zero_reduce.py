"""ZeRO's compressed reduce-scatter (``Comm.reduce_scatter_compressed_flat_``, ``CompressedReducer``)
against the exact average of every rank's bucket, sliced to the rank's block."""
import pytest
import torch

import ringlet
from ringlet.compression import ErrorFeedback, Int8, TopK
from ringlet.torch.comm import Comm
from ringlet.torch.training.zero.reduce import Reducer
from ringlet.torch.training.zero.reduce_compressed import CompressedReducer
from ringlet.types import MismatchError, ReduceOp

from conftest import run_world
from zero_reduce_cases import DTYPES, average, block_of, bucket, counts_of

WORLDS = (1, 2, 3, 4, 5, 7, 8)
SIZES = (0, 1, 13, 1009)
# Per contribution that travels, the largest error of one element relative to the block's max |x|.
LOSSY = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "int8": 1 / 254, "topk:1": 0.0}
_EPS = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def reduce_blocks(p, n, cut, dtype, compression, *, exact=True, steps=1, states=True, reducer=CompressedReducer):
    """Every rank's reduced block of every step, the buckets, and every rank's state dict."""
    counts = counts_of(n, p, cut)

    def body(rank):
        red = reducer(Comm(), compression)
        state, outs, ins = {}, [], []
        for step in range(steps):
            flat = bucket(rank, n, dtype, step, exact)
            ins.append(flat.clone())
            out = red.reduce_scatter_(flat, counts, "b0", state if states else None, check=True).wait()
            assert out.dtype == dtype and out.numel() == counts[rank]
            assert out.numel() == 0 or out.data_ptr() == block_of(flat, counts, rank).data_ptr()
            outs.append(out.clone())
        return outs, ins, state

    return counts, run_world(p, body)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cut", ["even", "ragged"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("p", WORLDS)
def test_lossless_is_the_exact_average(p, n, cut, dtype):
    counts, ranks = reduce_blocks(p, n, cut, dtype, "none")
    avg = average([ins[0] for _, ins, _ in ranks])
    for r, (outs, _, _) in enumerate(ranks):
        assert torch.equal(outs[0], block_of(avg, counts, r).float().to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("compression", sorted(LOSSY))
@pytest.mark.parametrize("n", [1, 13, 1009])
@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_lossy_error_is_bounded(p, n, compression, dtype):
    """Each of the ``p-1`` contributions that travel is off by at most its compressor's error; the
    rank's own block is exact; one rounding to the bucket's dtype at the end."""
    counts, ranks = reduce_blocks(p, n, "ragged", dtype, compression, exact=False)
    ins = [i[0] for _, i, _ in ranks]
    avg = average(ins)
    for r, (outs, _, _) in enumerate(ranks):
        ref = block_of(avg, counts, r)
        if ref.numel() == 0:
            continue
        scale = max(float(block_of(x, counts, r).double().abs().max()) for x in ins)
        bound = LOSSY[compression] * scale * (p - 1) / p + _EPS[dtype] * float(ref.abs().max()) + 1e-6
        assert float((outs[0].double() - ref).abs().max()) <= bound


@pytest.mark.parametrize("p", [2, 3, 5])
def test_topk_keeps_the_largest_of_each_block(p):
    """Top-k picks each block's ``k`` largest magnitudes (``k`` a fraction of the block), the owner's
    own block enters whole."""
    n, comp = 997, TopK(0.1)
    counts, ranks = reduce_blocks(p, n, "ragged", torch.float32, comp, exact=False)
    ins = [i[0] for _, i, _ in ranks]
    for r, (outs, _, _) in enumerate(ranks):
        ref = torch.zeros(counts[r], dtype=torch.float64)
        for s, x in enumerate(ins):
            blk = block_of(x, counts, r).double()
            if s != r and blk.numel():
                keep = torch.topk(blk.abs(), comp.k(blk.numel())).indices
                blk = torch.zeros_like(blk).index_copy_(0, keep, blk[keep])
            ref += blk
        torch.testing.assert_close(outs[0].double(), ref / p, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("compression", ["int8+ef", "topk:0.05+ef", "fp16+ef"])
@pytest.mark.parametrize("p", [2, 3, 4])
def test_error_feedback_carries_the_residual(p, compression):
    """Over ``T`` steps the reduced blocks add up to the exact sum minus the last residuals that the
    other ranks keep for this block (they telescope), so the error of the sum does not grow with T;
    each block's residual lives in its own sub-dict of the bucket's state, the same every step."""
    n, steps = 211, 12
    counts, ranks = reduce_blocks(p, n, "ragged", torch.float32, compression, exact=False, steps=steps)
    _, plain = reduce_blocks(p, n, "ragged", torch.float32, compression[:-3], exact=False, steps=steps)
    for r, (outs, _, state) in enumerate(ranks):
        if counts[r] == 0:
            continue
        assert ("rs", r) not in state and all(("rs", d) in state for d in range(p) if d != r and counts[d])
        exact = sum(block_of(average([ins[t] for _, ins, _ in ranks]), counts, r) for t in range(steps))
        residuals = sum(ranks[s][2][("rs", r)]["residual"].double() for s in range(p) if s != r)
        got = sum(o.double() for o in outs)
        torch.testing.assert_close(got, exact - residuals / p, rtol=1e-5, atol=1e-5)
        err_ef = float((got - exact).abs().max())
        err_plain = float((sum(o.double() for o in plain[r][0]) - exact).abs().max())
        assert err_ef <= err_plain + 1e-6


def test_state_persists_per_block_and_error_feedback_needs_it():
    """The same sub-dicts every step; an error-feedback compressor without a state is refused."""
    def body(rank):
        red = CompressedReducer(Comm(), "int8+ef")
        state = {}
        red.reduce_scatter_(torch.randn(10), [5, 5], "b", state).wait()
        first = dict(state)
        red.reduce_scatter_(torch.randn(10), [5, 5], "b", state).wait()
        assert state.keys() == first.keys() == {("rs", 1 - rank)}
        assert all(state[k] is first[k] for k in state)
        with pytest.raises(ValueError, match="state"):
            red.reduce_scatter_(torch.randn(10), [5, 5], "b")

    run_world(2, body)


def test_wire_carries_only_the_other_blocks_payloads():
    """Each rank sends ``wire_bytes`` of every other rank's block and nothing of its own."""
    counts = [7, 0, 300, 1]

    def body(rank):
        before = ringlet.wire_bytes()
        Comm().reduce_scatter_compressed_flat_(torch.randn(308), counts, Int8(), {}, ReduceOp.AVG, "b").wait()
        return (ringlet.wire_bytes() - before).sent

    for rank, sent in enumerate(run_world(4, body)):
        assert sent == sum(Int8().wire_bytes(c) for d, c in enumerate(counts) if d != rank and c)


@pytest.mark.parametrize("p", [2, 3, 5])
def test_reducer_contract_then_exact_allgather(p):
    """``world``, ``shard_size``, ``shard_rank`` as :class:`Reducer`'s; after the all-gather every rank
    holds bitwise the same bucket; SUM gives the sum."""
    n = 101
    counts = counts_of(n, p, "ragged")

    def body(rank):
        red = CompressedReducer(Comm(), "bf16")
        base = Reducer(Comm())
        assert (red.world, red.shard_size, red.shard_rank) == (base.world, base.shard_size, base.shard_rank)
        flat = bucket(rank, n, torch.float32, exact=False)
        block = red.reduce_scatter_(flat, counts, "b", {}).wait().clone()
        out = torch.zeros(n)
        block_of(out, counts, rank).copy_(block)
        red.allgather_(out, counts, "b", check=True).wait()
        summed = Comm().reduce_scatter_compressed_flat_(bucket(rank, n, torch.float32, exact=True), counts, "none",
                                                        None, ReduceOp.SUM, "s").wait()
        return out, summed

    outs = run_world(p, body)
    for out, _ in outs:
        assert torch.equal(out, outs[0][0])
    total = sum(bucket(r, n, torch.float32, exact=True) for r in range(p))
    for r, (_, summed) in enumerate(outs):
        assert torch.equal(summed, block_of(total, counts, r))


def test_refusals():
    def body(rank):
        comm = Comm()
        with pytest.raises(ValueError, match="own all-reduce schedule"):
            CompressedReducer(comm, "powersgd")
        with pytest.raises(ValueError, match="own all-reduce schedule"):
            comm.reduce_scatter_compressed_flat_(torch.zeros(4), [2, 2], "powersgd:2", {}, ReduceOp.AVG, "x")
        with pytest.raises(ValueError, match="powersgd"):
            CompressedReducer(comm, "powersgd+ef")
        with pytest.raises(ValueError, match="bad compressor"):
            CompressedReducer(comm, "zip")
        with pytest.raises(TypeError):
            CompressedReducer(comm, 3)
        with pytest.raises(ValueError, match="sums or averages"):
            comm.reduce_scatter_compressed_flat_(torch.zeros(4), [2, 2], "fp16", {}, ReduceOp.MAX, "x")
        with pytest.raises(TypeError, match="floating"):
            comm.reduce_scatter_compressed_flat_(torch.zeros(4, dtype=torch.int32), [2, 2], "fp16", {}, ReduceOp.AVG, "x")
        with pytest.raises(ValueError, match="do not cut"):
            comm.reduce_scatter_compressed_flat_(torch.zeros(4), [2, 1], "fp16", {}, ReduceOp.AVG, "x")
        with pytest.raises(ValueError, match="do not cut"):
            comm.reduce_scatter_compressed_flat_(torch.zeros(4), [2, 2, 0], "fp16", {}, ReduceOp.AVG, "x")
        with pytest.raises(ValueError, match="1-D and contiguous"):
            comm.reduce_scatter_compressed_flat_(torch.zeros(4, 2)[:, 0], [2, 2], "fp16", {}, ReduceOp.AVG, "x")
        with pytest.raises(ValueError, match="state must be a dict"):
            comm.reduce_scatter_compressed_flat_(torch.zeros(4), [2, 2], "fp16", [], ReduceOp.AVG, "x")
        # A residual kept for another size: the error reaches the future, on every rank alike.
        state = {}
        comm.reduce_scatter_compressed_flat_(torch.zeros(4), [2, 2], ErrorFeedback(Int8()), state, ReduceOp.AVG, "x").wait()
        with pytest.raises(ValueError, match="residual"):
            comm.reduce_scatter_compressed_flat_(torch.zeros(6), [3, 3], ErrorFeedback(Int8()), state, ReduceOp.AVG,
                                                 "x").wait()
        return True

    assert run_world(2, body) == [True, True]


def test_mismatched_ranks_get_a_mismatch_error():
    """With ``check`` the ranks agree on the compression and the counts before data moves."""
    def body(rank):
        comm = Comm()
        with pytest.raises(MismatchError):
            comm.reduce_scatter_compressed_flat_(torch.zeros(4), [2, 2], "fp16" if rank else "bf16", {},
                                                 ReduceOp.AVG, "x", check=True).wait()
        with pytest.raises(MismatchError):
            comm.reduce_scatter_compressed_flat_(torch.zeros(4), [2, 2] if rank else [1, 3], "fp16", {},
                                                 ReduceOp.AVG, "x", check=True).wait()
        return comm.reduce_scatter_compressed_flat_(torch.ones(4), [1, 3], "fp16", {}, ReduceOp.SUM, "x",
                                                    check=True).wait().tolist()

    assert run_world(2, body) == [[2.0], [2.0, 2.0, 2.0]]
