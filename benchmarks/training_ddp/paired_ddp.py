"""Torch's DDP and ringlet's DDP in one job, in alternating blocks of steps: a paired A/B.

    ringlet run --cluster -np 4 -- python benchmarks/training_ddp/paired_ddp.py --rounds 12 torch ringlet
    ringlet run --cluster -np 4 -- python benchmarks/training_ddp/paired_ddp.py torch ringlet ringlet:bucket_cap_mb=1

Separate jobs for each arm (``training_ab.sh``) see different machine load: on this shared machine one
job in six ran 20-30% slower than its neighbours, for either arm, which buries a few-percent difference.
Here every arm trains its own copy of the same model (same seed, same data, same optimizer) inside one
job on one torch.distributed world: torch's DDP all-reduces over the default Gloo group, ringlet's DDP
sends over the same group's point-to-point. Each round runs one block per arm (``--steps`` timed steps
after one untimed step that lets caches and the quota settle), in an order that rotates every round, so
a slow stretch of the machine hits the arms alike. A round's ratio is the arm's step time over the first
arm's in the same round; the report gives the mean ratio with its standard error, and the median.

Arms: ``torch`` (``torch.nn.parallel.DistributedDataParallel``), ``ringlet`` (``ringlet.torch``'s),
``ringlet:NAME=VALUE,...`` (keyword arguments for ringlet's DDP: numbers, true/false or strings),
``torch:NAME=VALUE,...`` likewise for torch's (a NAME starting with ``_`` sets that attribute of the
wrapper after construction: private A/B knobs such as ``ringlet:_factor_gather=direct``); ``ringlet-copy`` is ringlet's DDP copying the averages
into ``.grad`` instead of lending them (its behaviour before 2026-11-23); ``local`` trains the model on each
rank without any communication (the compute floor: its CPU per thread is what the DDP arms add to);
``torch:hook=NAME`` registers a comm hook on torch's DDP: torch's ``fp16``, ``bf16`` or ``powersgd``
(``rank=R``, default 2; torch's PowerSGD hook runs on Gloo only with one bucket, so give it
``bucket_cap_mb=100``), or ``ringlet.FUNCTION`` for a hook of ``ringlet.torch.hooks`` with a fresh
``HookState`` (``state.NAME=VALUE`` options set on it).
``localsgd[:period=K,warmup_steps=W,NAME=VALUE,...]`` is post-local SGD
(``ringlet.torch.training.LocalSGD``, default ``K`` 4) over ringlet's DDP (the other options are the DDP's).
``diloco[:period=H,outer_lr=..,outer_momentum=..,compression=..]`` is
``ringlet.torch.training.DiLoCo`` on the plain model (defaults H 8, outer lr 0.7, momentum 0.5).
``ringlet:priority[:partition=SIZE,overlap=false,NAME=VALUE,...]`` is ringlet's DDP with
``priority=ringlet.torch.Priority(partition_bytes=SIZE)`` (default 4M) and, unless ``overlap=false``, the
optimizer passed to ``overlap_optimizer`` (the averages overlap the next forward).
``hvd[:NAME=VALUE,...]`` is the Horovod-style path: ``ringlet.torch.DistributedOptimizer`` around the same
SGD (keyword arguments for it), with ``hvd.init()`` done once for the job — its coordinator is then also
what ringlet's DDP arms go through.

``zero[:stage=S,NAME=VALUE,...]`` is ``ringlet.torch.ZeroOptimizer`` on the plain model (stage 1-3; the
other options go to ``ZeroOptions``); ``torchzero`` is torch's DDP with ``ZeroRedundancyOptimizer``;
``fsdp`` is torch's ``fully_shard`` on every child module and the root. ``--optimizer adam`` gives every
arm Adam instead of SGD (optimizer state for the sharding arms to shard).

``--timeline '/tmp/t_{rank}.json'`` writes one ringlet timeline per rank that holds the timed blocks of
one arm only (``--trace-arm``, default the first ringlet arm; the other arms run with the timeline
paused), so ``ringlet report`` gives that arm's hidden communication in the same run as its step-time
ratio. The warm-up steps are not in it: each arm warms up for ``--warmup`` steps and then until its step
tuner has decided (at most ``--settle`` more), so the trials of slower candidates are not timed. Rank 0
then also prints the traced arm's share of communication that overlapped a forward
(:func:`ringlet.torch.training.forward_overlap.forward_overlap`).

``--model``: ``cnn`` (2.5 M parameters, 8 layers), ``mlp`` (25 M, 4 layers), ``transformer`` (a small
vision transformer, 3.2 M parameters in attention and MLP blocks, where sufficient factors do not pay) or
``deep`` (a 24-layer MLP, 3072 -> 23 x 512 -> 10, 7.3 M parameters: many small layers, where the next
forward can start on the first layers while the last ones' gradients are on the wire).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import synthetic_benchmark  # the models of the synthetic benchmark

import ringlet
import ringlet.torch
from ringlet import timeline


# Private knobs of ringlet's DDP that live on its reduction context (ringlet.torch.training.reduction).
_RINGLET_KNOBS = {"_lend_gradients": "lend_gradients", "_factor_gather": "gather_algorithm"}


def _value(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text  # a string option, e.g. sufficient_factors=auto


def deep_mlp(layers: int = 24, width: int = 512) -> torch.nn.Module:
    """3x32x32 -> 10 classes through ``layers`` fully connected layers (``width`` wide, ReLU between)."""
    dims = [3 * 32 * 32] + [width] * (layers - 1) + [10]
    mods: list[torch.nn.Module] = [torch.nn.Flatten()]
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        mods.append(torch.nn.Linear(a, b))
        if i < layers - 1:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


MODELS = {**synthetic_benchmark.MODELS, "deep": deep_mlp}


def parse_arm(spec: str) -> tuple[str, dict]:
    kind, _, opts = spec.partition(":")
    if kind == "ringlet" and (opts == "priority" or opts.startswith(("priority:", "priority,"))):
        return kind, _priority_options(opts[len("priority") + 1:])
    if kind not in ("torch", "ringlet", "ringlet-copy", "local", "hvd", "localsgd", "diloco", "zero", "torchzero",
                    "fsdp"):
        raise SystemExit(f"unknown arm {spec!r}: torch[:k=v,...], ringlet[:k=v,...], ringlet-copy[:k=v,...], "
                         "hvd[:k=v,...] or local")
    return kind, {k: _value(v) for k, v in (o.split("=", 1) for o in opts.split(",") if o)}


def _priority_options(text: str) -> dict:
    """The DDP options of a ``ringlet:priority[:...]`` arm: ``priority`` (a Priority), ``overlap`` and the rest."""
    opts = {k: _value(v) for k, v in (o.split("=", 1) for o in text.split(",") if o)}
    partition = opts.pop("partition", None)
    overlap = opts.pop("overlap", True)
    prio = ringlet.torch.Priority() if partition is None else ringlet.torch.Priority(partition_bytes=str(partition))
    return {**opts, "priority": prio, "overlap": bool(overlap)}


class _LocalStepper:
    """The optimizer of a ``localsgd`` or ``diloco`` arm: ``step()`` is the wrapper's (the optimizer's
    step, then the periodic synchronisation); ``finish()`` synchronises once more so that the ranks'
    parameters can be compared."""

    def __init__(self, opt, local, finish=None):
        self.opt, self.local = opt, local
        self._finish = finish if finish is not None else local.average

    def zero_grad(self) -> None:
        self.opt.zero_grad()

    def step(self) -> None:
        self.local.step()

    def finish(self) -> None:
        self._finish()


def _torch_hook(opts: dict):
    """``(state, hook)`` for a ``torch:hook=NAME`` arm (popping its options from ``opts``), or None."""
    name = opts.pop("hook", None)
    rank = int(opts.pop("rank", 2))
    state_opts = {k[len("state."):]: opts.pop(k) for k in [k for k in opts if k.startswith("state.")]}
    if name is None:
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "fp16":
        return None, default_hooks.fp16_compress_hook
    if name == "bf16":
        return None, default_hooks.bf16_compress_hook
    if name == "powersgd":
        # Torch's default start_powerSGD_iter (1000) would all-reduce densely through the whole run.
        return powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                           start_powerSGD_iter=2), powerSGD_hook.powerSGD_hook
    if name.startswith("ringlet."):
        import ringlet.torch.hooks as hooks

        state = hooks.HookState()
        for k, v in state_opts.items():
            setattr(state, k, v)
        return state, getattr(hooks, name[len("ringlet."):])
    raise SystemExit(f"unknown hook {name!r}: fp16, bf16, powersgd or ringlet.FUNCTION")


def _print_forward_overlap(path: str, arm: str) -> None:
    from ringlet.torch.training.forward_overlap import forward_overlap

    f = forward_overlap(path, rank=0, skip=1)
    print(f"{arm} (timeline, rank 0, {f.steps} steps): communication {f.per_step(f.comm_us):.1f} ms/step, "
          f"{100 * f.share_forward:.1f}% of it overlapped a forward, {100 * f.share_backward:.1f}% a backward, "
          f"exposed {f.per_step(f.exposed_us):.1f} ms/step; forwards waited {f.per_step(f.wait_us):.1f} ms/step",
          flush=True)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("arms", nargs="+")
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                        help="every arm's optimizer: SGD (lr 0.01) or Adam (lr 1e-3)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per block")
    parser.add_argument("--warmup", type=int, default=15, help="steps per arm before the first round")
    parser.add_argument("--settle", type=int, default=200,
                        help="at most this many more warm-up steps per arm while its step tuner is on trial")
    parser.add_argument("--timeline", default="", help="per-rank timeline path with {rank}: the traced arm's blocks")
    parser.add_argument("--trace-arm", default="", help="the arm whose blocks the timeline holds "
                                                         "(default: the first ringlet arm)")
    args = parser.parse_args()
    if args.timeline and "{rank}" not in args.timeline:
        raise SystemExit("--timeline needs {rank} in the path (one file per rank)")
    args.trace_arm = args.trace_arm or next((a for a in args.arms if a.startswith("ringlet")), "")
    if args.timeline and args.trace_arm not in args.arms:
        raise SystemExit(f"--trace-arm {args.trace_arm!r} is not one of the arms")
    return args


OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.01}), "adam": (torch.optim.Adam, {"lr": 1e-3})}


def _sharded_arm(kind: str, model, opts: dict, opt_name: str):
    """``(wrapped, optimizer)`` of a ``zero[:stage=S,NAME=VALUE...]`` arm (``ringlet.torch.ZeroOptimizer``;
    the other options go to ``ZeroOptions``), ``torchzero`` (torch's DDP with ``ZeroRedundancyOptimizer``)
    or ``fsdp`` (torch's ``fully_shard`` on every child module and the root)."""
    cls, hyper = OPTIMIZERS[opt_name]
    if kind == "zero":
        from ringlet.torch.training.zero import ZeroOptions

        stage = int(opts.pop("stage", 1))
        return model, ringlet.torch.ZeroOptimizer(cls, model, stage=stage, options=ZeroOptions(**opts), **hyper)
    if kind == "torchzero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        wrapped = torch.nn.parallel.DistributedDataParallel(model, **opts)
        return wrapped, ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=cls, **hyper)
    from torch.distributed.fsdp import fully_shard

    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child)
    fully_shard(model)
    return model, cls(model.parameters(), **hyper)


