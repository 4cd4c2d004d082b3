"""One rank of the mixed-precision job:

    ringlet run -np N --transport T -- python tests/workers/amp_worker.py OUT.json

Cases, in order (the last initialises ``ringlet.torch``, so its coordinator carries the collectives):

* ``inf_on_one_rank``: DDP + GradScaler; an inf (then a NaN, on another rank, through the unscale_ then
  clip path) injected into ONE rank's averaged gradient makes every rank skip that step (parameters
  unchanged everywhere) and halve the scale; the scale grows after ``growth_interval`` clean steps;
  parameters bitwise identical on every rank after every step;
* ``master_weights``: a bfloat16 and a float16 model under DDP with MasterWeights: masters stay float32,
  the model keeps its dtype and equals its rounded masters, an overflow skips everywhere, the loss falls;
* ``autocast_bf16``: a float32 model under ``torch.autocast("cpu", dtype=torch.bfloat16)`` with DDP and
  the scaler: float32 gradients, the loss falls, and the parameters follow a one-process run on the
  concatenated batch (bfloat16 rounding apart);
* ``checkpoint``: model, optimizer and scaler saved after an update, loaded into fresh objects: the
  continuation equals the uninterrupted run bitwise (scales included);
* ``coordinated``: with ``ringlet.torch`` initialised: DDP + scaler with an overflow on one rank, and
  the Horovod-style DistributedOptimizer under ``scaler.step(opt)`` alone (the scaler synchronises it)
  and with an explicit ``synchronize()`` first, both against DDP.
"""
from __future__ import annotations

import io
import sys

import torch
import torch.nn.functional as F
from case_harness import check, identical_across_ranks, worker_main

import ringlet
from ringlet.torch import DistributedDataParallel, GradScaler, MasterWeights

INF, NAN = float("inf"), float("nan")


def model(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dtype)


def batch(step: int, rank: int, rows: int = 4):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(rows, 6, generator=g), torch.randn(rows, 4, generator=g)


def scaled_step(scaler, opt, ddp, net, step, rank, inject=None, clip=None):
    """One scaled step; ``inject``: {step: (rank, value)} poisons that rank's averaged gradient."""
    opt.zero_grad()
    x, y = batch(step, rank)
    loss = F.mse_loss(ddp(x), y)
    scaler.scale(loss).backward()
    if inject and step in inject and inject[step][0] == rank:
        net[0].weight.grad[0, 0] = inject[step][1]
    if clip is not None:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
    scaler.step(opt)
    scaler.update()
    return float(loss)


def group_mean(values: list[float]) -> list[float]:
    """The mean over ranks of each value (every rank trains on its own batch; the group's loss falls)."""
    return ringlet.allreduce(torch.tensor(values, dtype=torch.float64), op="avg").tolist()


def params_of(net):
    return [p.detach().clone() for p in net.parameters()]


def case_inf_on_one_rank(rank, world):
    def run(numbers):
        net = model()
        ddp = DistributedDataParallel(net)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        scaler = GradScaler(init_scale=2.0**8, growth_interval=3)
        inject = {2: (world - 1, INF), 5: (0, NAN)}
        scales = []
        for step in range(10):
            before = params_of(net)
            scaled_step(scaler, opt, ddp, net, step, rank, inject, clip=1.0 if step >= 4 else None)
            moved = [not torch.equal(b, p) for b, p in zip(before, net.parameters())]
            check(not any(moved) if step in inject else all(moved), f"step {step}: moved {moved}")
            check(identical_across_ranks(net.parameters()), f"step {step}: ranks differ")
            scales.append(scaler.get_scale())
        check(scales == [256.0, 256.0, 128.0, 128.0, 128.0, 64.0, 64.0, 64.0, 128.0, 128.0], f"scales {scales}")
    return run


def case_master_weights(rank, world):
    def run(numbers):
        for dtype in (torch.bfloat16, torch.float16):
            net = model(dtype)
            ddp = DistributedDataParallel(net)
            opt = MasterWeights(torch.optim.SGD(ddp.parameters(), lr=0.1))
            scaler = GradScaler(init_scale=2.0**10)
            x, y = batch(0, rank, rows=16)  # one fixed batch per rank: the loss must fall
            losses = []
            for step in range(12):
                opt.zero_grad()
                loss = F.mse_loss(ddp(x.to(dtype)).float(), y)
                scaler.scale(loss).backward()
                if step == 3 and rank == world - 1:
                    net[2].bias.grad[0] = INF
                before = [m.detach().clone() for m in opt.master_params()]
                scaler.step(opt)
                scaler.update()
                moved = any(not torch.equal(b, m) for b, m in zip(before, opt.master_params()))
                check(moved == (step != 3), f"{dtype} step {step}: moved {moved}")
                losses.append(float(loss))
            check(all(m.dtype == torch.float32 for m in opt.master_params()), "masters not float32")
            check(all(p.dtype == dtype for p in net.parameters()), "model dtype changed")
            check(all(torch.equal(p, m.to(dtype)) for p, m in opt.pairs), "model is not its rounded masters")
            check(identical_across_ranks(opt.master_params()), "masters differ across ranks")
            check(scaler.get_scale() == 2.0**9, f"scale {scaler.get_scale()}")
            first, last = group_mean([losses[0], losses[-1]])
            check(last < 0.9 * first, f"{dtype}: mean loss {first} -> {last}")
            numbers[f"loss_{dtype}"] = [first, last]
    return run


