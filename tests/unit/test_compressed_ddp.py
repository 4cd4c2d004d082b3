"""``ringlet.torch.DistributedDataParallel(..., compression=...)`` in-process: compressed buckets, one state
per bucket, ``no_sync`` accumulation, factored weights not compressed again, the tuner's candidates."""
from __future__ import annotations

import pytest
import torch
from conftest import run_world
from prio_models import data, seeded_
from test_compressed_allreduce import ref_scatter
from testonly_compressors import FakeEF

from ringlet.compression import FP16
from ringlet.torch.training import DistributedDataParallel
from ringlet.torch.training.compressed_reduction import CompressedReduction
from ringlet.torch.training.factor_reduction import FactorReduction


def model(width: int = 16) -> torch.nn.Module:
    return seeded_(torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 4)))


def train(rank: int, steps: int, micro: int = 1, **ddp_kw):
    net = model()
    ddp = DistributedDataParallel(net, bucket_cap_mb=0.0002, tune=False, **ddp_kw)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for s in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = data(rank, s * micro + m)
            if m < micro - 1:
                with ddp.no_sync():
                    torch.nn.functional.mse_loss(ddp(x), y).backward()
            else:
                torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return ddp, net


def flat_params(net) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


@pytest.mark.parametrize("p", [2, 3])
def test_fp16_buckets_train_in_step_and_close_to_dense(p):
    def fn(rank):
        ddp, net = train(rank, 4, compression="fp16")
        kinds = {type(b.reduction) for b in ddp._buckets}
        states = [b.reduction.state for b in ddp._buckets]
        _, dense = train(rank, 4)
        return flat_params(net), flat_params(dense), kinds, len(ddp._buckets), len({id(s) for s in states})

    res = run_world(p, fn)
    for params, dense, kinds, nb, nstates in res:
        assert torch.equal(params, res[0][0])
        assert float((params - dense).abs().max()) < 1e-2
        assert kinds == {CompressedReduction} and nb >= 2 and nstates == nb


def test_one_step_gives_the_compressed_average_of_each_bucket():
    p = 2

    def fn(rank):
        net = model()
        ddp = DistributedDataParallel(net, bucket_cap_mb=0.0002, tune=False, compression=FP16)
        x, y = data(rank, 0)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        plain = model()
        torch.nn.functional.mse_loss(plain(x), y).backward()
        layout = [[dict(net.named_parameters())[n] for n in names] for names in
                  [[n.split("module.", 1)[-1] for n in b] for b in ddp.bucket_layout]]
        local = dict(zip([id(q) for q in net.parameters()], [q.grad.clone() for q in plain.parameters()]))
        return [(torch.cat([local[id(q)].reshape(-1) for q in ps]),
                 torch.cat([q.grad.reshape(-1) for q in ps])) for ps in layout]

    res = run_world(p, fn)
    for b in range(len(res[0])):
        want = ref_scatter([res[r][b][0] for r in range(p)], FP16, True)
        for r in range(p):
            assert torch.equal(res[r][b][1], want)


def test_no_sync_accumulates_then_reduces_compressed():
    def fn(rank):
        _, net = train(rank, 3, micro=3, compression="bf16")
        _, dense = train(rank, 3, micro=3)
        return flat_params(net), flat_params(dense)

    res = run_world(2, fn)
    for params, dense in res:
        assert torch.equal(params, res[0][0]) and float((params - dense).abs().max()) < 5e-2


def test_state_per_bucket_lines_up_across_steps():
    def fn(rank):
        ddp, net = train(rank, 4, compression=FakeEF())  # raises if a bucket met another bucket's state
        assert ddp.compression_states == [b.reduction.state for b in ddp._buckets]
        return [sorted(k for k in b.reduction.state) for b in ddp._buckets], flat_params(net)

    res = run_world(2, fn)
    assert res[0][0] and all(keys for keys in res[0][0]) and torch.equal(res[0][1], res[1][1])


def test_factored_weights_are_not_compressed_again():
    def fn(rank):
        net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
        ddp = DistributedDataParallel(net, bucket_cap_mb=0.0002, tune=False, sufficient_factors=True,
                                      compression="fp16")
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for s in range(3):
            opt.zero_grad()
            g = torch.Generator().manual_seed(10 * s + rank)
            ddp(torch.randn(2, 64, generator=g)).square().mean().backward()
            opt.step()
        return {type(b.reduction) for b in ddp._buckets}, ddp.factored, flat_params(net)

    res = run_world(2, fn)
    kinds, factored, params = res[0]
    assert factored and kinds == {FactorReduction, CompressedReduction}
    assert torch.equal(params, res[1][2])


def test_the_tuners_candidates_keep_the_compression():
    def fn(rank):
        net = model()
        ddp = DistributedDataParallel(net, bucket_cap_mb=0.0002, compression="fp16")
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        algos = set()
        for s in range(12):
            opt.zero_grad()
            x, y = data(rank, s)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            algos |= {b.algo for b in ddp._buckets}
            opt.step()
            assert all(isinstance(b.reduction, CompressedReduction) for b in ddp._buckets)
        return algos, flat_params(net)

    res = run_world(3, fn)
    assert res[0][0] == {"auto", "direct"}
    assert all(torch.equal(r[1], res[0][1]) for r in res)


def test_bad_compression_is_refused_at_construction():
    def fn(rank):
        with pytest.raises(ValueError):
            DistributedDataParallel(model(), compression="zip")
        with pytest.raises(TypeError):
            DistributedDataParallel(model(), compression=3)
        return True

    assert run_world(1, fn) == [True]
