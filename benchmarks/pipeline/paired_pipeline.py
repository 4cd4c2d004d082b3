"""Pipeline stages against data parallelism in one job, in alternating blocks of steps: a paired comparison.

    ringlet run --cluster -np 4 -- python benchmarks/pipeline/paired_pipeline.py --rounds 8
    ringlet run -np 4 -- python benchmarks/pipeline/paired_pipeline.py --small      # a smoke test

Every arm trains its own copy of the same deep MLP (an ``nn.Sequential`` of ``--depth`` Linear+ReLU layers of
``--width``, then a Linear to 10 classes; seed 0) with SGD on the same fixed global batch of ``--batch-size``
rows, on a world of 4 ranks:

* ``torch``: ``torch.nn.parallel.DistributedDataParallel`` on Gloo, 4 replicas, ``batch / 4`` rows each;
* ``ringlet[:NAME=VALUE,...]``: ringlet's ``DistributedDataParallel``, likewise (options as in
  ``benchmarks/training_ddp/paired_ddp.py``; the default arm ``ringlet:sufficient_factors=off`` sends the
  same bytes as torch's);
* ``pipe:SxR[:gpipe|1f1b][:NAME=VALUE,...]``: ``ringlet.torch.Pipeline`` of S stages × R replicas (rank =
  stage × R + replica), each replica ``batch / R`` rows in ``--microbatches`` micro-batches; the options go to
  the replica average's DDP (``sufficient_factors`` off unless given);
* ``torchpipe:SxR[:gpipe|1f1b]``: ``torch.distributed.pipelining`` (``PipelineStage`` with ``Schedule1F1B`` or
  ``ScheduleGPipe``) on the same cut (ringlet's default balance), each stage's module in torch's DDP over its
  replicas when R > 1.

The rounds are those of ``paired_ddp.py`` (its ``_run_rounds``: one block per arm per round, one untimed step
then ``--steps-per-block`` timed ones, the order rotating every round); every arm first runs ``--warmup`` steps
and then, while the step tuner of some ringlet DDP on some rank is still on trial, more (at most
``--settle``), all ranks together. Rank 0 reports per arm its step time (median, and mean ± s.e. of the block
means), the paired ratio to the first arm (mean ± s.e. over rounds), and for ``pipe`` arms per stage, over the
timed steps of every rank of the stage, from ``pipe.stats``:

* ``bubble``: the time blocked on neighbouring stages over the step (``wait_s / step_s``), against
  ``(S-1)/(M+S-1)``;
* the replica all-reduce: ``duration``, the time at least one of the stage's bucket all-reduces ran on the
  communication thread (``allreduce_spans``); each moment of it is **behind own backward** (before this rank's
  last backward computation ended), **behind other stages** (after that, but before the latest end of the last
  backward on any rank of another stage: the pipeline still computes), or **exposed** (after both);
  ``hidden share = 1 - exposed / duration``. The clock is the timeline's (monotonic, one per kernel: the
  emulated hosts share it).

``--out PATH`` writes every number as JSON; each arm's parameters are checked to agree across its replicas.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "training_ddp"))
import paired_ddp  # noqa: E402  the rounds, the data-parallel arms and the tuner check

import ringlet  # noqa: E402
import ringlet.torch  # noqa: E402
from ringlet import timeline  # noqa: E402
from ringlet.torch.training.pipeline import bubble_fraction  # noqa: E402
from ringlet.torch.training.pipeline.split import even_balance, layer_ranges  # noqa: E402

DEFAULT_ARMS = ["torch", "ringlet:sufficient_factors=off", "pipe:2x2", "pipe:4x1", "pipe:4x1:gpipe",
                "torchpipe:2x2", "torchpipe:4x1"]
MODEL = "pipeline_mlp"  # the name under which the model is registered for paired_ddp.build_arm
SMALL = {"depth": 4, "width": 128, "batch_size": 32, "rounds": 2, "steps": 2, "warmup": 2, "settle": 40}


def deep_mlp(depth: int, width: int, classes: int = 10) -> torch.nn.Sequential:
    """``depth`` × (Linear(width, width), ReLU), then Linear(width, classes); seeded by the caller."""
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))


def parse_pipe(spec: str, world: int) -> tuple[str, int, int, str, dict]:
    """``(kind, S, R, schedule, options)`` of ``pipe:SxR[:schedule][:k=v,...]`` or ``torchpipe:...``."""
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    try:
        stages, replicas = (int(v) for v in parts[0].lower().split("x"))
    except (IndexError, ValueError):
        raise SystemExit(f"arm {spec!r}: want {kind}:SxR[:gpipe|1f1b][:NAME=VALUE,...]") from None
    if stages * replicas != world:
        raise SystemExit(f"arm {spec!r}: {stages} x {replicas} ranks, but the world has {world}")
    schedule = "1f1b"
    if len(parts) > 1 and parts[1] in ("gpipe", "1f1b"):
        schedule, parts = parts[1], parts[:1] + parts[2:]
    opts = {k: paired_ddp._value(v) for p in parts[1:] for k, v in (o.split("=", 1) for o in p.split(",") if o)}
    if kind == "torchpipe" and opts:
        raise SystemExit(f"arm {spec!r}: torchpipe takes no options")
    return kind, stages, replicas, schedule, opts


class Batch:
    """The fixed global batch and the slices of it each arm's rank reads."""

    def __init__(self, rows: int, width: int, world: int):
        if rows % world:
            raise SystemExit(f"--batch-size {rows} must be divisible by the world of {world} ranks")
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(rows, width, generator=g), torch.randint(0, 10, (rows,), generator=g)

    def part(self, index: int, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.x.shape[0] // parts
        return self.x[index * n:(index + 1) * n], self.y[index * n:(index + 1) * n]


class PipeArm:
    """A ``pipe`` arm on this rank: :meth:`step` runs one step of its replica's share and records ``pipe.stats``."""

    def __init__(self, spec: str, args, batch: Batch):
        _, stages, replicas, schedule, opts = parse_pipe(spec, dist.get_world_size())
        torch.manual_seed(0)
        self.pipe = ringlet.torch.Pipeline(deep_mlp(args.depth, args.width), stages, args.microbatches, schedule,
                                           **{"sufficient_factors": False, **opts})
        self.opt = torch.optim.SGD(self.pipe.parameters(), lr=0.01)
        x, y = batch.part(self.pipe.replica, replicas)
        self.x = x if self.pipe.is_first else None
        self.y = y if self.pipe.is_last else None
        self.records: list[dict] = []

    def step(self) -> None:
        self.opt.zero_grad()
        self.pipe.step(self.x, self.y, F.cross_entropy)
        self.opt.step()
        s = self.pipe.stats
        self.records.append({"step_s": s.step_s, "compute_s": s.compute_s, "wait_s": s.wait_s,
                             "reduce_s": s.reduce_s, "peak_inflight": s.peak_inflight, "bubble": s.bubble,
                             "end_us": s.compute_end_us, "spans": timeline.union(list(s.allreduce_spans))})

    def settled(self) -> bool:
        return self.pipe.ddp is None or paired_ddp._settled(self.pipe.ddp, self.opt)

    def parameters(self):
        return self.pipe.parameters()


_GROUPS: dict[tuple[int, ...], object] = {}


def _group(ranks: list[int]):
    """A torch process group of ``ranks`` (made once; every rank makes the same ones in the same order)."""
    key = tuple(ranks)
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(ranks))
    return _GROUPS[key]


