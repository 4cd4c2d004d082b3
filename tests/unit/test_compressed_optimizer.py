"""``hvd.DistributedOptimizer(compression=...)`` with a ringlet compressor (ranks as threads): each
gradient or group through the compressed all-reduce in a fixed order, its state kept between steps;
Horovod's ``Compression.fp16`` keeps its meaning."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hvd_world import hvd_world
from test_compressed_allreduce import ref_scatter
from test_hvd_optimizer import batch, model
from testonly_compressors import FakeCustom, FakeEF

import ringlet.torch as hvd
from ringlet.compression import FP16
from ringlet.torch.training.compressed_reduction import CompressedReduction


def local_grads(rank: int, step: int, bpps: int = 1) -> list[torch.Tensor]:
    m = model()
    for k in range(bpps):
        x, y = batch(100 * step + 10 * rank + k)
        F.mse_loss(m(x), y).backward()
    return [p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("p", [2, 3])
def test_each_gradient_gets_the_compressed_average(p):
    def fn(rank):
        m = model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0),
                                       named_parameters=m.named_parameters(), compression=FP16)
        x, y = batch(10 * rank)
        F.mse_loss(m(x), y).backward()
        opt.synchronize()
        return [q.grad.clone() for q in m.parameters()]

    res = hvd_world(p, fn)
    for i in range(len(res[0])):
        want = ref_scatter([local_grads(r, 0)[i].reshape(-1) for r in range(p)], FP16, True)
        assert all(torch.equal(r[i].reshape(-1), want) for r in res)


def test_groups_predivide_and_several_backward_passes():
    p, bpps = 2, 2

    def fn(rank):
        m = model()
        comp = FakeCustom()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters(),
                                       compression=comp, groups=[[m[0].weight, m[0].bias]], op=hvd.Sum,
                                       backward_passes_per_step=bpps, gradient_predivide_factor=1.0)
        for k in range(bpps):
            x, y = batch(10 * rank + k)
            F.mse_loss(m(x), y).backward()
        opt.synchronize()
        shapes = [s.get("shapes") for s in opt._ordered.states]
        return [q.grad.clone() for q in m.parameters()], shapes, opt._ordered.names

    res = hvd_world(p, fn)
    grads, shapes, names = res[0]
    assert names == ["2.bias", "2.weight", "0.weight.group"]
    assert shapes == [[(2,)], [(2, 4)], [(4, 3), (4,)]]
    for i, g in enumerate(grads):
        want = sum(local_grads(r, 0, bpps)[i].half().float().double() for r in range(p))
        torch.testing.assert_close(g.double(), want)
        assert torch.equal(g, res[1][0][i])


def test_state_kept_between_steps_and_training_stays_in_step():
    def fn(rank):
        m = model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                       compression=FakeEF(), gradient_predivide_factor=2.0)
        for s in range(4):
            opt.zero_grad()
            x, y = batch(100 * s + rank)
            F.mse_loss(m(x), y).backward()
            opt.step()
        return torch.cat([q.detach().reshape(-1) for q in m.parameters()]), [len(s) for s in opt._ordered.states]

    res = hvd_world(2, fn)
    assert torch.equal(res[0][0], res[1][0]) and all(n > 0 for n in res[0][1])


def test_horovods_fp16_keeps_its_meaning():
    def fn(rank):
        m = model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters(),
                                       compression=hvd.Compression.fp16)
        assert not any(isinstance(b.reduction, CompressedReduction) for b in opt._ordered.active.buckets)
        x, y = batch(10 * rank)
        F.mse_loss(m(x), y).backward()
        opt.synchronize()
        return [q.grad.clone() for q in m.parameters()]

    res = hvd_world(2, fn)
    for i, g in enumerate(res[0]):
        want = sum(local_grads(r, 0)[i].half().float() for r in range(2)) / 2
        torch.testing.assert_close(g, want, rtol=2e-3, atol=2e-3)


def test_ops_other_than_average_and_sum_and_unknown_names_are_refused():
    def fn(rank):
        m = model()
        with pytest.raises(ValueError, match="Average or hvd.Sum"):
            hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), compression="fp16", op=hvd.Max)
        with pytest.raises(ValueError):
            hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), compression="zip")
        return True

    assert hvd_world(1, fn) == [True]
