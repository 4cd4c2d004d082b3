"""One rank of the ZeroOptimizer job:

    ringlet run -np N --transport T -- python tests/workers/zero_worker.py OUT.json

The models, data and loops are those of tests/workers/zero_cases.py. Cases, in order:

* ``equivalence``: stages 1 and 2 × Adam and SGD with momentum × one or two backwards per step: after four
  steps the parameters equal a plain model trained in this process on the concatenated batch (1e-6), and
  every rank holds bitwise the same parameters; stage 1 and stage 2 agree bitwise without accumulation;
* ``ddp``: the same runs against ringlet's ``DistributedDataParallel`` with the inner optimizer (1e-6);
* ``variants``: an LR scheduler, a parameter that never gets a gradient, a non-elementwise optimizer on
  whole parameters (the default for classes outside the allowlist), one bucket, one bucket per parameter
  with one reduce-scatter in flight, clipping by the whole model's gradient norm;
* ``bf16``: a bfloat16 model (gradients reduced in bfloat16 and in float32): float32 masters, parameters
  equal to their rounded masters, close to the plain run, bitwise equal across ranks;
* ``scaler``: ringlet's GradScaler with an inf in one element of one rank's gradient: every rank skips the
  step and halves its scale, though only the owner of that element saw the inf;
* ``checkpoint``: ``shard_state`` then ``load_shard_state`` into fresh objects continues bitwise as the
  uninterrupted run; the rank's own ``state_dict`` likewise;
* ``stage3``: stage 3 × Adam and SGD with momentum × one or two backwards per step against the plain run (1e-6).
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from case_harness import check, identical_across_ranks, worker_main

from zero_cases import (OPTIMIZERS, Config, batch, flat_params, make_model, max_diff,
                        scaler_run, train_plain, train_zero)

from ringlet.torch.training import DistributedDataParallel

TOL = 1e-6


def compare(rank, world, cfg: Config, numbers, ref=None):
    net, zero = train_zero(rank, cfg)
    got = flat_params(net)
    ref = flat_params(train_plain(world, cfg)) if ref is None else ref
    d = max_diff(got, ref)
    numbers[cfg.label()] = d
    check(d <= TOL, f"{cfg.label()}: differs from the reference by {d}")
    check(identical_across_ranks([got]), f"{cfg.label()}: ranks disagree")
    return got


def case_equivalence(rank, world):
    def run(numbers):
        for opt in ("adam", "sgd"):
            for micro in (1, 2):
                one = compare(rank, world, Config(stage=1, opt=opt, micro=micro), numbers)
                two = compare(rank, world, Config(stage=2, opt=opt, micro=micro), numbers)
                if micro == 1:
                    check(torch.equal(one, two), f"{opt}: stages 1 and 2 differ")
    return run


def ddp_run(rank, opt: str, steps: int = 4) -> torch.Tensor:
    net = make_model()
    ddp = DistributedDataParallel(net, tune=False, bucket_cap_mb=0.001)
    cls, kw = OPTIMIZERS[opt]
    o = cls(net.parameters(), **kw)
    for s in range(steps):
        x, y = batch(rank, s)
        o.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        o.step()
    return flat_params(net)


def case_ddp(rank, world):
    def run(numbers):
        for opt in ("adam", "sgd"):
            ref = ddp_run(rank, opt)
            for stage in (1, 2):
                cfg = Config(stage=stage, opt=opt)
                got = compare(rank, world, cfg, {}, ref=ref)
                numbers[f"ddp.{cfg.label()}"] = max_diff(got, ref)
    return run


def case_variants(rank, world):
    def run(numbers):
        for cfg in (Config(scheduler=True, steps=5), Config(stage=2, scheduler=True, opt="sgd", steps=5),
                    Config(unused=True), Config(stage=2, unused=True, opt="adamw"), Config(opt="norm"),
                    Config(stage=2, opt="norm", micro=2), Config(bucket_bytes=1 << 20),
                    Config(stage=2, bucket_bytes=1, options={"max_inflight": 1}), Config(clip=0.5),
                    Config(stage=2, micro=2, clip=0.3, opt="sgd")):
            compare(rank, world, cfg, numbers)
    return run


def case_bf16(rank, world):
    def run(numbers):
        for stage in (1, 2):
            for rd in (None, torch.float32):
                cfg = Config(stage=stage, dtype=torch.bfloat16, options={"reduce_dtype": rd})
                net, zero = train_zero(rank, cfg)
                for b, m in enumerate(zero._shards.masters):
                    check(m.dtype == torch.float32 and torch.equal(zero._block(b), m.to(torch.bfloat16)),
                          f"{cfg.label()}: parameters are not their rounded masters")
                got = flat_params(net)
                d = max_diff(got, flat_params(train_plain(world, cfg)))
                numbers[cfg.label()] = d
                check(d <= 0.05, f"{cfg.label()}: {d} from the plain bfloat16 run")
                check(identical_across_ranks([got]), f"{cfg.label()}: ranks disagree")
    return run


def case_scaler(rank, world):
    def run(numbers):
        for stage in (1, 2):
            net, out = scaler_run(rank, stage, poisoned_by=world - 1)
            skipped, scale = [o[0] for o in out], out[-1][1]
            check(skipped == [False, False, True, False], f"stage {stage}: skipped {skipped}")
            check(scale == 512.0, f"stage {stage}: scale {scale}")
            check(identical_across_ranks([flat_params(net)]), f"stage {stage}: ranks disagree")
    return run


def resume(rank, stage, load):
    cfg = Config(stage=stage, steps=3)
    net, zero = train_zero(rank, cfg)
    saved = load(zero, None)
    for s in range(3, 5):
        x, y = batch(rank, s)
        F.mse_loss(net(x), y).backward()
        zero.step()
        zero.zero_grad()
    net2, zero2 = train_zero(rank, Config(stage=stage, steps=0))
    load(zero2, saved)
    for s in range(3, 5):
        x, y = batch(rank, s)
        F.mse_loss(net2(x), y).backward()
        zero2.step()
        zero2.zero_grad()
    return torch.equal(flat_params(net), flat_params(net2))


def via_shard_state(zero, saved):
    if saved is None:
        return zero.shard_state()
    by_range = {(p.name, p.start, p.end): p for p in saved.pieces}
    zero.load_shard_state(lambda name, a, b: (by_range[(name, a, b)].master, by_range[(name, a, b)].state),
                          saved.groups)


def via_state_dict(zero, saved):
    if saved is None:
        import copy
        return copy.deepcopy(zero.state_dict())
    zero.load_state_dict(saved)


def case_checkpoint(rank, world):
    def run(numbers):
        for stage in (1, 2):
            check(resume(rank, stage, via_shard_state), f"stage {stage}: shard_state round trip differs")
            check(resume(rank, stage, via_state_dict), f"stage {stage}: state_dict round trip differs")
    return run


def case_stage3(rank, world):
    def run(numbers):
        for opt in ("adam", "sgd"):
            for micro in (1, 2):
                cfg = Config(stage=3, opt=opt, micro=micro)
                net, zero = train_zero(rank, cfg)
                with zero.gathered():
                    got = flat_params(net)
                d = max_diff(got, flat_params(train_plain(world, cfg)))
                numbers[cfg.label()] = d
                check(d <= TOL, f"{cfg.label()}: differs from the reference by {d}")
                check(identical_across_ranks([got]), f"{cfg.label()}: ranks disagree")
    return run


def make_cases(rank, world):
    return [("equivalence", case_equivalence(rank, world)), ("ddp", case_ddp(rank, world)),
            ("variants", case_variants(rank, world)), ("bf16", case_bf16(rank, world)),
            ("scaler", case_scaler(rank, world)), ("checkpoint", case_checkpoint(rank, world)),
            ("stage3", case_stage3(rank, world))]


if __name__ == "__main__":
    sys.exit(worker_main(make_cases))
