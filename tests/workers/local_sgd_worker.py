"""One rank of the synchronise-less-often job:

    ringlet run -np N --transport T -- python tests/workers/local_sgd_worker.py OUT.json

Cases, in order (the last initialises ``ringlet.torch``, so its coordinator carries the collectives):

* ``bad_arguments``: period < 1, H < 1 and the other bad values raise ``ValueError`` on every rank;
* ``local_sgd_k1``: post-local SGD over DDP with k = 1 equals averaging the parameters (and BatchNorm's
  floating buffers) after every local step, done by hand with ``ringlet.allreduce``;
* ``local_sgd_schedule``: warm-up 3, period 2 over DDP (``broadcast_buffers=False``): the warm-up equals
  plain DDP bitwise, the ranks drift apart on local steps and hold bitwise the same parameters and buffers
  after every averaging, whose values are the mean of the ranks' (buffers included);
* ``diloco_h1``: DiLoCo with H = 1, outer lr 1, momentum 0 equals averaging the parameters every step;
* ``diloco_nesterov``: H = 3, outer lr 0.7, Nesterov momentum 0.9 against a simulation of every rank's
  inner loop in this process (mean delta, torch's SGD on θ_start); bitwise identical after every outer step;
* ``coordinated``: both strategies with ``ringlet.torch`` initialised.
"""
from __future__ import annotations

import sys

import torch
from case_harness import check, flat, identical_across_ranks, model_state, worker_main

import ringlet
from ringlet.torch import DistributedDataParallel
from ringlet.torch.training import DiLoCo, LocalSGD

TOL = 1e-6


def model() -> torch.nn.Module:
    torch.manual_seed(21)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.BatchNorm1d(12), torch.nn.Tanh(),
                               torch.nn.Linear(12, 3))


def backward(net, step: int, rank: int) -> None:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)
    torch.nn.functional.mse_loss(net(x), y).backward()


def sgd(params, momentum: float = 0.0):
    return torch.optim.SGD(params, lr=0.1, momentum=momentum)


def averaged_by_hand(rank: int, steps: int) -> torch.nn.Module:
    """Local steps, each followed by ``ringlet.allreduce`` (op avg) of every parameter and float buffer."""
    net = model()
    opt = sgd(net.parameters())
    for step in range(steps):
        opt.zero_grad()
        backward(net, step, rank)
        opt.step()
        with torch.no_grad():
            for t in list(net.parameters()) + [b for b in net.buffers() if b.is_floating_point()]:
                t.copy_(ringlet.allreduce(t, op="avg"))
    return net


def maxdiff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return float((flat(model_state(a)) - flat(model_state(b))).abs().max())


def case_bad_arguments(rank, world):
    def run(numbers):
        net = model()
        ddp = DistributedDataParallel(net)
        opt = sgd(ddp.parameters())
        attempts = [lambda: LocalSGD(ddp, opt, period=0), lambda: LocalSGD(ddp, opt, period=-2),
                    lambda: LocalSGD(ddp, opt, period=2, warmup_steps=-1),
                    lambda: LocalSGD(ddp, opt, period=2, group=object()),  # a DDP brings its group
                    lambda: DiLoCo(net, opt, period=0), lambda: DiLoCo(net, opt, period=2, outer_lr=-1.0),
                    lambda: DiLoCo(net, opt, period=2, outer_momentum=1.5)]
        for i, attempt in enumerate(attempts):
            try:
                attempt()
                check(False, f"attempt {i} did not raise")
            except ValueError:
                pass
    return run


def case_local_sgd_k1(rank, world):
    def run(numbers):
        net = model()
        ddp = DistributedDataParallel(net, broadcast_buffers=False)
        opt = sgd(ddp.parameters())
        local = LocalSGD(ddp, opt, period=1)
        for step in range(5):
            opt.zero_grad()
            backward(ddp, step, rank)
            local.step()
            check(local.averagings == step + 1, f"step {step}: no averaging")
            check(identical_across_ranks(model_state(net)), f"step {step}: ranks differ after averaging")
        d = maxdiff(net, averaged_by_hand(rank, 5))
        numbers["local_sgd_k1_vs_by_hand"] = d
        check(d <= TOL, f"k=1 vs averaging by hand: {d}")
    return run


def case_local_sgd_schedule(rank, world):
    def run(numbers):
        net, plain = model(), model()
        ddp = DistributedDataParallel(net, broadcast_buffers=False, tune=False)
        plain_ddp = DistributedDataParallel(plain, broadcast_buffers=False, tune=False)
        opt, plain_opt = sgd(ddp.parameters(), 0.9), sgd(plain_ddp.parameters(), 0.9)
        local = LocalSGD(ddp, opt, period=2, warmup_steps=3)
        for step in range(11):
            t = step + 1
            check(ddp.require_backward_grad_sync == (t <= 3), f"step {t}: sync flag")
            opt.zero_grad()
            backward(ddp, step, rank)
            opt.step()
            if t <= 3:
                plain_opt.zero_grad()
                backward(plain_ddp, step, rank)
                plain_opt.step()
                check(torch.equal(flat(net.parameters()), flat(plain.parameters())), f"warm-up step {t} vs DDP")
            rows = ringlet.allgather(flat(model_state(net)).unsqueeze(0))
            averaged = local.after_step()
            check(averaged == (t > 3 and (t - 3) % 2 == 0), f"step {t}: averaged {averaged}")
            same_params = identical_across_ranks(net.parameters())
            check(same_params == (t <= 3 or averaged), f"step {t}: parameters identical {same_params}")
            if averaged:
                check(identical_across_ranks(model_state(net)), f"step {t}: buffers differ after averaging")
                floats = [t_.is_floating_point() for t_ in model_state(net) for _ in range(t_.numel())]
                mean = rows.mean(0)
                got = flat(model_state(net))
                d = float((got - mean)[torch.tensor(floats)].abs().max())
                check(d <= TOL, f"step {t}: averaged state vs the ranks' mean: {d}")
        check(local.averagings == 4, f"{local.averagings} averagings")
    return run