def _hvd_optimizer(optimizer, model, opts: dict):
    """``DistributedOptimizer`` with ``opts``; ``gradients=named|fused`` picks how its gradients travel
    (``RINGLET_HVD_GRADIENTS`` while it is built; only one live optimizer of a job can be fused)."""
    gradients = opts.pop("gradients", None)
    with mock.patch.dict(os.environ, {} if gradients is None else {"RINGLET_HVD_GRADIENTS": gradients}):
        return ringlet.torch.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **opts)


class _Done:
    def wait(self) -> None:
        return None


def _drop_header(optimizer) -> None:
    """Ablation ``hvd:_no_header=1``: the fused path without its per-step header all-reduce (a rank in
    ``hvd.join()`` could then not follow the others; for measuring the header's cost only)."""
    fused = optimizer._ordered

    def start_step() -> None:
        fused._header = (_Done(), None)

    fused._start_step = start_step


def build_arm(spec: str, model_name: str, opt_name: str = "sgd"):
    """``(spec, wrapped model, optimizer)`` of one arm, its model seeded like every other arm's."""
    kind, opts = parse_arm(spec)
    torch.manual_seed(0)
    model = MODELS[model_name]()
    private = {k: v for k, v in opts.items() if k.startswith("_")}  # knobs set after construction
    opts = {k: v for k, v in opts.items() if not k.startswith("_")}
    cls, hyper = OPTIMIZERS[opt_name]
    optimizer = cls(model.parameters(), **hyper)
    if kind in ("zero", "torchzero", "fsdp"):
        wrapped, optimizer = _sharded_arm(kind, model, opts, opt_name)
    elif kind in ("local", "hvd"):  # local: no communication at all, the compute floor of a step
        wrapped = model
        if kind == "hvd":
            optimizer = _hvd_optimizer(optimizer, model, opts)
            if private.pop("_no_header", False):
                _drop_header(optimizer)
            if private.pop("_copy_grads", False):  # ablation: reduced gradients copied into .grad
                optimizer._ordered._take = lambda grad, result: grad.copy_(result) if grad.data_ptr() != \
                    result.data_ptr() else None
    elif kind == "torch":
        hook = _torch_hook(opts)
        wrapped = torch.nn.parallel.DistributedDataParallel(model, **opts)
        if hook is not None:
            wrapped.register_comm_hook(*hook)
    elif kind == "diloco":  # DiLoCo on the plain model: period, outer_lr, outer_momentum, compression
        from ringlet.torch.training import DiLoCo

        wrapped = model
        outer = DiLoCo(model, optimizer, **{"period": 8, "outer_lr": 0.7, "outer_momentum": 0.5, **opts})
        optimizer = _LocalStepper(optimizer, outer, outer.outer_step)
    elif kind == "localsgd":  # post-local SGD over ringlet's DDP: period, warmup_steps; the rest to the DDP
        from ringlet.torch.training import LocalSGD

        period, warmup = int(opts.pop("period", 4)), int(opts.pop("warmup_steps", 0))
        wrapped = ringlet.torch.DistributedDataParallel(model, **opts)
        optimizer = _LocalStepper(optimizer, LocalSGD(wrapped, optimizer, period=period, warmup_steps=warmup))
    else:
        overlap = opts.pop("overlap", False)
        wrapped = ringlet.torch.DistributedDataParallel(model, **opts)
        if overlap:
            wrapped.overlap_optimizer(optimizer)
    if kind == "ringlet-copy":  # averages copied into .grad instead of lent (before 2026-11-23)
        private["_lend_gradients"] = False
    for k, v in private.items():
        owner, attr = (wrapped._ctx, _RINGLET_KNOBS[k]) if k in _RINGLET_KNOBS else (wrapped, k)
        if not hasattr(owner, attr):
            raise SystemExit(f"arm {spec!r}: no attribute {k}")
        setattr(owner, attr, v)
    return spec, wrapped, optimizer


