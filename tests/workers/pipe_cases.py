"""Pipeline cases shared by the in-process tests (ranks as threads) and the ``ringlet run`` worker: a
seeded deep MLP as an ``nn.Sequential``, every replica's batches, and training ``steps`` steps of SGD
through :class:`ringlet.torch.Pipeline` against the single-process model on the full batches."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ringlet.torch import GradScaler, Pipeline, ZeroOptimizer, ZeroOptions

WIDTH, BATCH, LR = 6, 8, 0.1  # BATCH: rows per replica


def mlp(depth: int = 4) -> torch.nn.Sequential:
    """``depth`` Linear+Tanh pairs and a head, the same on every rank (a private generator: ranks may be
    threads)."""
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 3))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for q in net.parameters():
            q.copy_(torch.randn(q.shape, generator=g) * 0.5)
    return net


def batches(steps: int, replicas: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(steps, replicas * BATCH, WIDTH, generator=g),
            torch.randn(steps, replicas * BATCH, 3, generator=g))


def reference(steps: int, replicas: int) -> dict[str, torch.Tensor]:
    """The single-process model's parameters after ``steps`` SGD steps on the full batches (mean loss)."""
    net = mlp()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    xs, ys = batches(steps, replicas)
    for n in range(steps):
        opt.zero_grad()
        F.mse_loss(net(xs[n]), ys[n]).backward()
        opt.step()
    return {k: v.detach() for k, v in net.named_parameters()}


def train(stages: int, schedule: str, microbatches: int = 4, steps: int = 3, *, zero: int = 0,
          scale: float | None = None, **pipe_kw) -> tuple[Pipeline, float, list]:
    """Train through a pipeline; returns it, the largest parameter difference from :func:`reference`, and
    the losses. ``zero``: a ZeroOptimizer of that stage over the replicas (the pipeline then leaves the
    averaging to it); ``scale``: a GradScaler of that initial scale."""
    import ringlet

    replicas = ringlet.size() // stages
    if zero:
        pipe_kw["sync_replicas"] = False
    pipe = Pipeline(mlp(), stages, microbatches, schedule, **pipe_kw)
    opt = (ZeroOptimizer(torch.optim.SGD, pipe.module, stage=zero, options=ZeroOptions(group=pipe.replica_group),
                         lr=LR) if zero else torch.optim.SGD(pipe.parameters(), lr=LR))
    scaler = GradScaler(init_scale=scale) if scale else None
    xs, ys = batches(steps, replicas)
    rows = slice(pipe.replica * BATCH, (pipe.replica + 1) * BATCH)
    losses = []
    for n in range(steps):
        opt.zero_grad()
        losses.append(pipe.step(xs[n][rows] if pipe.is_first else None, ys[n][rows] if pipe.is_last else None,
                                F.mse_loss, scaler=scaler))
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
    want = reference(steps, replicas)
    err = max(float((p.detach() - want[k]).abs().max()) for k, p in pipe.named_parameters())
    return pipe, err, losses


def expected_peak(pipe: Pipeline) -> int:
    """The most micro-batches a stage holds: GPipe all of them, 1F1B ``S - stage`` at most."""
    m = pipe.microbatches
    return m if pipe.schedule == "gpipe" else min(pipe.stages - pipe.stage, m)
