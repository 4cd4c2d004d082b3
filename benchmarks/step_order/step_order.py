"""A paired A/B of one of the executor's rules, each arm timed in the same job.

    ringlet cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5
    ringlet run --cluster --transport torch -- python benchmarks/step_order/step_order.py --sizes 4M,16M,64M
    ringlet run --cluster --transport torch -- python benchmarks/step_order/step_order.py --rule interleave --algorithms tree,direct

``--rule hold`` (the default): sends in step order, or released as soon as their data is ready. With the
rule on (``on``) a send of the next step to a new peer waits for the step before; off, it goes out as
soon as its data is reduced, sharing the link with the older step's sends. ``--rule interleave``: a
step's segments from several peers applied in turn (``on``), or peer after peer (``off``).

For every algorithm and size, each round times one all-reduce with the rule on and one with it off, in
an order that alternates every round. A call's time is the slowest rank's (the start is aligned with a
barrier). The report gives the median time of each arm and the median of the per-round ratios
``on / off`` (below 1: the rule helps). ``--segment`` sets the executor's segment size (default: the
options' 4 MiB).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

import ringlet
from ringlet.algorithms import executor
from ringlet.benchmarking import parse_size

ALGORITHMS = "ring,tree,halving_doubling,recursive_doubling,direct,hierarchical,torus"


RULES = {"hold": "HOLD_NEW_PEERS", "interleave": "INTERLEAVE_PEERS"}  # --rule -> the executor's flag


def timed(x: torch.Tensor, algorithm: str, rule: str, on: bool) -> float:
    """Slowest rank's seconds for one all-reduce with ``rule`` set to ``on``."""
    setattr(executor, RULES[rule], on)  # each kind of plan is compiled once and cached
    ringlet.barrier()
    t0 = time.perf_counter()
    ringlet.allreduce_(x, algorithm=algorithm)
    took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    ringlet.allreduce_(took, op=ringlet.ReduceOp.MAX, algorithm="ring")
    return float(took)


def pair(algorithm: str, nbytes: int, rounds: int, rule: str) -> tuple[list[float], list[float]]:
    x = torch.ones(nbytes // 4)
    on, off = [], []
    timed(x, algorithm, rule, True), timed(x, algorithm, rule, False)  # compile both plans, touch the scratch
    for r in range(rounds):
        for arm in ((True, False) if r % 2 == 0 else (False, True)):
            (on if arm else off).append(timed(x, algorithm, rule, arm))
    setattr(executor, RULES[rule], True)
    return on, off


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4M,16M,64M")
    ap.add_argument("--algorithms", default=ALGORITHMS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--segment", type=parse_size, default=None, help="executor segment size (bytes)")
    ap.add_argument("--rule", choices=sorted(RULES), default="hold", help="the executor rule to A/B")
    args = ap.parse_args()
    options = ringlet.Options.from_env()
    if args.segment:
        options = dataclasses.replace(options, segment_bytes=args.segment)
    ringlet.init(options=options)
    if ringlet.rank() == 0:
        print(f"# {ringlet.size()} ranks, segment {options.segment_bytes} B, rule {args.rule}, "
              f"{args.rounds} rounds per row")
        print(f"{'size':>10} {'algorithm':<20} {'on ms':>12} {'off ms':>10} {'ratio':>7}")
    for size in (parse_size(s) for s in args.sizes.split(",")):
        for algorithm in args.algorithms.split(","):
            on, off = pair(algorithm, size, args.rounds, args.rule)
            ratio = statistics.median(a / b for a, b in zip(on, off))
            if ringlet.rank() == 0:
                print(f"{size:>10} {algorithm:<20} {statistics.median(on) * 1e3:>12.1f} "
                      f"{statistics.median(off) * 1e3:>10.1f} {ratio:>7.3f}", flush=True)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