class _Stats:
    """Per arm: block step times and CPU per step (this process, all threads), page faults, CPU per thread."""

    def __init__(self, arms):
        self.times: dict[str, list[float]] = {spec: [] for spec, _, _ in arms}
        self.cpu: dict[str, list[float]] = {spec: [] for spec, _, _ in arms}
        self.faults: dict[str, int] = {spec: 0 for spec, _, _ in arms}
        self.thread_ms: dict[str, dict[str, float]] = {spec: {} for spec, _, _ in arms}


def _run_rounds(args, arms, step) -> _Stats:
    """The rounds: one block per arm each, in an order rotating every round."""
    stats = _Stats(arms)
    for r in range(args.rounds):
        k = r % len(arms)
        for spec, model, opt in arms[k:] + arms[:k]:
            traced = spec == args.trace_arm
            with contextlib.nullcontext() if traced else timeline.paused():
                step(model, opt)
                th0, f0 = synthetic_benchmark._thread_cpu(), synthetic_benchmark._minor_faults()
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.steps):
                    step(model, opt)
                stats.times[spec].append((time.perf_counter() - t0) / args.steps)
                if hasattr(model, "synchronize"):
                    # overlap_optimizer: the last step's averages land here, untimed, not in the next arm's
                    # block (each timed step paid the tail of the step before it, as in training)
                    model.synchronize()
            if traced:
                timeline.mark_step()  # the block's last step ends here, not at the next traced block
            stats.cpu[spec].append((time.process_time() - c0) / args.steps)
            stats.faults[spec] += synthetic_benchmark._minor_faults() - f0
            for tid, (name, user, system, _, _) in synthetic_benchmark._thread_cpu().items():
                _, user0, system0, _, _ = th0.get(tid, (name, 0.0, 0.0, 0, 0))
                key = f"{name}[{tid}]"
                stats.thread_ms[spec][key] = stats.thread_ms[spec].get(key, 0.0) + user + system - user0 - system0
    return stats


