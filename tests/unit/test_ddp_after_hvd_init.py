"""ringlet's DistributedDataParallel behaves the same whether or not ``hvd.init()`` has run in the process:
its communicator schedules on the ordered core queue by its own choice, never by global state, so
sufficient factors and ``priority=`` stay in force and give the same parameters as without."""
from __future__ import annotations

import torch
from conftest import run_world
from hvd_world import hvd_world

from ringlet.torch.training import DistributedDataParallel, Priority


def _net() -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    with torch.no_grad():
        for q in net.parameters():
            q.copy_(torch.randn(q.shape, generator=g) * 0.1)
    return net


def _train(rank: int, **options) -> dict:
    net = _net()
    ddp = DistributedDataParallel(net, bucket_cap_mb=0.0002, tune=False, **options)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for s in range(4):
        opt.zero_grad()
        g = torch.Generator().manual_seed(10 * s + rank)
        ddp(torch.randn(2, 64, generator=g)).square().mean().backward()
        opt.step()
    return {"coordinated": ddp._comm.coordinated, "factored": ddp.factored,
            "reductions": ddp.factored_reductions, "priority": ddp._launch.__class__.__name__,
            "params": torch.cat([q.detach().reshape(-1) for q in net.parameters()])}


def _same(with_hvd: list, without: list) -> None:
    for a, b in zip(with_hvd, without):
        assert not a["coordinated"]
        assert a["factored"] == b["factored"] and a["reductions"] == b["reductions"]
        assert a["priority"] == b["priority"]
        assert torch.equal(a["params"], b["params"])


def test_sufficient_factors_stay_in_force_after_hvd_init():
    with_hvd = hvd_world(2, lambda rank: _train(rank, sufficient_factors=True))
    without = run_world(2, lambda rank: _train(rank, sufficient_factors=True))
    assert with_hvd[0]["factored"] and with_hvd[0]["reductions"] > 0
    _same(with_hvd, without)


def test_priority_is_accepted_and_in_force_after_hvd_init():
    opts = {"priority": Priority(partition_bytes=256), "sufficient_factors": True}
    with_hvd = hvd_world(2, lambda rank: _train(rank, **opts))
    without = run_world(2, lambda rank: _train(rank, **opts))
    assert with_hvd[0]["priority"] == "PriorityLaunch" and with_hvd[0]["factored"]
    _same(with_hvd, without)