def case_diloco_h1(rank, world):
    def run(numbers):
        net = model()
        opt = sgd(net.parameters())
        diloco = DiLoCo(net, opt, period=1, outer_lr=1.0, outer_momentum=0.0)
        for step in range(5):
            opt.zero_grad()
            backward(net, step, rank)
            diloco.step()
            check(identical_across_ranks(model_state(net)), f"step {step}: ranks differ")
        d = maxdiff(net, averaged_by_hand(rank, 5))
        numbers["diloco_h1_vs_by_hand"] = d
        check(d <= TOL, f"H=1, lr 1, momentum 0 vs averaging by hand: {d}")
    return run


def simulate_diloco(world: int, rounds: int, period: int) -> torch.nn.Module:
    """Every rank's inner loop in this process; the outer step on the mean delta, as in the paper."""
    nets = [model() for _ in range(world)]
    opts = [sgd(n.parameters(), 0.9) for n in nets]
    anchor = [p.detach().clone().requires_grad_() for p in nets[0].parameters()]
    outer = torch.optim.SGD(anchor, lr=0.7, momentum=0.9, nesterov=True)
    step = 0
    for _ in range(rounds):
        for _ in range(period):
            for q, (n, o) in enumerate(zip(nets, opts)):
                o.zero_grad()
                backward(n, step, q)
                o.step()
            step += 1
        with torch.no_grad():
            for i, a in enumerate(anchor):
                a.grad = torch.stack([a - list(n.parameters())[i] for n in nets]).mean(0)
            outer.step()
            means = [torch.stack(list(bs)).mean(0) if bs[0].is_floating_point() else bs[0]
                     for bs in zip(*[list(n.buffers()) for n in nets])]
            for n in nets:
                for p, a in zip(n.parameters(), anchor):
                    p.copy_(a)
                for b, m in zip(n.buffers(), means):
                    b.copy_(m)
    return nets[0]


def case_diloco_nesterov(rank, world):
    def run(numbers):
        net = model()
        opt = sgd(net.parameters(), 0.9)
        diloco = DiLoCo(net, opt, period=3)
        for step in range(9):
            opt.zero_grad()
            backward(net, step, rank)
            diloco.step()
            outer = diloco.steps % 3 == 0
            same = identical_across_ranks(net.parameters())
            check(same == outer, f"inner step {step + 1}: identical {same}, outer step {outer}")
        check(diloco.outer_steps == 3, f"{diloco.outer_steps} outer steps")
        d = maxdiff(net, simulate_diloco(world, 3, 3))
        numbers["diloco_vs_simulation"] = d
        check(d <= 1e-5, f"DiLoCo vs its simulation: {d}")
    return run


def case_coordinated(rank, world):
    def run(numbers):
        import ringlet.torch as hvd

        hvd.init()
        net = model()
        ddp = DistributedDataParallel(net, broadcast_buffers=False)
        check(not ddp._comm.coordinated, "DDP left the ordered queue under ringlet.torch")
        opt = sgd(ddp.parameters())
        local = LocalSGD(ddp, opt, period=2, warmup_steps=1)
        plain = model()
        popt = sgd(plain.parameters())
        diloco = DiLoCo(plain, popt, period=2)
        for step in range(5):
            for m, o, strategy in ((ddp, opt, local), (plain, popt, diloco)):
                o.zero_grad()
                backward(m, step, rank)
                o.step()
                synced = strategy.after_step()
                check(not synced or identical_across_ranks(model_state(m.module if m is ddp else m)),
                      f"step {step}: {type(strategy).__name__} ranks differ after synchronising")
        check(local.averagings == 2 and diloco.outer_steps == 2, f"{local.averagings}, {diloco.outer_steps}")
    return run


def cases(rank: int, world: int) -> list:
    return [
        ("bad_arguments", case_bad_arguments(rank, world)),
        ("local_sgd_k1", case_local_sgd_k1(rank, world)),
        ("local_sgd_schedule", case_local_sgd_schedule(rank, world)),
        ("diloco_h1", case_diloco_h1(rank, world)),
        ("diloco_nesterov", case_diloco_nesterov(rank, world)),
        ("coordinated", case_coordinated(rank, world)),
    ]


if __name__ == "__main__":
    sys.exit(worker_main(cases))