class TorchPipeArm:
    """A ``torchpipe`` arm: ``torch.distributed.pipelining`` on ringlet's default cut and rank layout."""

    def __init__(self, spec: str, args, batch: Batch):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        _, stages, replicas, schedule, _ = parse_pipe(spec, dist.get_world_size())
        rank = dist.get_rank()
        self.stage, replica = divmod(rank, replicas)
        torch.manual_seed(0)
        model = deep_mlp(args.depth, args.width)
        balance = even_balance([sum(p.numel() for p in m.parameters()) for m in model], stages)
        first, end = layer_ranges(balance)[self.stage]
        self.module = torch.nn.Sequential(*list(model.children())[first:end])
        pipes = [_group([s * replicas + r for s in range(stages)]) for r in range(replicas)]
        reps = [_group([s * replicas + r for r in range(replicas)]) for s in range(stages)]
        wrapped = self.module
        if replicas > 1:
            wrapped = torch.nn.parallel.DistributedDataParallel(self.module, process_group=reps[self.stage])
        stage = PipelineStage(wrapped, self.stage, stages, torch.device("cpu"), group=pipes[replica])
        cls = Schedule1F1B if schedule == "1f1b" else ScheduleGPipe
        self.schedule = cls(stage, args.microbatches, loss_fn=F.cross_entropy)
        self.stages = stages
        self.x, self.y = batch.part(replica, replicas)
        self.opt = torch.optim.SGD(self.module.parameters(), lr=0.01)
        self.records: list[dict] = []

    def step(self) -> None:
        self.opt.zero_grad()
        if self.stage == 0:
            self.schedule.step(self.x)
        elif self.stage == self.stages - 1:
            self.schedule.step(target=self.y, losses=[])
        else:
            self.schedule.step()
        self.opt.step()

    def settled(self) -> bool:
        return True

    def parameters(self):
        return self.module.parameters()


