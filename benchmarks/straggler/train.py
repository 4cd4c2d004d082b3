"""A small CNN trained with ringlet's DDP on synthetic images, for the straggler benchmark: every rank
records, per step, when its step ended and which stragglers its detector names, and writes
``OUT/rank-R.json`` at the end (its last summary, scores, and the first step at which each verdict stood).

    ringlet run --cluster -np 4 -- python train.py --out DIR --steps 40 --batch 32
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import ringlet
from ringlet import straggler
from ringlet.torch.training import DistributedDataParallel


class Net(torch.nn.Module):
    """Two convolutions and a 2.1 M-weight fully connected layer: 8.5 MB of gradients per step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 8 * 8, 1024)
        self.out = torch.nn.Linear(1024, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.out(F.relu(self.fc(x.flatten(1))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ringlet.init()
    rank = ringlet.rank()
    model = DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    meter = straggler.meter()
    first: dict[str, dict] = {}
    t0 = time.time()
    for step in range(args.steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        for v in (meter.detector.stragglers if meter.detector is not None else []):
            key = f"{v.kind}:{v.host}"
            if key not in first:
                first[key] = dict(v.args(), step=step + 1, seconds=round(time.time() - t0, 2))
    seconds = time.time() - t0
    time.sleep(1.5)  # the last heartbeat's check
    res = {"rank": rank, "host": ringlet.collectives.runtime().hostnames[rank], "steps": args.steps,
           "seconds": round(seconds, 2), "summary": meter.summary(), "scores": meter.scores(),
           "named": list(first.values())}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank-{rank}.json").write_text(json.dumps(res, indent=1))
    ringlet.shutdown()


if __name__ == "__main__":
    main()
