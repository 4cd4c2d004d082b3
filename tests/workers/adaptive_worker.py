"""One rank of the dynamic-adjustment job:

    ringlet run -np N --transport T -- python tests/workers/adaptive_worker.py OUT.json

A cost model (10 Gbit/s, 50 us) is installed and corrected by the measured all-reduces; buckets of at most
8 KB are offered one size, 1 MiB (one bucket for the whole model: a latency each saved), so a bucket
size switch, and the rebuild at the same step on every rank, is all but certain. Cases:

* ``agreement``: 30 steps of ringlet's DDP with ``adapt=Adapt(every=2, ...)`` and real timings: the rounds
  came at the expected steps, every rank made the same switches at the same steps and holds bitwise the
  same parameters and the same installed constants; the parameters are those of a run without
  adjustment (within rounding: another algorithm sums in another order); each switch is an instant on
  this rank's timeline;
* ``off``: ``adapt=None`` leaves the installed model alone.
"""
from __future__ import annotations

import os
import sys
import zlib

import torch
import torch.nn.functional as F
from case_harness import check, identical_across_ranks, worker_main

import ringlet
from ringlet import timeline
from ringlet.torch.training import Adapt, DistributedDataParallel
from ringlet.tuning import select
from ringlet.tuning.adaptive import Policy
from ringlet.tuning.network import Network

FAR = Network.of(link="10gbit", latency="50us")
STEPS, EVERY = 30, 2
POLICY = Policy(confirmations=1, min_steps=4, half_life=16, bucket_sizes=(1 << 20,))


def make_net() -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    layers = [m for _ in range(10) for m in (torch.nn.Linear(32, 32), torch.nn.Tanh())]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(32, 8))
    with torch.no_grad():
        for q in net.parameters():
            q.copy_(torch.randn(q.shape, generator=g) * 0.1)
    return net


def train(rank: int, adapt) -> tuple[torch.Tensor, DistributedDataParallel]:
    net = make_net()
    ddp = DistributedDataParallel(net, bucket_cap_mb=8 / 1024, first_bucket_cap_mb=4 / 1024, tune=False,
                                  sufficient_factors=False, adapt=adapt)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for s in range(STEPS):
        g = torch.Generator().manual_seed(100 * s + rank)
        opt.zero_grad()
        F.mse_loss(ddp(torch.randn(16, 32, generator=g)), torch.randn(16, 8, generator=g)).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]), ddp


def use_model(model) -> None:
    """The runtime's algorithm selector with cost ``model`` (None: the size rule), as ringlet.init makes
    it from a calibration profile."""
    ringlet.collectives.runtime().selector = select.Selector(model)


def constants(net: Network) -> torch.Tensor:
    return torch.tensor([v for lc in net.links.values() for v in (lc.alpha, lc.beta)] + [net.gamma], dtype=torch.float64)


def case_agreement(rank: int, out: str):
    def run(numbers):
        use_model(select.Model(FAR))
        timeline.start_timeline(f"{out}.timeline{{rank}}.json")
        try:
            mine, ddp = train(rank, Adapt(EVERY, POLICY))
        finally:
            timeline.stop_timeline()
        use_model(select.Model(FAR))
        plain, _ = train(rank, None)
        use_model(None)
        switches = [f"{a.step}:{a.switch.op}:{a.switch.old}->{a.switch.new}" for a in ddp.switches]
        numbers["switches"] = switches
        numbers["factors"] = ddp.adaptive.factors
        check(ddp._adjust.rounds == len(range(EVERY, STEPS, EVERY)), f"rounds {ddp._adjust.rounds}")
        digest = torch.tensor([float(zlib.crc32("|".join(switches).encode()))], dtype=torch.float64)
        check(identical_across_ranks([digest]), "the ranks made different switches")
        check(identical_across_ranks([mine]), "the ranks hold different parameters")
        check(identical_across_ranks([constants(ddp.adaptive.installed)]), "the ranks installed different constants")
        check(torch.allclose(mine, plain, rtol=0, atol=1e-5), f"adjustment moved the parameters by {(mine - plain).abs().max()}")
        marks = [e for e in timeline.read_events(f"{out}.timeline{rank}.json") if e.get("name") == "switch"]
        check(len(marks) == len(switches), f"{len(marks)} timeline marks for {len(switches)} switches")
    return run


def case_off(rank: int):
    def run(numbers):
        model = select.Model(FAR)
        use_model(model)
        _, ddp = train(rank, None)
        use_model(None)
        check(ddp.adaptive is None and ddp.switches == [] and model.network == FAR, "adapt=None adjusted")
    return run


def make_cases(rank: int, world: int):
    return [("agreement", case_agreement(rank, sys.argv[1])), ("off", case_off(rank))]


if __name__ == "__main__":
    os.environ.pop("RINGLET_ALGORITHM", None)
    sys.exit(worker_main(make_cases))