def case_autocast_bf16(rank, world):
    def train(net, ddp, rows_of):
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        scaler = GradScaler() if ddp is not net else torch.amp.GradScaler("cpu")
        losses = []
        for step in range(12):
            opt.zero_grad()
            x, y = rows_of(step)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = ddp(x)
            check(out.dtype == torch.bfloat16, f"autocast output {out.dtype}")
            loss = F.mse_loss(out.float(), y)
            scaler.scale(loss).backward()
            check(all(p.grad.dtype == torch.float32 for p in net.parameters()), "gradients not float32")
            scaler.step(opt)
            scaler.update()
            losses.append(float(loss))
        return losses

    def run(numbers):
        fixed = {q: batch(0, q, rows=16) for q in range(world)}
        net = model()
        losses = train(net, DistributedDataParallel(net), lambda step: fixed[rank])
        check(identical_across_ranks(net.parameters()), "ranks differ")
        first, last = group_mean([losses[0], losses[-1]])
        check(last < 0.9 * first, f"mean loss {first} -> {last}")
        numbers["autocast_loss"] = [first, last]
        ref = model()
        both = (torch.cat([fixed[q][0] for q in range(world)]), torch.cat([fixed[q][1] for q in range(world)]))
        train(ref, ref, lambda step: both)
        diff = max(float((p - q).abs().max()) for p, q in zip(net.parameters(), ref.parameters()))
        numbers["autocast_vs_one_process"] = diff
        check(diff < 2e-3, f"autocast DDP vs one process: {diff}")
    return run


def case_checkpoint(rank, world):
    def build(state=None):
        net = model()
        if state is not None:
            net.load_state_dict(state["model"])
        ddp = DistributedDataParallel(net, tune=False)  # the step tuner's trials would change the rounding
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        scaler = GradScaler(init_scale=2.0**6, growth_interval=2)
        if state is not None:
            opt.load_state_dict(state["opt"])
            scaler.load_state_dict(state["scaler"])
        return net, ddp, opt, scaler

    def run(numbers):
        inject = {1: (world - 1, INF), 6: (0, INF)}
        net, ddp, opt, scaler = build()
        for step in range(4):
            scaled_step(scaler, opt, ddp, net, step, rank, inject)
        buf = io.BytesIO()
        torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "scaler": scaler.state_dict()}, buf)
        trails = []
        for obj in ((net, ddp, opt, scaler), build(torch.load(io.BytesIO(buf.getvalue())))):
            n, d, o, s = obj
            trail = []
            for step in range(4, 10):
                scaled_step(s, o, d, n, step, rank, inject)
                trail.append((s.get_scale(), s._get_growth_tracker()))
            trails.append((trail, params_of(n)))
        (a, pa), (b, pb) = trails
        check(a == b, f"scales after the checkpoint: {a} vs {b}")
        check(all(torch.equal(p, q) for p, q in zip(pa, pb)), "parameters differ after the checkpoint")
        check(len({s for s, _ in a}) > 1, f"the scale never changed after the checkpoint: {a}")
    return run


def case_coordinated(rank, world):
    def hvd_run(steps, explicit_sync_at=()):
        import ringlet.torch as hvd

        net = model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.05),
                                       named_parameters=net.named_parameters())
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
        scaler = GradScaler(init_scale=2.0**8)
        for step in range(steps):
            opt.zero_grad()
            x, y = batch(step, rank)
            scaler.scale(F.mse_loss(net(x), y)).backward()
            if step in explicit_sync_at:
                opt.synchronize()
                if rank == 0:
                    net[0].bias.grad[0] = INF
            scaler.step(opt)
            scaler.update()
        return net, scaler

    def run(numbers):
        import ringlet.torch as hvd

        hvd.init()
        net = model()
        ddp = DistributedDataParallel(net)
        check(not ddp._comm.coordinated, "DDP left the ordered queue under ringlet.torch")
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        scaler = GradScaler(init_scale=2.0**8)
        for step in range(5):
            before = params_of(net)
            scaled_step(scaler, opt, ddp, net, step, rank, {3: (world - 1, INF)})
            moved = any(not torch.equal(b, p) for b, p in zip(before, net.parameters()))
            check(moved == (step != 3), f"coordinated DDP step {step}: moved {moved}")
        check(scaler.get_scale() == 128.0, f"scale {scaler.get_scale()}")
        hnet, hscaler = hvd_run(5, explicit_sync_at=(3,))
        diff = max(float((p - q).abs().max()) for p, q in zip(net.parameters(), hnet.parameters()))
        numbers["hvd_vs_ddp"] = diff
        check(diff <= 1e-6 and hscaler.get_scale() == 128.0, f"DistributedOptimizer vs DDP: {diff}")
        check(identical_across_ranks(hnet.parameters()), "DistributedOptimizer: ranks differ")
    return run


def cases(rank: int, world: int) -> list:
    return [
        ("inf_on_one_rank", case_inf_on_one_rank(rank, world)),
        ("master_weights", case_master_weights(rank, world)),
        ("autocast_bf16", case_autocast_bf16(rank, world)),
        ("checkpoint", case_checkpoint(rank, world)),
        ("coordinated", case_coordinated(rank, world)),
    ]


if __name__ == "__main__":
    sys.exit(worker_main(cases))