def _check_agreement(arms, rank: int) -> None:
    """Parameters of every arm must agree across ranks: the arms really trained data-parallel."""
    for spec, model, opt in arms:
        if spec == "local":
            continue
        if isinstance(opt, _LocalStepper):
            opt.finish()
        if hasattr(model, "synchronize"):
            model.synchronize()  # overlap_optimizer: the last update lands
        gathered = opt.gathered() if getattr(opt, "stage", 0) == 3 else contextlib.nullcontext()
        with gathered:  # ZeRO stage 3 holds shards: every rank gathers together
            flat = torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1).clone()
                              for p in model.parameters()])  # fsdp: DTensors, gathered by every rank
        ref = flat.clone()
        dist.broadcast(ref, 0)
        if not torch.equal(flat, ref):
            raise SystemExit(f"rank {rank}: arm {spec}: parameters differ from rank 0's")


def _settled(model, opt) -> bool:
    """Whether the arm's step tuner (ringlet's DDP) or factor trial (the Horovod-style path) has decided;
    every rank sees the decision at the same step."""
    choice = getattr(model, "_tuner", None)
    if choice is not None and choice.decision is None:
        return False
    factors = getattr(getattr(opt, "_ordered", None), "factors", None)
    return factors is None or factors.tuner is None or factors.decision is not None


