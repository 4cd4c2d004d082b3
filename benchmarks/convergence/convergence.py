"""Accuracy of every way of sending fewer bytes, on real data, against uncompressed fp32 training.

    ringlet run -np 4 -- python benchmarks/convergence/convergence.py --epochs 30
    ringlet run -np 4 -- python benchmarks/convergence/convergence.py --models mlp --arms fp32 fp16 topk:0.01+ef topk:0.01

scikit-learn's digits (1437 training and 360 test images of 8x8, ``examples/digits_data.py``), an MLP
and a small CNN. Every arm trains its own copy of the same initial model (seed fixed) for the same
epochs on the same shards (rank ``r`` takes every ``p``-th sample, reshuffled per epoch by a seed shared
by the ranks; each cell is the mean over ``--seeds``), with SGD and momentum, through ringlet's ``DistributedDataParallel`` with the sufficient
factors and the step tuner off (so every gradient goes through the arm's compressor). Arms:

* ``fp32``: no compression (the reference);
* a compressor name of :func:`ringlet.compression.get` (``fp16``, ``bf16``, ``int8+ef``, ``topk:0.01``,
  ``topk:0.01+ef``, ``powersgd:2``, ...);
* ``localsgd:K``: post-local SGD, parameters averaged every ``K`` steps after one epoch of synchronous
  steps; ``diloco:H[:LR[:MOMENTUM[:COMPRESSOR]]]``: the DiLoCo-style outer step every ``H`` inner steps
  (outer Nesterov SGD, lr 0.7 and momentum 0.9 by default, the paper's; the deltas compressed when a
  compressor is named). Both synchronise once more after the last step.

Prints one markdown table: final test accuracy per arm and model, and the difference to ``fp32``.
Parameters are checked equal on every rank at the end of each arm.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from digits_data import digits  # noqa: E402  (examples/digits_data.py)

import ringlet  # noqa: E402
import ringlet.torch  # noqa: E402

DEFAULT_ARMS = ("fp32", "fp16", "bf16", "int8+ef", "powersgd:2", "powersgd:4", "topk:0.01+ef", "topk:0.01",
                "localsgd:2", "localsgd:4", "diloco:8", "diloco:8:0.7:0.5", "diloco:4:0.7:0.5")


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


MODELS = {"mlp": mlp, "cnn": cnn}


def build(arm: str, model: nn.Module, opt: torch.optim.Optimizer, steps_per_epoch: int):
    """``(module to call, step function, finish)`` for ``arm``: the step function runs after backward,
    ``finish`` once after the last step (local SGD and DiLoCo synchronise there, so that every rank holds
    the model that is tested)."""
    kind, _, arg = arm.partition(":")
    if kind == "localsgd":
        from ringlet.torch.training import LocalSGD  # noqa: PLC0415

        ddp = ringlet.torch.DistributedDataParallel(model, sufficient_factors=False, tune=False)
        local = LocalSGD(ddp, opt, period=int(arg), warmup_steps=steps_per_epoch)
        return ddp, local.step, local.average
    if kind == "diloco":
        from ringlet.torch.training import DiLoCo  # noqa: PLC0415

        period, _, rest = arg.partition(":")
        lr, _, rest = rest.partition(":")
        momentum, _, compression = rest.partition(":")
        outer = DiLoCo(model, opt, period=int(period), outer_lr=float(lr or 0.7), outer_momentum=float(momentum or 0.9),
                       compression=compression or None)
        return model, outer.step, outer.outer_step
    extra = {} if arm == "fp32" else {"compression": arm}
    ddp = ringlet.torch.DistributedDataParallel(model, sufficient_factors=False, tune=False, **extra)
    return ddp, opt.step, lambda: None


def train(arm: str, make, args, seed: int, train_set, test_set, rank: int, size: int) -> float:
    torch.manual_seed(seed)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    x, y = train_set.tensors
    steps_per_epoch = len(y) // (args.batch_size * size)
    net, step, finish = build(arm, model, opt, steps_per_epoch)
    for epoch in range(args.epochs):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        mine = order[rank::size]
        for i in range(steps_per_epoch):
            idx = mine[i * args.batch_size:(i + 1) * args.batch_size]
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            step()
    finish()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    ringlet.broadcast_(ref, 0)
    if not torch.equal(flat, ref):
        raise SystemExit(f"rank {rank}: arm {arm}: parameters differ from rank 0's")
    tx, ty = test_set.tensors
    with torch.no_grad():
        return (model(tx).argmax(1) == ty).float().mean().item() * 100.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="a cell is the mean over these seeds (initial model and data order)")
    args = parser.parse_args()
    ringlet.init()
    rank, size = ringlet.rank(), ringlet.size()
    train_set, test_set = digits()
    runs = {(arm, m): [train(arm, MODELS[m], args, s, train_set, test_set, rank, size) for s in args.seeds]
            for m in args.models for arm in args.arms}
    acc = {k: sum(v) / len(v) for k, v in runs.items()}
    if rank == 0:
        print(f"digits, {size} ranks, {args.epochs} epochs, batch {args.batch_size} per rank, SGD lr {args.lr} "
              f"momentum 0.9; test accuracy (360 images), mean over seeds {args.seeds} (min-max)\n")
        print("| arm | " + " | ".join(f"{m} acc % | {m} Δ vs fp32" for m in args.models) + " |")
        print("|---|" + "---|---|" * len(args.models))
        for arm in args.arms:
            cells = []
            for m in args.models:
                ref = acc.get(("fp32", m))
                lo, hi = min(runs[(arm, m)]), max(runs[(arm, m)])
                cells += [f"{acc[(arm, m)]:.2f} ({lo:.1f}-{hi:.1f})", "" if ref is None else f"{acc[(arm, m)] - ref:+.2f}"]
            print(f"| {arm} | " + " | ".join(cells) + " |")
    ringlet.shutdown()


if __name__ == "__main__":
    main()
