"""Models, optimizers and comparisons shared by the ZeRO checkpoint tests (unit and multiproc)."""
from __future__ import annotations

import torch
from torch import nn
from zero_fake import RefZero, fake_gradient

OPTIMIZERS = {
    "adam": (torch.optim.Adam, [{"lr": 1e-2}, {"lr": 3e-3, "betas": (0.8, 0.95)}]),
    "sgd": (torch.optim.SGD, [{"lr": 0.1, "momentum": 0.9}, {"lr": 0.05, "momentum": 0.5}]),
}


class Net(nn.Module):
    """Parameters of 15, 3, 7 (tied under a second name), 1, 0 elements and a 0-dim one, in two param
    groups; a frozen parameter, an integer and a float buffer, a non-persistent buffer."""

    def __init__(self, seed: int = 0, dtype: torch.dtype = torch.float32, b_size: int = 7, extra: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = nn.Linear(5, 3)
        with torch.no_grad():
            self.a.weight.copy_(torch.randn(3, 5, generator=g))
            self.a.bias.copy_(torch.randn(3, generator=g))
        self.b = nn.Parameter(torch.randn(b_size, generator=g))
        self.tied = self.b
        self.c = nn.Parameter(torch.randn(1, generator=g))
        self.e = nn.Parameter(torch.zeros(0))
        self.s = nn.Parameter(torch.randn((), generator=g))
        if extra:
            self.x = nn.Parameter(torch.randn(4, generator=g))
        self.frozen = nn.Parameter(torch.randn(2, generator=g), requires_grad=False)
        self.register_buffer("count", torch.tensor(seed, dtype=torch.int64))
        self.register_buffer("running", torch.randn(4, generator=g))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)
        self.to(dtype)

    def groups(self):
        first = [self.a.weight, self.a.bias, self.b]
        return [first, [p for p in self.parameters() if p.requires_grad and all(p is not q for q in first)]]


def make(seed: int = 0, opt: str = "adam", steps: int = 3, **net_kw):
    """A model and an unsharded optimizer over it after ``steps`` deterministic steps."""
    net = Net(seed, **net_kw)
    cls, hyper = OPTIMIZERS[opt]
    optimizer = cls([{"params": ps, **h} for ps, h in zip(net.groups(), hyper)])
    for step in range(steps):
        for p in net.parameters():
            if p.requires_grad:
                p.grad = fake_gradient(p.detach().reshape(-1).float(), 0, step).reshape(p.shape).to(p.dtype)
        optimizer.step()
    with torch.no_grad():
        net.running.add_(float(steps))
        net.count.add_(steps)
    return net, optimizer


def sharded(world: int, rank: int, seed: int = 0, opt: str = "adam", steps: int = 3, stage: int = 1, **net_kw):
    net, optimizer = make(seed, opt, steps, **net_kw)
    return net, RefZero(net, optimizer, world, rank, stage=stage)


def assert_shards_equal(a, b) -> None:
    """Two ShardStates hold bitwise the same pieces, masters, optimizer state and groups."""
    assert [(p.name, p.start, p.end, p.shape, p.dtype, p.group) for p in a.pieces] == \
        [(p.name, p.start, p.end, p.shape, p.dtype, p.group) for p in b.pieces]
    for p, q in zip(a.pieces, b.pieces):
        assert torch.equal(p.master, q.master), p.name
        assert p.state.keys() == q.state.keys(), p.name
        for k in p.state:
            assert torch.equal(torch.as_tensor(p.state[k]), torch.as_tensor(q.state[k])), (p.name, k)
    assert a.groups == b.groups


def assert_state_dicts_equal(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
