"""Dynamic adjustment while the link changes: ringlet's DDP with ``adapt=`` against fixed configurations.

    RINGLET_PROFILE=P ringlet run --cluster -np 4 -- python benchmarks/dynamic_link/dynamic_link.py adapt --steps 400 --out A.json
    RINGLET_PROFILE=P ringlet run --cluster -np 4 -- python benchmarks/dynamic_link/dynamic_link.py fixed --out F.json \\
        --config auto --config ring:25 --config halving_doubling:4 ...

``adapt``: trains ``--model`` for ``--steps`` steps with ``adapt=Adapt(every=--every)`` (the installed cost
model, from the calibration profile ``ringlet.init`` loads: give ``RINGLET_PROFILE``; the script stops when
there is none); the step tuner's trial of ``"auto"`` against the model's two best other algorithms comes
first (up to 60 steps) unless ``--no-tune``. Rank 0 prints one line per step (wall clock, step seconds, bucket cap, what each bucket's
all-reduce runs) and every switch, and writes ``--out`` (JSON: the steps, the switches, each with the
epoch time, so that a driver changing the link rate meanwhile can line them up; see dynamic_link.sh).
The switches are also logged (INFO) and, with ``RINGLET_TIMELINE``, marked on the timeline.

Sufficient factors are off in every run (they would add candidates to the trial and change what a
configuration sends). ``fixed``: the same training with each ``--config ALGORITHM[:CAP_MB]`` (``auto`` = the cost model's
choice, never corrected; another name forces the algorithm, at the model's best segment size; CAP_MB the
bucket cap, default 25), no adjustment, no step tuner, all in this one job: ``--rounds`` rounds of
``--block`` timed steps per configuration after one untimed one, the order rotating every round, so that
a slow stretch of the machine hits every configuration alike. Writes the median step time of each.

``python benchmarks/dynamic_link/dynamic_link_summary.py`` lines the runs up with the link changes.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import synthetic_benchmark  # noqa: E402 - the models of the synthetic benchmark

import ringlet  # noqa: E402
from ringlet.torch.training import Adapt, DistributedDataParallel  # noqa: E402
from ringlet.tuning import select  # noqa: E402

MODELS = {"cnn": synthetic_benchmark.cnn, "mlp": synthetic_benchmark.mlp}


def parse_config(text: str) -> tuple[str, float]:
    """``ALGORITHM[:CAP_MB]`` -> (algorithm, cap in MB). ``SystemExit`` for a malformed one."""
    name, _, cap = text.partition(":")
    try:
        value = float(cap) if cap else 25.0
    except ValueError:
        raise SystemExit(f"--config {text!r}: the bucket cap must be a number of MB") from None
    if not name or value <= 0:
        raise SystemExit(f"--config {text!r}: expected ALGORITHM[:CAP_MB] with a positive cap")
    return select.requested(name), value


class Trainer:
    """One copy of the model (same seed on every rank and for every configuration) under ringlet's DDP."""

    def __init__(self, model: str, batch: int, **ddp):
        torch.manual_seed(0)
        net = MODELS[model]()
        self.ddp = DistributedDataParallel(net, sufficient_factors=False, **ddp)
        self.opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        g = torch.Generator().manual_seed(ringlet.rank())
        self.data = torch.randn(batch, 3, 32, 32, generator=g)
        self.target = torch.randint(0, 10, (batch,), generator=g)

    def step(self) -> float:
        """One training step; its wall seconds."""
        t0 = time.perf_counter()
        self.opt.zero_grad()
        F.cross_entropy(self.ddp(self.data), self.target).backward()
        self.opt.step()
        return time.perf_counter() - t0


def run_adapt(args) -> dict:
    if ringlet.collectives.runtime().selector.model is None:
        raise SystemExit("adapt: no cost model is installed; give the calibration profile with RINGLET_PROFILE=PATH "
                         "(made by `ringlet tune --cluster --out PATH`)")
    t = Trainer(args.model, args.batch_size, bucket_cap_mb=args.bucket_cap_mb, adapt=Adapt(every=args.every),
                tune=not args.no_tune)
    rank, steps, seen = ringlet.rank(), [], 0
    for s in range(args.steps):
        seconds = t.step()
        rec = {"step": s, "epoch": time.time(), "seconds": seconds, "cap_bytes": t.ddp.bucket_cap_bytes,
               "choices": t.ddp.choices}
        steps.append(rec)
        new = t.ddp.switches[seen:]
        seen += len(new)
        if rank == 0:
            used = ", ".join(f"{k} {v}" for k, v in rec["choices"].items())
            print(f"step {s:4d}  {rec['epoch']:.3f}  {seconds * 1e3:8.1f} ms  cap {rec['cap_bytes'] >> 10} KiB  {used}",
                  flush=True)
            for a in new:
                print(f"  switch at step {a.step}: {a.switch.op} {a.switch.old} -> {a.switch.new} ({a.switch.reason})",
                      flush=True)
    switches = [{"step": a.step, "op": a.switch.op, "old": a.switch.old, "new": a.switch.new,
                 "reason": a.switch.reason} for a in t.ddp.switches]
    for sw in switches:  # the epoch of the step the switch took effect in
        sw["epoch"] = steps[min(sw["step"], len(steps) - 1)]["epoch"]
    return {"kind": "adapt", "model": args.model, "every": args.every, "steps": steps, "switches": switches,
            "profile": os.environ.get("RINGLET_PROFILE", "")}


def run_fixed(args) -> dict:
    configs = [parse_config(c) for c in args.config] or [("auto", args.bucket_cap_mb)]
    arms = [Trainer(args.model, args.batch_size, algorithm=a, bucket_cap_mb=cap, tune=False, adapt=None)
            for a, cap in configs]
    times: list[list[float]] = [[] for _ in arms]
    for r in range(args.rounds):
        order = [(r + k) % len(arms) for k in range(len(arms))]
        for i in order:
            arms[i].step()  # untimed: the other arms' state left the caches
            times[i] += [arms[i].step() for _ in range(args.block)]
        if ringlet.rank() == 0:
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{a}:{cap:g} {statistics.median(ts) * 1e3:.1f} ms" for (a, cap), ts in zip(configs, times)), flush=True)
    rows = [{"algorithm": a, "cap_mb": cap, "median_s": statistics.median(ts), "times": ts}
            for (a, cap), ts in zip(configs, times)]
    return {"kind": "fixed", "model": args.model, "epoch": time.time(), "configs": rows,
            "profile": os.environ.get("RINGLET_PROFILE", "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=("adapt", "fixed"))
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="the starting cap (adapt) or the default")
    parser.add_argument("--steps", type=int, default=300, help="adapt: training steps")
    parser.add_argument("--every", type=int, default=10, help="adapt: steps between rounds")
    parser.add_argument("--no-tune", action="store_true",
                        help="adapt: no step tuner trial first (the corrector's rounds start at once)")
    parser.add_argument("--config", action="append", default=[], metavar="ALGORITHM[:CAP_MB]",
                        help="fixed: a configuration (repeatable; default auto at --bucket-cap-mb)")
    parser.add_argument("--rounds", type=int, default=4, help="fixed: rounds")
    parser.add_argument("--block", type=int, default=5, help="fixed: timed steps per configuration and round")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--out", default="", help="JSON file (written by rank 0)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ringlet.init()
    if ringlet.rank() == 0:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        result = run_adapt(args) if args.kind == "adapt" else run_fixed(args)
        result.update(ranks=ringlet.size(), argv=sys.argv[1:])
        if ringlet.rank() == 0 and args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        ringlet.shutdown()


if __name__ == "__main__":
    main()
