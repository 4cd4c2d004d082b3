"""DDP training in which one rank sleeps in its forward for a while: the job should name it a compute
straggler once, then its recovery once. Every rank writes its timeline and its last summary.

    ringlet run -np 3 -- python straggler_worker.py --out DIR --slow 1
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import ringlet
from ringlet import straggler, timeline
from ringlet.torch.training import DistributedDataParallel


class Net(torch.nn.Module):
    def __init__(self, pause: list[float]):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.pause = pause

    def forward(self, x):
        time.sleep(self.pause[0])
        return self.body(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--slow", type=int, default=1)
    ap.add_argument("--slow-steps", type=int, default=150)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    ringlet.init()
    rank = ringlet.rank()
    out = Path(args.out)
    timeline.start_timeline(str(out / "timeline-{rank}.json"))  # every rank its own file
    pause = [0.0]
    model = DistributedDataParallel(Net(pause), tune=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        pause[0] = 0.06 if rank == args.slow and step < args.slow_steps else 0.01
        opt.zero_grad()
        model(torch.randn(16, 32, generator=g)).square().mean().backward()
        opt.step()
    time.sleep(1.5)  # one more heartbeat publishes and checks
    m = straggler.meter()
    (out / f"summary-{rank}.json").write_text(json.dumps({"summary": m.summary(), "scores": m.scores()}))
    timeline.stop_timeline()
    ringlet.shutdown()


if __name__ == "__main__":
    main()