def build_arms(args, batch: Batch) -> list[tuple[str, object, object]]:
    """``(spec, model, optimizer)`` per arm, as ``paired_ddp._run_rounds`` takes them (a pipeline arm is its
    own model; its optimizer slot is None)."""
    arms = []
    rank, world = dist.get_rank(), dist.get_world_size()
    for spec in args.arms:
        kind = spec.partition(":")[0]
        if kind == "pipe":
            arms.append((spec, PipeArm(spec, args, batch), None))
        elif kind == "torchpipe":
            arms.append((spec, TorchPipeArm(spec, args, batch), None))
        elif kind in ("torch", "ringlet"):
            _, model, opt = paired_ddp.build_arm(spec, MODEL)
            model._bench_data = batch.part(rank, world)
            arms.append((spec, model, opt))
        else:
            raise SystemExit(f"unknown arm {spec!r}: torch[:k=v], ringlet[:k=v], pipe:SxR[:schedule][:k=v], "
                             "torchpipe:SxR[:schedule]")
    return arms


def step(model, opt) -> None:
    """One training step of an arm (the ``step`` of ``paired_ddp._run_rounds``)."""
    if opt is None:
        model.step()
        return
    x, y = model._bench_data
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def warm_up(args, arms) -> None:
    """``--warmup`` steps per arm, then more while any rank's step tuner is still on trial (at most
    ``--settle``): every rank takes the same number of steps, since a pipeline's stages tune apart."""
    for spec, model, opt in arms:
        for _ in range(args.warmup):
            step(model, opt)
        for _ in range(args.settle):
            done = model.settled() if opt is None else paired_ddp._settled(model, opt)
            flag = torch.tensor([1 if done else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if flag.item():
                break
            step(model, opt)
        if opt is None:
            model.records.clear()


def timed(records: list, rounds: int, steps: int) -> list:
    """The records of the timed steps: ``_run_rounds`` runs one untimed step, then ``steps``, per block."""
    if len(records) != rounds * (steps + 1):
        raise SystemExit(f"{len(records)} steps recorded, expected {rounds} rounds of 1 + {steps}")
    return [r for i, r in enumerate(records) if i % (steps + 1)]


def fingerprint(arm) -> tuple[int, str]:
    """``(stage, hash of this rank's parameters)``: replicas of a stage must hold the same bits."""
    flat = torch.cat([p.detach().reshape(-1) for p in arm.parameters()])
    stage = getattr(arm, "stage", 0)
    stage = getattr(getattr(arm, "pipe", None), "stage", stage)
    return stage, hashlib.sha1(flat.numpy().tobytes()).hexdigest()[:12]


def check_replicas(arms) -> None:
    """Every arm's replicas of a stage (all ranks for data parallelism) end with the same parameters."""
    mine = [fingerprint(model) for _, model, _ in arms]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    for k, (spec, _, _) in enumerate(arms):
        seen: dict[int, set] = {}
        for ranks_arms in every:
            stage, digest = ranks_arms[k]
            seen.setdefault(stage, set()).add(digest)
        bad = {s: d for s, d in seen.items() if len(d) > 1}
        if bad:
            raise SystemExit(f"arm {spec}: replicas of stage(s) {sorted(bad)} ended with different parameters")


# ---- the report ---------------------------------------------------------------------------------------
_ALL = -1e30


def allreduce_parts(rec: dict, others_end_us: float) -> tuple[float, float, float, float]:
    """``(duration, behind own backward, behind other stages, exposed)`` in seconds of one step's replica
    all-reduce (the module doc); ``others_end_us``: the latest end of the last backward on another stage."""
    spans, end = rec["spans"], rec["end_us"]
    later = max(end, others_end_us)
    duration = timeline.measure(spans)
    own = timeline.measure(timeline.intersect(spans, [(_ALL, end)]))
    other = timeline.measure(timeline.intersect(spans, [(end, later)]))
    return duration * 1e-6, own * 1e-6, other * 1e-6, (duration - own - other) * 1e-6


def stage_rows(gathered: list[dict], stages: int) -> list[dict]:
    """Per stage, over its ranks' timed steps: the means of ``pipe.stats`` and the all-reduce's parts."""
    out = []
    for s in range(stages):
        ranks = [g for g in gathered if g["stage"] == s]
        acc = {k: [] for k in ("step_s", "compute_s", "wait_s", "reduce_s", "bubble")}
        parts = [0.0, 0.0, 0.0, 0.0]
        peak, steps = 0, 0
        for g in ranks:
            for k, rec in enumerate(g["records"]):
                others = [h["records"][k]["end_us"] for h in gathered if h["stage"] != s]
                for name in acc:
                    acc[name].append(rec[name])
                parts = [a + b for a, b in zip(parts, allreduce_parts(rec, max(others, default=_ALL)))]
                peak, steps = max(peak, rec["peak_inflight"]), steps + 1
        row = {"stage": s, "parameters": ranks[0]["parameters"], "peak_inflight": peak}
        row.update({f"{k[:-2]}_ms" if k.endswith("_s") else k: statistics.mean(v) * (1e3 if k.endswith("_s") else 1)
                    for k, v in acc.items()})
        duration, own, other, exposed = (x / max(steps, 1) for x in parts)
        row.update({"allreduce_ms": duration * 1e3, "exposed_ms": exposed * 1e3,
                    "hidden_share": 1 - exposed / duration if duration else None,
                    "behind_own_share": own / duration if duration else None,
                    "behind_other_stages_share": other / duration if duration else None})
        out.append(row)
    return out


def gather_pipes(args, arms) -> dict[str, list[dict]]:
    """Every rank's timed ``pipe.stats`` records of every ``pipe`` arm, on every rank."""
    out = {}
    for spec, model, _ in arms:
        if not isinstance(model, PipeArm):
            continue
        mine = {"stage": model.pipe.stage, "parameters": sum(p.numel() for p in model.parameters()),
                "records": timed(model.records, args.rounds, args.steps)}
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        out[spec] = every
    return out


def _fmt_share(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def report(args, arms, stats, pipes: dict, params: int) -> dict:
    """Print the per-arm lines (rank 0) and return every number for ``--out``."""
    base = args.arms[0]
    print(f"deep MLP {args.depth} x {args.width} ({params / 1e6:.1f} M parameters), global batch {args.batch_size}, "
          f"{args.microbatches} micro-batches, {dist.get_world_size()} ranks, {args.rounds} rounds of {args.steps} "
          f"timed steps per arm (rank 0's times)")
    result = {"argv": sys.argv[1:], "parameters": params, "arms": []}
    for spec, model, _ in arms:
        times = stats.times[spec]
        means = [t * 1e3 for t in times]
        se = statistics.stdev(means) / len(means) ** 0.5 if len(means) > 1 else float("nan")
        entry = {"arm": spec, "block_ms": means, "step_ms_median": statistics.median(means),
                 "step_ms_mean": statistics.mean(means), "step_ms_se": se}
        line = f"{spec}: step {entry['step_ms_median']:.1f} ms median, {entry['step_ms_mean']:.1f} +- {se:.1f} ms mean"
        if spec != base:
            ratios = [a / b for a, b in zip(times, stats.times[base])]
            rse = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
            entry.update(ratio_mean=statistics.mean(ratios), ratio_se=rse, ratio_median=statistics.median(ratios),
                         ratios=ratios)
            line += (f"; vs {base}: {statistics.mean(ratios):.3f} +- {rse:.3f} (s.e.), median "
                     f"{statistics.median(ratios):.3f}; per round " + " ".join(f"{x:.3f}" for x in ratios))
        print(line, flush=True)
        if spec in pipes:
            entry["stages"] = _print_stages(spec, pipes[spec], args)
        busy = {k: v / (args.rounds * args.steps) for k, v in stats.thread_ms[spec].items() if v}
        print("    CPU per step by thread: " + ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(busy.items())),
              flush=True)
        result["arms"].append(entry)
    return result


def _print_stages(spec: str, gathered: list[dict], args) -> list[dict]:
    _, stages, replicas, schedule, _ = parse_pipe(spec, len(gathered))
    theory = bubble_fraction(stages, args.microbatches)
    print(f"    {stages} stages x {replicas} replicas, {schedule}: bubble (S-1)/(M+S-1) = {theory:.3f}")
    rows = stage_rows(gathered, stages)
    for r in rows:
        r["bubble_theory"] = theory
        line = (f"    stage {r['stage']}: step {r['step_ms']:.1f} ms = compute {r['compute_ms']:.1f} + wait "
                f"{r['wait_ms']:.1f} + replica average {r['reduce_ms']:.1f}; bubble {r['bubble']:.3f}; held "
                f"{r['peak_inflight']} micro-batches; {r['parameters']} parameters")
        if r["hidden_share"] is not None:
            line += (f"; all-reduce {r['allreduce_ms']:.1f} ms, hidden {_fmt_share(r['hidden_share'])} (behind own "
                     f"backward {_fmt_share(r['behind_own_share'])}, behind other stages "
                     f"{_fmt_share(r['behind_other_stages_share'])}), exposed {r['exposed_ms']:.1f} ms")
        print(line, flush=True)
    return rows


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("arms", nargs="*", default=DEFAULT_ARMS, help=f"default: {' '.join(DEFAULT_ARMS)}")
    p.add_argument("--depth", type=int, default=8, help="hidden Linear+ReLU layers")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=128, help="the global batch (every arm)")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps-per-block", dest="steps", type=int, default=4, help="timed steps per block")
    p.add_argument("--warmup", type=int, default=5, help="steps per arm before the first round")
    p.add_argument("--settle", type=int, default=150, help="at most this many more while a step tuner is on trial")
    p.add_argument("--small", action="store_true", help="a smoke test: " + ", ".join(f"{k} {v}" for k, v in SMALL.items()))
    p.add_argument("--out", "--json", dest="out", default="", help="write every number here as JSON (rank 0)")
    args = p.parse_args()
    if args.small:
        for k, v in SMALL.items():
            setattr(args, k, v)
    args.trace_arm = ""  # paired_ddp._run_rounds: no timeline
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env:// from ringlet run; ringlet then reuses this group
    ringlet.init()
    paired_ddp.MODELS[MODEL] = lambda: deep_mlp(args.depth, args.width)
    batch = Batch(args.batch_size, args.width, dist.get_world_size())
    arms = build_arms(args, batch)
    warm_up(args, arms)
    stats = paired_ddp._run_rounds(args, arms, step)
    check_replicas(arms)
    pipes = gather_pipes(args, arms)
    if dist.get_rank() == 0:
        result = report(args, arms, stats, pipes, sum(p.numel() for p in deep_mlp(args.depth, args.width).parameters()))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    ringlet.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
