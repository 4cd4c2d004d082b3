"""Steps per second of N named all-reduces per step through ``ringlet.torch`` (the Horovod path):
the coordinator's negotiation cost with little data, or with ``--big`` bytes in the first tensor of
each step also how well negotiation overlaps a long transfer.

    ringlet run -np 2 -- python benchmarks/horovod_optimizer/hvd_named_allreduce.py --names 20 --steps 200
    ringlet run -np 2 -- python benchmarks/horovod_optimizer/hvd_named_allreduce.py --names 20 --big 8000000 --steps 50

Each step submits the names asynchronously (as a DistributedOptimizer's hooks do during backward,
``--gap-us`` apart), then synchronizes them all. Rank 0 prints one line: steps/s, ms per step and,
where the coordinator counts them, its full and bit-vector rounds per timed step.
"""
import argparse
import time

import torch

import ringlet.torch as hvd
from ringlet.torch.basics import context


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--names", type=int, default=20)
    ap.add_argument("--elems", type=int, default=1000, help="elements of each small tensor")
    ap.add_argument("--big", type=int, default=0, help="bytes of the first tensor of a step (0: small)")
    ap.add_argument("--gap-us", type=float, default=0.0, help="pause between two submissions")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    hvd.init()
    ts = [torch.ones(args.elems) for _ in range(args.names)]
    if args.big:
        ts[0] = torch.ones(args.big // 4)

    def step() -> None:
        hs = []
        for i, t in enumerate(ts):
            hs.append(hvd.allreduce_async_(t, name=f"g{i}", op=hvd.Average))
            if args.gap_us:
                time.sleep(args.gap_us / 1e6)
        for h in hs:
            hvd.synchronize(h)

    for _ in range(args.warmup):
        step()
    stats = getattr(context().coordinator, "stats", None)
    before = dict(stats) if stats is not None else None
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dt = time.perf_counter() - t0
    rounds = ""
    if before is not None:
        rounds = ", rounds/step: " + " ".join(f"{k} {(stats[k] - before.get(k, 0)) / args.steps:.2f}"
                                               for k in ("full_rounds", "bit_rounds"))
    if hvd.rank() == 0:
        print(f"{args.label} names={args.names} big={args.big} gap_us={args.gap_us} steps={args.steps}: "
              f"{args.steps / dt:.1f} steps/s, {1000 * dt / args.steps:.3f} ms/step{rounds}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
