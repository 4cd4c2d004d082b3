"""``ringlet.allreduce(..., compression=...)`` and its variants, in-process: results, state kept by the
caller, the metadata check (the compression is part of what ranks agree on) and local errors."""
from __future__ import annotations

import pytest
import torch
from conftest import run_world
from test_compressed_allreduce import inputs, ref_gather, ref_scatter
from testonly_compressors import FakeEF, FakeTopK

import ringlet
from ringlet.compression import BF16, FP16
from ringlet.types import MismatchError


@pytest.mark.parametrize("p", [1, 2, 3])
def test_every_variant_gives_the_compressed_average(p):
    n = 1001

    def fn(rank):
        x = inputs(p, n)[rank]
        out = ringlet.allreduce(x, op="avg", compression="fp16")
        assert not torch.equal(out, x) or p == 1  # out of place: the input is untouched
        y = x.clone()
        ringlet.allreduce_(y, op="avg", compression=FP16)
        h = ringlet.allreduce_async(x, op="avg", compression="fp16")
        z = x.clone()
        h2 = ringlet.allreduce_async_(z, op=ringlet.AVG, compression="fp16")
        return out, y, h.wait(), h2.wait(), z

    want = ref_scatter(inputs(p, n), FP16, True)
    for out, y, a, b, z in run_world(p, fn):
        for t in (out, y, a, b, z):
            assert torch.equal(t, want)


def test_sum_with_scale_factors_and_a_half_precision_tensor():
    p, n = 3, 64

    def fn(rank):
        x = inputs(p, n)[rank].to(torch.bfloat16)
        return ringlet.allreduce(x, op="sum", compression="bf16", prescale_factor=0.5, postscale_factor=4.0)

    xs = [x.to(torch.bfloat16).float() * 0.5 for x in inputs(p, n)]
    want = (ref_scatter(xs, BF16, False) * 4.0).to(torch.bfloat16)
    for out in run_world(p, fn):
        assert out.dtype == torch.bfloat16 and torch.equal(out, want)


def test_sparse_compressor_and_state_kept_by_the_caller():
    p, n = 2, 100

    def fn(rank):
        topk = ringlet.allreduce(inputs(p, n)[rank], compression=FakeTopK())
        state = {}
        for _ in range(3):
            ringlet.allreduce(inputs(p, n)[rank], compression=FakeEF(), compression_state=state)
        return topk, set(state)

    for rank, (topk, keys) in enumerate(run_world(p, fn)):
        assert torch.equal(topk, ref_gather(inputs(p, n), FakeTopK(), False))
        assert keys == {("rs", 0), ("rs", 1), ("ag", rank)}


@pytest.mark.parametrize("other", [None, "bf16", FakeTopK(0.5)])
def test_ranks_that_disagree_on_the_compression_raise_on_every_rank(other):
    def fn(rank):
        comp = "fp16" if rank == 0 else other
        with pytest.raises(MismatchError, match="compression") as info:
            ringlet.allreduce(torch.ones(10), compression=comp)
        # Still in step afterwards.
        assert ringlet.allreduce(torch.ones(3), compression="fp16").tolist() == [3.0] * 3
        return str(info.value)

    for msg in run_world(3, fn):
        assert "'fp16 scatter 20B'" in msg and "rank 0 vs rank 1" in msg


def test_local_errors():
    def fn(rank):
        with pytest.raises(ValueError, match="sums or averages"):
            ringlet.allreduce(torch.ones(3), op="max", compression="fp16")
        with pytest.raises(ValueError, match="floating"):
            ringlet.allreduce(torch.ones(3, dtype=torch.int32), compression="fp16")
        with pytest.raises(ValueError, match="unknown compressor|bad compressor"):
            ringlet.allreduce(torch.ones(3), compression="zip")
        with pytest.raises(ValueError, match="compression_state"):
            ringlet.allreduce(torch.ones(3), compression="fp16", compression_state=[])
        return True

    assert run_world(2, fn) == [True, True]


def test_mismatch_against_a_plain_small_allreduce_on_shared_memory():
    """Over shm's mailbox a plain small all-reduce carries its check in band; a compressed one agrees
    over the same mailbox first, so the two meet and both raise."""
    from test_small_allreduce import shm_runtimes

    def fn(rt):
        with ringlet.use_runtime(rt):
            try:
                with pytest.raises(MismatchError):
                    ringlet.allreduce(torch.ones(8), compression="fp16" if rt.rank == 0 else None)
                return ringlet.allreduce(torch.ones(8), compression="fp16").tolist()
            finally:
                rt.close()

    assert shm_runtimes(3, fn) == [[3.0] * 8] * 3


def test_core_api_hands_a_matrix_to_powersgd():
    """A 2-D tensor reaches PowerSGD as one matrix (it compresses); a 1-D one is summed exactly."""
    def fn(rank):
        import ringlet

        m = torch.full((64, 64), float(rank + 1))
        before = ringlet.wire_bytes()
        ringlet.allreduce_(m, compression="powersgd", compression_state={}, check=False, algorithm="ring")
        sent = (ringlet.wire_bytes() - before).sent
        v = torch.full((64 * 64,), float(rank + 1))
        ringlet.allreduce_(v, compression="powersgd", compression_state={}, check=False)
        return sent, m, v

    out = run_world(2, fn)
    for sent, m, v in out:
        assert sent < 64 * 64 * 4 // 4  # rank 2: 2 * 64 floats each way, not the 16 KiB buffer
        assert torch.allclose(m, torch.full((64, 64), 3.0)) and torch.equal(v, torch.full((64 * 64,), 3.0))
