"""Models, data and training loops shared by the priority-scheduling tests (in-process and multi-process):
the same seeded model trained by ringlet's DDP first in, first out (the reference) or with
``priority=Priority(...)`` and, optionally, ``overlap_optimizer``."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ringlet.torch.training import DistributedDataParallel, Priority


class Deep(torch.nn.Module):
    """Five layers of different sizes, one registered in another order than it runs, one frozen, one
    with an empty bias-like parameter, and a layer used twice."""

    def __init__(self, width: int = 24):
        super().__init__()
        self.late = torch.nn.Linear(width, 4)           # registered first, runs last
        self.a = torch.nn.Linear(8, width)
        self.b = torch.nn.Linear(width, width)
        self.twice = torch.nn.Linear(width, width)      # used twice in each forward
        self.frozen = torch.nn.Linear(width, width)
        self.frozen.requires_grad_(False)               # no gradient: not reduced, not stepped
        self.empty = torch.nn.Parameter(torch.zeros(0))  # size 0: nothing to send

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.relu(self.twice(torch.tanh(self.b(h))))
        h = torch.relu(self.twice(h)) + self.frozen(h) + self.empty.sum()
        return self.late(h)


def seeded_(net: torch.nn.Module) -> torch.nn.Module:
    """The same parameters on every rank, from a private generator (ranks may be threads)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for q in net.parameters():
            q.copy_(torch.randn(q.shape, generator=g) * 0.3)
    return net


def make_model(width: int = 24) -> Deep:
    return seeded_(Deep(width))


SMALL = 200  # bytes: several pieces per bucket of the test model


def overlapped(net: torch.nn.Module, optimizer: str = "sgd"):
    """``(ddp, opt)``: ``net`` in a small-bucket DDP with priority pieces of ``SMALL`` bytes and
    ``opt`` under ``overlap_optimizer``."""
    ddp = DistributedDataParallel(net, bucket_cap_mb=0.002, first_bucket_cap_mb=0.001, tune=False,
                                  priority=Priority(SMALL))
    return ddp, ddp.overlap_optimizer(make_optimizer(optimizer, net.parameters()))


def data(rank: int, step: int, rows: int = 6):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(rows, 8, generator=g), torch.randn(rows, 4, generator=g)


def make_optimizer(kind: str, params) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
    raise ValueError(kind)


def train(rank: int, steps: int, *, opt: str = "sgd", partition: int | None = None, overlap: bool = False,
          micro: int = 1, eval_every: int = 0, width: int = 24, **ddp_kw):
    """Train ``steps`` steps; returns (flat parameters after ``synchronize``, eval outputs, the DDP).
    ``partition``: None for first in, first out, else ``Priority(partition_bytes=partition)``;
    ``eval_every``: an eval-mode forward under no_grad every that many steps (its outputs returned)."""
    net = make_model(width)
    prio = None if partition is None else Priority(partition_bytes=partition)
    kw = {"bucket_cap_mb": 0.002, "first_bucket_cap_mb": 0.001, "tune": False, **ddp_kw}
    ddp = DistributedDataParallel(net, priority=prio, **kw)
    optimizer = make_optimizer(opt, net.parameters())
    if overlap:
        ddp.overlap_optimizer(optimizer)
    evals = []
    for s in range(steps):
        optimizer.zero_grad()
        for m in range(micro):
            x, y = data(rank, s * micro + m)
            if m < micro - 1:
                with ddp.no_sync():
                    (F.mse_loss(ddp(x), y) / micro).backward()
            else:
                (F.mse_loss(ddp(x), y) / micro).backward()
        optimizer.step()
        if eval_every and s % eval_every == 0:
            ddp.eval()
            with torch.no_grad():
                evals.append(ddp(data(99, s)[0]))
            ddp.train()
    ddp.synchronize()
    return flat(net), evals, ddp


def flat(net: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])
