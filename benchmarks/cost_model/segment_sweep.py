"""One all-reduce at several executor segment sizes, the arms timed in turn in one job, beside the cost
model's prediction for each segment.

    ringlet cluster up --hosts 2 --ranks-per-host 2 --link 1gbit --burst port
    ringlet run --cluster --transport torch -- python benchmarks/cost_model/segment_sweep.py \
        --algorithms halving_doubling,ring --sizes 16M --segments 64K,256K,1M,2M,4M,16M \
        --predict profile.json

Each round times every segment once, in an order rotated every round, so a slow phase of a shared
machine falls on all arms alike. A call's time is the slowest rank's (the start is aligned with a
barrier); the report gives each arm's median and, with ``--predict``, the model's time for that
algorithm, size and segment (``ringlet.tuning.cost.predict_allreduce``) and its error.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

import ringlet
from ringlet.algorithms import ALLREDUCE
from ringlet.benchmarking import parse_size
from ringlet.collectives import runtime
from ringlet.types import ReduceOp, reduction


def timed(ch, algorithm: str, x: torch.Tensor, segment: int) -> float:
    """Slowest rank's seconds for one all-reduce of ``x`` with the executor cut at ``segment`` bytes."""
    schedule = ALLREDUCE[algorithm](ch.size, x.numel(), ch.group.host_of)
    run_on = dataclasses.replace(ch, segment_bytes=segment)
    ringlet.barrier()
    t0 = time.perf_counter()
    run_on.run(schedule, (x,), reduction(ReduceOp.SUM).combine)
    took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    ringlet.allreduce_(took, op=ringlet.ReduceOp.MAX, algorithm="ring")
    return float(took)


def sweep(ch, algorithm: str, nbytes: int, segments: list[int], rounds: int) -> dict[int, list[float]]:
    x = torch.ones(nbytes // 4)
    times: dict[int, list[float]] = {s: [] for s in segments}
    for s in segments:  # compile every plan and touch the scratch
        timed(ch, algorithm, x, s)
    for r in range(rounds):
        k = r % len(segments)
        for s in segments[k:] + segments[:k]:
            times[s].append(timed(ch, algorithm, x, s))
    return times


def predictor(path: str | None):
    if not path:
        return None
    from ringlet.tuning.cost import predict_allreduce
    from ringlet.tuning.network import Network, Topology

    with open(path) as f:
        network = Network.from_dict(json.load(f)["network"])
    topology = Topology(tuple(runtime().world.host_of))
    return lambda a, n, s: predict_allreduce(a, n, topology, network, segment_bytes=s).seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16M")
    ap.add_argument("--algorithms", default="halving_doubling,ring")
    ap.add_argument("--segments", default="64K,256K,1M,2M,4M,16M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--predict", default=None, help="a calibration profile (ringlet tune --out)")
    args = ap.parse_args()
    ringlet.init()
    ch = runtime().channel(runtime().world)
    predict = predictor(args.predict)
    segments = [parse_size(s) for s in args.segments.split(",")]
    if ringlet.rank() == 0:
        print(f"# {ringlet.size()} ranks, hosts {list(ch.group.host_of)}, {args.rounds} rounds per row")
        print(f"{'size':>10} {'algorithm':<20} {'segment':>9} {'ms':>9} {'min ms':>9} {'pred ms':>9} {'err %':>7}")
    for size in (parse_size(s) for s in args.sizes.split(",")):
        for algorithm in args.algorithms.split(","):
            times = sweep(ch, algorithm, size, segments, args.rounds)
            for s in segments:
                med = statistics.median(times[s])
                pred = predict(algorithm, size, s) if predict else float("nan")
                if ringlet.rank() == 0:
                    print(f"{size:>10} {algorithm:<20} {s:>9} {med * 1e3:>9.1f} {min(times[s]) * 1e3:>9.1f} "
                          f"{pred * 1e3:>9.1f} {(pred - med) / med * 100:>+7.1f}", flush=True)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
