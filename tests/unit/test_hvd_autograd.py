"""The differentiable collectives of ringlet.torch: argument errors surface unchanged through the
autograd wrappers (and the next op works), single-rank gradients, and compression around the op.
Cross-rank gradient rules: tests/unit/test_hvd_cases_inproc.py and tests/multiproc/test_hvd_training.py."""
from __future__ import annotations

import pytest
import torch

import ringlet.torch as hvd


@pytest.fixture
def hvd1():
    hvd.init()
    yield
    hvd.shutdown()


def test_top_level_names_are_the_differentiable_versions():
    from ringlet.torch import autograd

    for name in autograd.__all__:
        assert getattr(hvd, name) is getattr(autograd, name)


@pytest.mark.parametrize("call, error", [
    (lambda: hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum), ValueError),
    (lambda: hvd.allreduce(torch.ones(4, 4).t()), ValueError),
    (lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool)), ValueError),
    (lambda: hvd.alltoall(torch.ones(3), splits=[1, 1]), ValueError),
    (lambda: hvd.reducescatter(torch.tensor(1.0)), ValueError),
    (lambda: hvd.reducescatter(torch.ones(2), op=hvd.Max), hvd.HorovodInternalError),
    (lambda: hvd.broadcast(torch.ones(2), root_rank=5), ValueError),
    (lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), NotImplementedError),
])
def test_errors_pass_through_and_the_next_op_works(hvd1, call, error):
    with pytest.raises(error):
        call()
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    assert torch.equal(x.grad, torch.ones(3))


def test_average_is_deprecated(hvd1):
    with pytest.warns(DeprecationWarning):
        hvd.allreduce(torch.ones(2), average=False)


def test_single_rank_gradients(hvd1):
    x = torch.arange(4.0, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0)
    (y * torch.arange(4.0)).sum().backward()
    assert torch.equal(x.grad, torch.arange(4.0) * 6)
    for op in (hvd.allgather, lambda t: hvd.broadcast(t, 0), lambda t: hvd.reducescatter(t, op=hvd.Sum)):
        x = torch.arange(6.0, requires_grad=True)
        (op(x) * 2).sum().backward()
        assert torch.equal(x.grad, torch.full((6,), 2.0))
    xs = [torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)]
    sum(t.sum() for t in hvd.grouped_allreduce(xs, op=hvd.Sum)).backward()
    assert all(torch.equal(x.grad, torch.ones_like(x)) for x in xs)


def test_fp16_compression_round_trips_the_dtype(hvd1):
    x = torch.tensor([0.5, 1.25], requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert y.dtype == torch.float32 and torch.equal(y, x.detach())
    y.sum().backward()
    assert x.grad.dtype == torch.float32 and torch.equal(x.grad, torch.ones(2))
