"""SyncBatchNorm on one rank and its argument checks (the cross-rank equivalence with BatchNorm on the
concatenated batch runs in tests/unit/test_hvd_cases_inproc.py and tests/multiproc/test_hvd_training.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import ringlet.torch as hvd


@pytest.fixture
def hvd1():
    hvd.init()
    yield
    hvd.shutdown()


def test_one_rank_equals_batch_norm(hvd1):
    x = torch.randint(-3, 4, (5, 3, 2)).float()
    sbn, bn = hvd.SyncBatchNorm(3), nn.BatchNorm1d(3)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    sbn(xa).square().sum().backward()
    bn(xb).square().sum().backward()
    assert torch.allclose(xa.grad, xb.grad) and torch.allclose(sbn.running_var, bn.running_var)


def test_eval_mode_uses_running_statistics_without_init():
    sbn = hvd.SyncBatchNorm(2).eval()  # no hvd.init(): nothing is communicated in eval mode
    sbn.running_mean.fill_(1.0)
    sbn.running_var.fill_(4.0)
    out = sbn(torch.full((3, 2), 3.0))
    assert torch.allclose(out, torch.full((3, 2), 2.0 / (4.0 + 1e-5) ** 0.5))


def test_input_needs_at_least_two_dimensions(hvd1):
    with pytest.raises(ValueError, match="at least 2D"):
        hvd.SyncBatchNorm(3)(torch.zeros(3))


def test_momentum_none_is_a_cumulative_average(hvd1):
    sbn, bn = hvd.SyncBatchNorm(2, momentum=None), nn.BatchNorm1d(2, momentum=None)
    for i in range(3):
        x = torch.randint(-3, 4, (4, 2)).float() + i
        sbn(x)
        bn(x)
    assert torch.allclose(sbn.running_mean, bn.running_mean) and int(sbn.num_batches_tracked) == 3
