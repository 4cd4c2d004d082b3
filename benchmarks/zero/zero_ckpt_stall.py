"""How long a checkpoint stops training: a synchronous save against an asynchronous one of the same ZeRO
state, in one job (the target: the asynchronous stall ≤ 1/20 of the synchronous one).

    ringlet run -np 4 --transport shm -- python benchmarks/zero/zero_ckpt_stall.py --dir /tmp/ckpt --out stall.json

The model is an MLP of ``--layers`` square ``Linear(--width, --width)`` layers (default 6 × 4096: 100.7 M
parameters, fp32), trained with ``ZeroOptimizer(torch.optim.Adam, model, stage=--stage)``. Rounds alternate
a synchronous save (``checkpoint.save``) and an asynchronous one (``checkpoint.save_async``;
``--steps-during`` training steps run while it writes, the same number on every rank, then it is waited
for), each after a training step. The stall is the time the save held the calling thread (``SaveHandle.stall_seconds``)
plus, for the asynchronous save, the time the next ``step()`` waited for its background copy of the shard
state (``blocked_seconds``), the slowest rank's; the report gives the medians and their ratio, and the
background write time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys

import torch

import ringlet
import ringlet.torch as rt
from ringlet.torch.training.zero import checkpoint as zckpt


def _slowest(x: float) -> float:
    return ringlet.allreduce(torch.tensor([x], dtype=torch.float64), op=ringlet.ReduceOp.MAX).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps-during", type=int, default=3, help="training steps while an asynchronous save writes")
    args = ap.parse_args()
    ringlet.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    zero = rt.ZeroOptimizer(torch.optim.Adam, model, stage=args.stage, lr=1e-4)
    x = torch.randn(8, args.width, generator=torch.Generator().manual_seed(ringlet.rank()))

    def step():
        zero.zero_grad()
        model(x).pow(2).mean().backward()
        zero.step()

    step()
    sync, asyn, written = [], [], []
    for r in range(args.rounds):
        step()
        h = zckpt.save(os.path.join(args.dir, f"sync-{r}"), zero, model)
        sync.append(_slowest(h.stall_seconds))
        step()
        h = zckpt.save_async(os.path.join(args.dir, f"async-{r}"), zero, model)
        for _ in range(args.steps_during):  # the same count on every rank: training's collectives stay matched
            step()
        h.wait()
        asyn.append(_slowest(h.stall_seconds + h.blocked_seconds))
        written.append(_slowest(h.write_seconds))
    if ringlet.rank() == 0:
        res = {"ranks": ringlet.size(), "params": sum(b.numel for b in zero.layout.buckets), "stage": args.stage,
               "sync_stall_s": sync, "async_stall_s": asyn, "async_write_s": written,
               "ratio": statistics.median(asyn) / statistics.median(sync)}
        print(json.dumps(res, indent=1))
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(res, fh, indent=1)
        shutil.rmtree(args.dir, ignore_errors=True)
    ringlet.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
