"""The design notes' table in its shape — baseline → + compression → + overlap → + MoE — for a small
transformer on scikit-learn's digits, every row measured in one job.

    ringlet run --cluster -np 1 -- python benchmarks/moe/moe_table.py --epochs 0 --json np1.json
    ringlet run --cluster -np 4 -- python benchmarks/moe/moe_table.py --one-rank np1.json --json np4.json
    ringlet run -np 4 -- python benchmarks/moe/moe_table.py --small          # a quick check on one host

The model is ``examples/train_moe.py``'s ``Net`` (imported, not copied): each 8x8 image is 8 tokens,
``--layers`` pre-norm blocks of attention and a feed-forward layer, mean over tokens, 10 classes. Rows
(arms), each adding to the one before:

* ``baseline``: the dense model (feed-forward an MLP of width ``--ff``) under ringlet's
  ``DistributedDataParallel`` with its defaults (fp32 buckets, overlapped with backward, step tuner on);
* ``compression``: the same with ``compression="fp16"`` (``--compression``): half the bytes on the wire,
  summed in float32;
* ``overlap``: the same with ``priority=Priority()`` and ``overlap_optimizer``: the front layers' gradients
  first, each module's average and update landing in its next forward (docs/training.md) — the overlap
  ringlet offers on top of the backward overlap every DDP row already has;
* ``moe``: every feed-forward layer replaced by ``ringlet.torch.MoE`` with ``--experts`` experts over all
  ranks (``ep_size`` = the world), top-``--k``, each expert an MLP of width ``--ff / k``: the same
  multiply-adds per token as the dense MLP. Wrapped by ``moe_parallel(net, compression=...)``: the
  compression stays, the priority overlap does not (``moe_parallel`` refuses ``priority=``: the experts'
  wrapper would not be waited for).

Every arm trains its own copy (same seed, same data order, Adam). Throughput: after ``--warmup`` steps
and its step tuner's trials (at most ``--settle`` more), ``--rounds`` rounds of one block per arm, the
order rotating every round; a block is one untimed step and ``--steps`` timed ones (an overlap arm's last
update lands inside the block). samples/s: the median block's samples over all ranks per second; "×
baseline": the arm's block time over the baseline's in the same round, mean ± s.e. Then every arm trains
untimed up to ``--epochs`` epochs of the training set in all and is tested (accuracy on the held-out
fifth; ``--epochs 0``: not tested). Memory per rank: the accounted state (parameters, their gradients
and the optimizer's state, bytes this rank holds) and a measured peak: the largest total of torch's
allocation record while the arm is built and runs its first two steps (``torch.profiler`` with
``profile_memory``, as benchmarks/zero measures; the profiler may miss allocations made on ringlet's
communication thread). Scaling efficiency (with ``--one-rank``, the JSON of this script's 1-rank run): the arm's
samples/s over the world size × its own samples/s in the 1-rank run, and over the world size × the
1-rank baseline's. MoE rows: expert load balance (the busiest expert's routed assignments over the mean,
over every training step and layer: 1.0 is even) and the share of assignments dropped for capacity.
Rank 0 prints a markdown table and, with ``--json``, writes everything as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "..", "examples"))
sys.path.insert(0, os.path.join(_HERE, "..", "zero"))
from digits_data import configuration, digits  # noqa: E402 - examples/, beside train_moe.py
from train_moe import Net, accuracy  # noqa: E402 - the example's model and test, shared
from zero_memory import profiled_peak  # noqa: E402 - benchmarks/zero's allocation-record peak

import ringlet  # noqa: E402
import ringlet.torch  # noqa: E402

ARMS = ("baseline", "compression", "overlap", "moe")
MiB = 1 << 20
SMALL = dict(d=32, ff=64, layers=2, heads=4, warmup=2, settle=10, rounds=2, steps=2, epochs=1)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated, of " + ", ".join(ARMS))
    p.add_argument("--d", type=int, default=256, help="model width")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ff", type=int, default=1024, help="feed-forward width of the dense rows")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=4, help="experts per MoE layer (spread over all ranks)")
    p.add_argument("--k", type=int, default=2, choices=(1, 2))
    p.add_argument("--capacity-factor", type=float, default=1.25)
    p.add_argument("--aux", type=float, default=0.01, help="weight of the load-balancing loss")
    p.add_argument("--compression", default="fp16", help="the compressor of the rows from + compression on")
    p.add_argument("--partition", default="4M", help="Priority(partition_bytes=...) of the overlap row")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=6, help="steps per arm before the rounds")
    p.add_argument("--settle", type=int, default=40, help="at most this many more while a step tuner is on trial")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=4, help="timed steps per block")
    p.add_argument("--epochs", type=float, default=6, help="training per arm in all, for the test (0: no test)")
    p.add_argument("--no-memory", action="store_true", help="skip the profiled peak (the build runs unprofiled)")
    p.add_argument("--one-rank", default=None, help="JSON of this script's 1-rank run: scaling efficiency")
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    p.add_argument("--small", action="store_true", help="tiny sizes for a smoke test: " + str(SMALL))
    if p.parse_args(argv).small:  # the small sizes replace the defaults; flags given still win
        p.set_defaults(**SMALL)
    args = p.parse_args(argv)
    args.arms = args.arms.split(",")
    for arm in args.arms:
        if arm not in ARMS:
            raise SystemExit(f"unknown arm {arm!r}: use {', '.join(ARMS)}")
    if args.ff % args.k:
        raise SystemExit(f"--ff {args.ff} must be divisible by --k {args.k} (equal compute per token)")
    return args


class Arm:
    """One row: its wrapped model, the unwrapped net, the optimizer, its data stream and its counts."""

    def __init__(self, name: str, args, world: int, rank: int, train_set):
        self.name = name
        moe = None
        if name == "moe":
            if args.experts % world:
                raise SystemExit(f"--experts {args.experts} must be divisible by the {world} ranks")
            moe = dict(num_experts=args.experts, ep_size=None, k=args.k, capacity_factor=args.capacity_factor)
        torch.manual_seed(0)
        self.net = Net(args.d, args.heads, args.ff, args.layers, moe)
        compression = None if name == "baseline" else args.compression
        if moe is not None:
            self.model = ringlet.torch.moe_parallel(self.net, compression=compression)
        elif name == "overlap":
            prio = ringlet.torch.Priority(partition_bytes=args.partition)
            self.model = ringlet.torch.DistributedDataParallel(self.net, compression=compression, priority=prio)
        else:
            self.model = ringlet.torch.DistributedDataParallel(self.net, compression=compression)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=args.lr)
        if name == "overlap":
            self.model.overlap_optimizer(self.opt)
        self.sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, seed=0)
        self.loader = DataLoader(train_set, batch_size=args.batch_size, sampler=self.sampler)
        self.batches = self._stream()
        self.layers = self.net.moe_layers()
        self.counts = torch.zeros(3 + (self.layers[0].num_experts if self.layers else 0), dtype=torch.float64)
        self.steps_done = self.samples_done = 0
        self.aux = args.aux

    def _stream(self):
        epoch = 0
        while True:
            self.sampler.set_epoch(epoch)
            yield from self.loader
            epoch += 1

    def step(self) -> int:
        """One training step; returns this rank's samples."""
        x, y = next(self.batches)
        self.opt.zero_grad()
        logits, aux = self.model(x)
        (F.cross_entropy(logits, y) + self.aux * aux).backward()
        self.opt.step()
        for m in self.layers:
            s = m.stats
            self.counts += torch.tensor([s["tokens"], s["tokens"] * m.k, s["dropped"], *s["load"]], dtype=torch.float64)
        self.steps_done += 1
        self.samples_done += len(y)
        return len(y)

    def settled(self) -> bool:
        """Whether the step tuner (ringlet's DDP) has decided; every rank sees it at the same step."""
        choice = getattr(self.model, "_tuner", None)
        return choice is None or choice.decision is not None

    def synchronize(self) -> None:
        self.model.synchronize()  # overlap_optimizer: the last update lands (a no-op otherwise)

    def accounted(self) -> dict:
        """Bytes this rank holds: parameters, their gradients, the optimizer's state."""
        params = list(self.net.parameters())
        state = [t for s in self.opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
        return {"parameters": sum(p.numel() for p in params), "parameter_bytes": nbytes(params),
                "gradient_bytes": nbytes(p.grad for p in params if p.grad is not None),
                "optimizer_bytes": nbytes(state)}


def build_arms(args, world: int, rank: int, train_set) -> tuple[list[Arm], dict]:
    """Every arm, built and warmed up in turn; the first two steps of each with its build are profiled
    (unless ``--no-memory``). Returns the arms and each one's profiled peak in bytes."""
    arms, peaks = [], {}
    for name in args.arms:
        box = []

        def build_and_start(name=name, box=box):
            box.append(Arm(name, args, world, rank, train_set))
            box[0].step()
            box[0].step()
            box[0].synchronize()

        if args.no_memory:
            build_and_start()
        else:
            peaks[name] = profiled_peak(build_and_start)
        arm = box[0]
        for _ in range(max(0, args.warmup - 2)):
            arm.step()
        for _ in range(args.settle):
            if arm.settled():
                break
            arm.step()
        arm.synchronize()
        arms.append(arm)
    return arms, peaks


def run_rounds(args, arms: list[Arm], world: int) -> dict[str, list[tuple[float, int]]]:
    """The timed rounds: per arm, one ``(seconds, samples on all ranks)`` per block."""
    blocks: dict[str, list[tuple[float, int]]] = {a.name: [] for a in arms}
    for r in range(args.rounds):
        k = r % len(arms)
        for arm in arms[k:] + arms[:k]:
            arm.step()  # untimed: caches and the CPU quota settle after the other arm's block
            ringlet.barrier()
            t0 = time.perf_counter()
            samples = sum(arm.step() for _ in range(args.steps))
            arm.synchronize()
            blocks[arm.name].append((time.perf_counter() - t0, samples * world))
    return blocks


def finish_training(args, arms: list[Arm]) -> None:
    """Train every arm, untimed, up to ``--epochs`` epochs of the training set in all (counted in steps
    of this rank's loader), so every arm has taken the same number of steps before its test."""
    per_epoch = len(arms[0].loader)
    target = max(int(round(args.epochs * per_epoch)), max(a.steps_done for a in arms)) if args.epochs else 0
    for arm in arms:
        while arm.steps_done < target:
            arm.step()
        arm.synchronize()


def summarize(args, arms: list[Arm], blocks, peaks: dict, test_set, rank: int, world: int) -> list[dict]:
    """Per arm: throughput, paired ratio, memory, test accuracy and, for MoE, load and drops (every rank
    takes part: the test and the counts are collectives)."""
    base = blocks.get("baseline")
    rows = []
    for arm in arms:
        ringlet.allreduce_(arm.counts)
        acc = accuracy(arm.model, test_set, rank, world) if args.epochs else None
        rates = [n / t for t, n in blocks[arm.name]]
        row = {"arm": arm.name, "ranks": world, "samples_per_s": statistics.median(rates),
               "samples_per_s_blocks": rates, "steps_trained": arm.steps_done, "test_accuracy": acc,
               "memory": {**arm.accounted(), "profiled_peak_bytes": peaks.get(arm.name)},
               "algorithm": getattr(arm.model, "algorithm", None)}
        if base is not None and arm.name != "baseline":
            ratios = [t / tb for (t, _), (tb, _) in zip(blocks[arm.name], base)]
            row["time_vs_baseline"] = ratios
        if arm.layers:
            load = arm.counts[3:]
            row.update(load_balance=(load.max() / load.mean()).item(),
                       dropped_share=(arm.counts[2] / arm.counts[1]).item(), load=load.tolist(),
                       moe={"experts": args.experts, "ep_size": world, "k": args.k,
                            "capacity_factor": args.capacity_factor, "expert_width": args.ff // args.k})
        rows.append(row)
    return rows


def scaling(rows: list[dict], one_rank_path: str | None, world: int) -> None:
    """Add each row's scaling efficiency from the 1-rank run's JSON (same arm; and against its baseline)."""
    if not one_rank_path:
        return
    with open(one_rank_path) as f:
        single = {r["arm"]: r for r in json.load(f)["results"]}
    if any(r["ranks"] != 1 for r in single.values()):
        raise SystemExit(f"{one_rank_path}: not a 1-rank run of this script")
    for row in rows:
        own = single.get(row["arm"])
        if own is not None:
            row["one_rank_samples_per_s"] = own["samples_per_s"]
            row["scaling_efficiency"] = row["samples_per_s"] / (world * own["samples_per_s"])
        if "baseline" in single:
            row["scaling_vs_one_rank_baseline"] = row["samples_per_s"] / (world * single["baseline"]["samples_per_s"])


def _mean_se(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.3f}" if xs else "-"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) / len(xs) ** 0.5:.3f}"


LABELS = {"baseline": "baseline (dense, DDP fp32)", "compression": "+ compression ({c})",
          "overlap": "+ overlap (priority, next-forward)", "moe": "+ MoE ({e} experts, top-{k}, ep {w})"}


def table(args, rows: list[dict], world: int) -> str:
    """The markdown table of ``rows``."""
    out = ["| row | samples/s | time × baseline | params + grads + optimizer per rank (MiB) | profiled peak "
           "per rank (MiB) | parameters per rank | scaling efficiency (own 1-rank) | vs 1-rank baseline | "
           "test accuracy | load balance | dropped |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    pct = lambda v: "-" if v is None else f"{100 * v:.0f}%"  # noqa: E731
    for r in rows:
        m = r["memory"]
        state = (m["parameter_bytes"] + m["gradient_bytes"] + m["optimizer_bytes"]) / MiB
        peak = "-" if m["profiled_peak_bytes"] is None else f"{m['profiled_peak_bytes'] / MiB:.1f}"
        label = LABELS[r["arm"]].format(c=args.compression, e=args.experts, k=args.k, w=world)
        acc = "-" if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
        moe = f"{r['load_balance']:.2f} | {r['dropped_share']:.2%}" if "load_balance" in r else "- | -"
        out.append(f"| {label} | {r['samples_per_s']:.1f} | {_mean_se(r.get('time_vs_baseline', [1.0]))} | "
                   f"{state:.2f} | {peak} | {m['parameters']:,} | {pct(r.get('scaling_efficiency'))} | "
                   f"{pct(r.get('scaling_vs_one_rank_baseline'))} | {acc} | {moe} |")
    return "\n".join(out)


def _commit() -> str | None:
    """The checkout's commit (with " (modified)" when its tracked files differ), or None outside git."""
    root = os.path.join(_HERE, "..", "..")
    git = ["git", "-C", root, "-c", f"safe.directory={os.path.abspath(root)}"]
    try:
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(git + ["diff", "--quiet", "HEAD"], capture_output=True).returncode
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + (" (modified)" if dirty else "")


def main(argv=None) -> None:
    args = parse_args(argv)
    ringlet.init()
    rank, world = ringlet.rank(), ringlet.size()
    torch.set_num_threads(1)  # one core per rank (an emulated host has half of one)
    train_set, test_set = digits()
    arms, peaks = build_arms(args, world, rank, train_set)
    blocks = run_rounds(args, arms, world)
    finish_training(args, arms)
    rows = summarize(args, arms, blocks, peaks, test_set, rank, world)
    if rank == 0:
        scaling(rows, args.one_rank, world)
        print(f"configuration: {configuration()}; {world} rank(s); width {args.d}, {args.layers} blocks, "
              f"feed-forward {args.ff}, batch {args.batch_size} per rank; {args.rounds} rounds of {args.steps} "
              f"timed steps per arm; {rows[0]['steps_trained']} training steps per arm", flush=True)
        print(table(args, rows, world), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _commit(),
                           "argv": sys.argv, "args": vars(args), "world": world, "configuration": configuration(),
                           "results": rows}, f, indent=1)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
