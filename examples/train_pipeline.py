"""Train a deep MLP on synthetic data through ``ringlet.torch.Pipeline``; print step times and the bubble.

    ringlet run -np 4 -- python examples/train_pipeline.py --stages 2 --microbatches 8 --schedule 1f1b
    ringlet run -np 4 -- python examples/train_pipeline.py --stages 4 --microbatches 8 --schedule gpipe
    ringlet run -np 4 -- python examples/train_pipeline.py --stages 1 --microbatches 1   # data parallel

The world is ``stages × replicas`` ranks (rank = stage × replicas + replica); ``--batch-size`` is per
replica. Every rank reports its steps' times; rank 0 prints, per stage, the median step time and how it
splits (computing, waiting for the neighbouring stages, waiting for the replica average), the measured
bubble (waiting / step) against (S-1)/(M+S-1), the most micro-batches held at once and the stage's
parameters. ``--json PATH``
writes the same numbers for a benchmark harness.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

import ringlet
import ringlet.torch
from ringlet.torch.training.pipeline import bubble_fraction


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    p.add_argument("--depth", type=int, default=16, help="hidden Linear+ReLU layers")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64, help="rows per replica and step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the statistics")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--compression", default=None, help="compress the replica average, e.g. fp16")
    p.add_argument("--json", default=None, help="write the per-stage numbers here (rank 0)")
    return p.parse_args()


def build(depth: int, width: int) -> torch.nn.Sequential:
    torch.manual_seed(0)  # the same model on every rank
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    ringlet.init()
    pipe = ringlet.torch.Pipeline(build(args.depth, args.width), args.stages, args.microbatches, args.schedule,
                                  compression=args.compression)
    opt = torch.optim.SGD(pipe.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(1000 + pipe.replica)
    rows = []
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.width, generator=g)
        y = torch.randint(0, 10, (args.batch_size,), generator=g)
        opt.zero_grad()
        loss = pipe.step(x if pipe.is_first else None, y if pipe.is_last else None, F.cross_entropy)
        opt.step()
        s = pipe.stats
        rows.append([s.step_s, s.compute_s, s.wait_s, s.reduce_s, s.peak_inflight])
        if loss is not None and pipe.replica == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step}: loss {loss:.4f}, {s.step_s * 1e3:.1f} ms", flush=True)
    report(args, pipe, rows)
    ringlet.shutdown()
    return 0


def report(args, pipe, rows) -> None:
    """Gather every rank's kept steps; rank 0 prints and saves the per-stage medians."""
    kept = torch.tensor(rows[args.warmup:] or rows, dtype=torch.float64)
    params = float(sum(p.numel() for p in pipe.parameters()))
    mine = torch.cat([torch.tensor([float(pipe.stage), params]), kept.reshape(-1)]).unsqueeze(0)
    every = ringlet.allgather(mine)
    if ringlet.rank() != 0:
        return
    theory = bubble_fraction(args.stages, args.microbatches)
    print(f"{args.stages} stages x {pipe.replicas} replicas, {args.microbatches} micro-batches, {args.schedule}: "
          f"bubble (S-1)/(M+S-1) = {theory:.3f}")
    out = {"stages": args.stages, "replicas": pipe.replicas, "microbatches": args.microbatches,
           "schedule": args.schedule, "bubble_theory": theory, "per_stage": []}
    for stage in range(args.stages):
        mine = [r for r in every if int(r[0]) == stage]
        params = int(mine[0][1])
        mats = [r[2:].reshape(-1, 5) for r in mine]
        steps = torch.cat(mats)
        med = [statistics.median(steps[:, k].tolist()) for k in range(4)]
        bubble = float((steps[:, 2] / steps[:, 0]).mean())
        peak = int(steps[:, 4].max())
        print(f"  stage {stage}: step {med[0] * 1e3:.1f} ms = compute {med[1] * 1e3:.1f} + wait {med[2] * 1e3:.1f} "
              f"+ replica average {med[3] * 1e3:.1f} ms; bubble {bubble:.3f}; held {peak} micro-batches; "
              f"{params} parameters")
        out["per_stage"].append({"stage": stage, "step_ms": med[0] * 1e3, "compute_ms": med[1] * 1e3,
                                 "wait_ms": med[2] * 1e3, "reduce_ms": med[3] * 1e3, "bubble": bubble,
                                 "peak_inflight": peak, "parameters": params})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
