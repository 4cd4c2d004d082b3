"""``Comm.allreduce_compressed_``: a job on the core queue, with or without the Horovod coordinator."""
from __future__ import annotations

import pytest
import torch
from conftest import run_world
from hvd_world import hvd_world
from test_compressed_allreduce import inputs, ref_scatter
from testonly_compressors import FakeCustom

from ringlet.compression import FP16
from ringlet.torch.comm import Comm, CommFuture
from ringlet.types import MismatchError, ReduceOp


def _ops(rank: int, p: int):
    comm = Comm()
    x = inputs(p, 300)[rank]
    fut = comm.allreduce_compressed_(x, "fp16", {}, "c.x")
    doubled = fut.then(lambda f: f.value() * 2)
    state = {}
    y = torch.full((10,), float(rank))
    custom = comm.allreduce_compressed_(y, FakeCustom(), state, "c.y", average=False, shapes=[(2, 3), (4,)])
    plain = comm.allreduce_(torch.ones(2), ReduceOp.SUM, "c.plain")  # interleaved with the core ops
    assert isinstance(fut, CommFuture)
    return fut.wait(), doubled.wait(), custom.wait(), state, plain.wait()


def _expect(res, p):
    want = ref_scatter(inputs(p, 300), FP16, True)
    for x, doubled, y, state, plain in res:
        assert torch.equal(x, want) and torch.equal(doubled, want * 2)
        assert torch.equal(y, torch.full((10,), float(sum(range(p)))))
        assert state["shapes"] == [(2, 3), (4,)] and state["count_sum"] == 2.0 * p
        assert plain.tolist() == [float(p)] * 2


@pytest.mark.parametrize("p", [1, 2, 3])
def test_on_the_core_queue(p):
    _expect(run_world(p, lambda rank: _ops(rank, p)), p)


@pytest.mark.parametrize("p", [2, 3])
def test_beside_the_coordinator(p):
    _expect(hvd_world(p, lambda rank: _ops(rank, p)), p)


def test_ranks_submitting_in_different_orders_get_a_mismatch_naming_the_tensor():
    def fn(rank):
        comm = Comm()
        names = ["a", "b"] if rank == 0 else ["b", "a"]
        futs = [comm.allreduce_compressed_(torch.ones(4), FP16, {}, n) for n in names]
        errors = []
        for f in futs:
            with pytest.raises(MismatchError) as info:
                f.wait()
            errors.append(str(info.value))
        return errors

    for errors in hvd_world(2, fn):
        assert all("tensor 'a'" in e or "tensor 'b'" in e for e in errors)