def _ringlet_details(model, size: int) -> str:
    line = f", all-reduce algorithm {model.algorithm}, buckets replaced {model.fresh_buffers}"
    if getattr(model, "_tuner", None) is not None and model._tuner.decision is not None:
        d = model._tuner.decision
        per_rank = {k: round(v / size * 1e3, 1) for k, v in d.times.items()}
        line += (f", tuned choice {d.choice} (median step ms per candidate {per_rank}, "
                 f"{model._tuner.trials_done} trials each)")
    line += f", weights from factors {model.factored} (dense fallbacks {model.factor_fallbacks})"
    layout = getattr(model._launch, "layout", None)
    if layout is not None:
        line += f", {len(layout.pieces)} pieces"
    return line + f", buckets {model.bucket_layout}"


def _hvd_details(opt, size: int) -> str:
    """The sufficient factors of a Horovod-style arm: the weights factored, the trial's outcome."""
    ordered = getattr(opt, "_ordered", None)
    f = getattr(ordered, "factors", None)
    if f is None:
        return ", sufficient factors off"
    line = (f", weights from factors {sorted(x.name for x in f.chosen.values())} "
            f"(dense fallbacks {ordered.ctx.fallbacks})")
    if f.decision is not None:
        per_rank = {k: round(v / size * 1e3, 1) for k, v in f.decision.times.items()}
        line += f", trial chose {f.decision.choice} (median step ms per candidate {per_rank})"
    elif f.tuner is not None:
        line += ", trial still running"
    return line


def _print_report(args, arms, stats: _Stats, size: int) -> None:
    base = args.arms[0]
    print(f"model {args.model}, batch {args.batch_size} per rank, {size} ranks, {args.rounds} rounds of "
          f"{args.steps} timed steps per arm")
    for spec, model, opt in arms:
        times, cpu = stats.times[spec], stats.cpu[spec]
        line = (f"{spec}: step {statistics.median(times) * 1e3:.1f} ms median (CPU {statistics.median(cpu) * 1e3:.1f} "
                f"ms, {stats.faults[spec] / (args.rounds * args.steps):.0f} page faults), "
                f"{args.batch_size / statistics.median(times):.1f} img/s per rank")
        if hasattr(model, "algorithm"):
            line += _ringlet_details(model, size)
        if parse_arm(spec)[0] == "hvd":
            line += _hvd_details(opt, size)
        if spec != base:
            ratios = [a / b for a, b in zip(times, stats.times[base])]
            se = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
            line += (f"; step time vs {base}: mean {statistics.mean(ratios):.3f} +- {se:.3f} (s.e.), "
                     f"median {statistics.median(ratios):.3f}; per round " + " ".join(f"{x:.3f}" for x in ratios))
        print(line, flush=True)
        busy = {k: v / (args.rounds * args.steps) for k, v in stats.thread_ms[spec].items() if v}
        print("    CPU per step by thread: " + ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(busy.items())),
              flush=True)


def main() -> None:
    args = _parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env:// from ringlet run; ringlet then reuses this group
    ringlet.init()
    if any(parse_arm(spec)[0] == "hvd" for spec in args.arms):
        ringlet.torch.init()
    rank, size = dist.get_rank(), dist.get_world_size()
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))
    arms = [build_arm(spec, args.model, args.optimizer) for spec in args.arms]

    def step(model, opt) -> None:
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    for _, model, opt in arms:
        for _ in range(args.warmup):
            step(model, opt)
        for _ in range(args.settle):  # the step tuner's trials end in the warm-up, not in the timed blocks
            if _settled(model, opt):
                break
            step(model, opt)
        if hasattr(model, "synchronize"):
            model.synchronize()  # overlap_optimizer: nothing of this arm in flight when the next starts
    if args.timeline:
        timeline.start_timeline(args.timeline)
    stats = _run_rounds(args, arms, step)
    _check_agreement(arms, rank)
    if rank == 0:
        _print_report(args, arms, stats, size)
    timeline.stop_timeline()
    if args.timeline and rank == 0:
        _print_forward_overlap(args.timeline.format(rank=rank), args.trace_arm)
    ringlet.torch.shutdown()
    ringlet.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
