"""Models, data and training loops shared by the ZeroOptimizer tests (in-process ``test_zero_optimizer*.py``
and the real-process ``tests/workers/zero_worker.py``): ZeRO training on every rank against a plain model
trained in one process on the concatenated batch (the same gradient: every rank's loss is a mean over
equally many rows)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ringlet.torch.training.zero import ZeroOptimizer, ZeroOptions

ROWS = 4


class Net(torch.nn.Module):
    """Parameter sizes 91, 13, 143, 11, 33, 3, 1 (primes and one element: shards of every unevenness);
    ``unused``: one more layer that never gets a gradient."""

    def __init__(self, unused: bool = False):
        super().__init__()
        self.fc1 = torch.nn.Linear(7, 13)
        self.fc2 = torch.nn.Linear(13, 11)
        self.fc3 = torch.nn.Linear(11, 3)
        self.scale = torch.nn.Parameter(torch.ones(1))
        if unused:
            self.extra = torch.nn.Linear(5, 2)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x))))) * self.scale


def make_model(dtype=torch.float32, unused: bool = False) -> Net:
    """The same values every call, from a generator of its own (ranks may be threads: no global seed)."""
    net = Net(unused)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    return net.to(dtype)


def batch(rank: int, step: int, micro: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(100_000 * step + 1000 * micro + rank)
    return torch.randn(ROWS, 7, generator=g).to(dtype), torch.randn(ROWS, 3, generator=g).to(dtype)


class NormSGD(torch.optim.Optimizer):
    """Not elementwise: each parameter moves by ``lr`` times its gradient over the gradient's norm."""

    def __init__(self, params, lr=0.05):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.sub_(p.grad / (p.grad.norm() + 1e-3), alpha=g["lr"])


OPTIMIZERS = {"adam": (torch.optim.Adam, {"lr": 0.01}), "sgd": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
              "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}), "norm": (NormSGD, {"lr": 0.05})}


@dataclass
class Config:
    """One training run: ``stage``, optimizer name, ``steps``, ``micro`` backwards per step, parameter
    ``dtype``, ``bucket_bytes``, a ``scheduler`` (StepLR), an ``unused`` layer, more ZeroOptions."""

    stage: int = 1
    opt: str = "adam"
    steps: int = 4
    micro: int = 1
    dtype: torch.dtype = torch.float32
    bucket_bytes: int = 256
    scheduler: bool = False
    unused: bool = False
    options: dict = field(default_factory=dict)
    clip: float | None = None

    def label(self) -> str:
        return (f"s{self.stage}.{self.opt}.m{self.micro}.{str(self.dtype)[6:]}{'.lr' if self.scheduler else ''}"
                f"{'.unused' if self.unused else ''}{'.' + ','.join(self.options) if self.options else ''}"
                f"{f'.clip{self.clip}' if self.clip else ''}")


def _sched(opt, on: bool):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if on else None


def train_zero(rank: int, cfg: Config, model: torch.nn.Module | None = None):
    """ZeRO training on this rank; returns ``(model, zero)``."""
    net = model if model is not None else make_model(cfg.dtype, cfg.unused)
    cls, kw = OPTIMIZERS[cfg.opt]
    zero = ZeroOptimizer(cls, net, stage=cfg.stage,
                         options=ZeroOptions(bucket_bytes=cfg.bucket_bytes, **cfg.options), **kw)
    sched = _sched(zero, cfg.scheduler)
    for s in range(cfg.steps):
        for m in range(cfg.micro):
            x, y = batch(rank, s, m, cfg.dtype)
            F.mse_loss(net(x), y).backward()
        if cfg.clip is not None:
            zero.clip_grad_norm_(cfg.clip)
        zero.step()
        zero.zero_grad()
        if sched is not None:
            sched.step()
    return net, zero


def train_plain(world: int, cfg: Config) -> torch.nn.Module:
    """The same training in one process on the concatenated batch; a parameter without a gradient gets a
    zero gradient (ZeRO's semantics)."""
    net = make_model(cfg.dtype, cfg.unused)
    cls, kw = OPTIMIZERS[cfg.opt]
    masters = [p.detach().float().clone() for p in net.parameters()] if cfg.dtype != torch.float32 else None
    opt = cls(masters if masters is not None else net.parameters(), **kw)
    sched = _sched(opt, cfg.scheduler)
    for s in range(cfg.steps):
        for m in range(cfg.micro):
            xs, ys = zip(*(batch(r, s, m, cfg.dtype) for r in range(world)))
            F.mse_loss(net(torch.cat(xs)), torch.cat(ys)).backward()
        with torch.no_grad():
            for i, p in enumerate(net.parameters()):
                g = torch.zeros_like(p) if p.grad is None else p.grad
                if masters is not None:
                    masters[i].grad = g.float()
                else:
                    p.grad = g
            if cfg.clip is not None:
                torch.nn.utils.clip_grad_norm_(masters if masters is not None else list(net.parameters()), cfg.clip)
            opt.step()
            if masters is not None:
                for p, mp in zip(net.parameters(), masters):
                    p.copy_(mp)
        net.zero_grad()
        if sched is not None:
            sched.step()
    return net


def flat_params(net: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float64) for p in net.parameters()])


def snapshot(net: torch.nn.Module, zero: ZeroOptimizer) -> torch.Tensor:
    """:func:`flat_params`, gathered first under stage 3 (a collective there: every rank calls it)."""
    with zero.gathered():
        return flat_params(net)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def poison(net: torch.nn.Module, rank: int, who: int) -> list:
    """A hook that puts an inf into one element of ``fc2.weight``'s gradient on rank ``who`` only."""
    def hook(g):
        if rank != who:
            return g
        g = g.clone()
        g[3, 5] = float("inf")
        return g
    return [net.fc2.weight.register_hook(hook)]


def scaler_run(rank: int, stage: int, poisoned_by: int, steps: int = 4):
    """ringlet's GradScaler over a ZeroOptimizer (Adam, small buckets): rank ``poisoned_by``'s gradients
    are made infinite at step 2. Returns the model, and per step (was the step skipped, the scale after)."""
    from ringlet.torch.training import GradScaler

    net = make_model()
    zero = ZeroOptimizer(torch.optim.Adam, net, stage=stage, options=ZeroOptions(bucket_bytes=256), lr=0.01)
    scaler = GradScaler(init_scale=2.0**10)
    out = []
    for s in range(steps):
        handles = poison(net, rank, who=poisoned_by) if s == 2 else []
        before = flat_params(net)
        x, y = batch(rank, s)
        scaler.scale(F.mse_loss(net(x), y)).backward()
        scaler.step(zero)
        scaler.update()
        zero.zero_grad()
        for h in handles:
            h.remove()
        out.append((torch.equal(before, flat_params(net)), scaler.get_scale()))
    return net, out
