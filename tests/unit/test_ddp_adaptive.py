"""Dynamic adjustment in ringlet's DDP, in one process (ranks as threads), with an installed cost model and
synthetic all-reduce times: the model's predictions on a "true" network that turns 10× slower mid-run
(the measured spans replaced, so no test depends on the machine's clock). The DDP switches within the
bound, logs it, marks it on the timeline, every rank at the same step; parameters stay those of a run
without adjustment; noise does not switch; ``adapt=None`` and the cases it does not apply to stay off;
the step tuner decides first and gives way at the model's first switch. Real processes:
tests/multiproc/test_adaptive_processes.py."""
from __future__ import annotations

import logging
import math
import random

import pytest
import torch
import torch.nn.functional as F
from conftest import run_world, use_model

from ringlet import timeline
from ringlet.torch.training import Adapt, DistributedDataParallel, Priority
from ringlet.torch.training import ddp as ddp_module
from ringlet.torch.training.adapt import Adjuster
from ringlet.torch.training.buckets import BucketSet, BucketSets
from ringlet.tuning import select
from ringlet.tuning.adaptive import Policy
from ringlet.tuning.network import INTER, INTRA, LinkCost, Network

BASE = Network.of(link="10gbit", latency="20us", intra_link="10gbit", intra_latency="20us", gamma=0.25e-9)
SLOW = Network({c: LinkCost(BASE[c].alpha, BASE[c].beta * 10) for c in (INTRA, INTER)}, BASE.gamma)  # 1 Gbit/s
# Bucket cap of the runs: buckets of about one layer each, 12-37 KB, where a 10x slower link changes the
# best algorithm on 4-6 ranks of one host (the in-process world's layout).
CAP = 16 << 10
SLOW_FROM = 16          # the reduced step from which the network is slow
EVERY = 2
POLICY = Policy(confirmations=3, min_steps=10, half_life=16, bucket_sizes=(CAP,))  # the cap stays
BOUND = EVERY * (POLICY.confirmations + 2)  # steps from the change to the switch


@pytest.fixture
def model(monkeypatch):
    m = select.Model(BASE)
    use_model(monkeypatch, m)
    return m


def make_net() -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)  # not torch's global generator: ranks are threads
    net = torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.ReLU(), torch.nn.Linear(96, 96), torch.nn.ReLU(),
                              torch.nn.Linear(96, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    with torch.no_grad():
        for q in net.parameters():
            q.copy_(torch.randn(q.shape, generator=g) * 0.1)
    return net


def synthetic(monkeypatch, truth=lambda step: SLOW if step >= SLOW_FROM else BASE, noise=0.0, spike=0.0,
              backward=lambda step: 0.005, seed=0):
    """Measured all-reduce times := the installed model's prediction of what ran, on ``truth(step)``, times
    log-normal ``noise`` and, with probability ``spike``, 5 (seeded by ``seed``, the rank and the count);
    backward times := ``backward(step)``."""
    def observe(self, algorithm, nbytes, span):
        n = getattr(self, "fake_n", 0)
        self.fake_n = n + 1
        rng = random.Random(hash((seed, self.fake_rank, n)))
        choice = self.ran(algorithm, nbytes)
        t = self.model.seconds(choice, nbytes, self.host_of, self.itemsize, truth(self.steps))
        t *= math.exp(rng.gauss(0, noise)) * (5 if rng.random() < spike else 1)
        self._inbox.append((choice, nbytes, t))

    real = Adjuster.backward_done
    monkeypatch.setattr(Adjuster, "observe", observe)
    monkeypatch.setattr(Adjuster, "backward_done", lambda self, seconds: real(self, backward(self.steps)))


def train(rank: int, steps: int = 40, adapt=Adapt(EVERY, POLICY), partition=None, overlap=False, **kw):
    """Train ``steps`` SGD steps; returns (flat parameters, the DDP)."""
    net = make_net()
    kw = {"bucket_cap_mb": CAP / (1 << 20), "first_bucket_cap_mb": 4 / 1024, "tune": False,
          "sufficient_factors": False, **kw}
    ddp = DistributedDataParallel(net, adapt=adapt, priority=None if partition is None else Priority(partition), **kw)
    if ddp._adjust is not None:
        ddp._adjust.fake_rank = rank  # seeds synthetic noise
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    if overlap:
        ddp.overlap_optimizer(opt)
    for s in range(steps):
        g = torch.Generator().manual_seed(100 * s + rank)
        opt.zero_grad()
        F.mse_loss(ddp(torch.randn(6, 32, generator=g)), torch.randn(6, 8, generator=g)).backward()
        opt.step()
    ddp.synchronize()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]), ddp


def summary(ddp):
    return [(a.step, a.switch.op, a.switch.old, a.switch.new) for a in ddp.switches]


# ---- the strategy object ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, error", [({"every": 0}, ValueError), ({"every": -3}, ValueError),
                                       ({"every": 1.5}, TypeError), ({"every": True}, TypeError),
                                       ({"policy": "eager"}, TypeError), ({"policy": None}, TypeError)])
def test_adapt_refuses_bad_values(kw, error):
    with pytest.raises(error, match="Adapt"):
        Adapt(**kw)


@pytest.mark.parametrize("every", [1, 7, 10_000])
def test_adapt_accepts_positive_rounds(every):
    assert Adapt(every=every).every == every and isinstance(Adapt().policy, Policy)


def test_adapt_must_be_an_adapt():
    def fn(rank):
        with pytest.raises(TypeError, match="adapt must be"):
            DistributedDataParallel(make_net(), adapt=Policy())
        return True

    assert run_world(2, fn) == [True, True]


@pytest.mark.parametrize("cap", [0, -1])
def test_a_bucket_cap_must_be_positive(cap):
    def fn(rank):
        ddp = DistributedDataParallel(make_net(), adapt=None)
        with pytest.raises(ValueError, match="bucket cap must be positive"):
            ddp._plan.resize(ddp._sets, cap, {})
        return True

    assert run_world(2, fn) == [True, True]


def test_bucket_sets_need_a_set():
    with pytest.raises(ValueError, match="dense or a factored"):
        BucketSets(BucketSet([], lambda ps: None)).replace(None, None)


# ---- switching -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p, launch", [(6, "fifo"), (5, "priority"), (4, "overlap")])  # each launch, each size once
def test_a_slower_network_switches_within_the_bound_on_every_rank_alike(p, launch, model, monkeypatch, tmp_path,
                                                                        caplog):
    synthetic(monkeypatch)
    kw = {} if launch == "fifo" else {"partition": 2 * CAP, "overlap": launch == "overlap"}
    caplog.set_level(logging.INFO, logger="ringlet.torch.training.ddp")
    timeline.start_timeline(str(tmp_path / "tl{rank}.json"))  # the ranks are threads: one file
    try:
        runs = run_world(p, lambda r: train(r, **kw))
    finally:
        timeline.stop_timeline()
    switches = summary(runs[0][1])
    assert switches and all(summary(ddp) == switches for _, ddp in runs)  # the same switches at the same steps
    assert all(op.startswith("bucket" if launch == "fifo" else "piece") and old != new for _, op, old, new in switches)
    steps = sorted({s for s, *_ in switches})
    assert steps[0] >= SLOW_FROM and steps[0] <= SLOW_FROM + BOUND
    assert all(b - a >= POLICY.min_steps for a, b in zip(steps, steps[1:]))
    last = {op: new for _, op, _, new in switches}  # what each message runs now: its last switch's choice
    assert all(runs[0][1].choices[op] == new for op, new in last.items())
    adj = runs[0][1]._adjust  # the fitted constants predict what was measured
    for n in runs[0][1]._launch.messages(runs[0][1]._sets.active).values():
        c = adj.ran("auto", n)
        assert model.seconds(c, n, adj.host_of, 4, adj.adaptive.fitted) == pytest.approx(
            model.seconds(c, n, adj.host_of, 4, SLOW), rel=0.2)
    model.set_network(BASE)
    plain = run_world(p, lambda r: train(r, adapt=None, **kw))
    logged = [r.getMessage() for r in caplog.records if " -> " in r.getMessage() and "step " in r.getMessage()]
    assert len(logged) == p * len(switches)
    [path] = tmp_path.glob("tl*.json")
    marks = [e for e in timeline.read_events(str(path)) if e.get("name") == "switch"]
    assert len(marks) == p * len(switches)
    assert {(m["args"]["step"], m["args"]["op"], m["args"]["new"]) for m in marks} == {(s, o, n) for s, o, _, n in switches}
    for (mine, _), (ref, _) in zip(runs, plain):  # an algorithm of another order of sums: within rounding
        assert torch.allclose(mine, ref, rtol=0, atol=1e-5)
    assert all(torch.equal(runs[0][0], x) for x, _ in runs)


@pytest.mark.parametrize("seed", range(3))
def test_noise_and_spikes_do_not_switch(seed, model, monkeypatch):
    synthetic(monkeypatch, truth=lambda step: BASE, noise=0.15, spike=0.05,
              backward=lambda step: 0.005 * (1 + 0.3 * ((step * 7 + seed) % 5)), seed=seed)
    policy = Policy(confirmations=3, min_steps=10, half_life=16, bucket_sizes=(CAP, 1 << 20))
    runs = run_world(5, lambda r: train(r, steps=60, adapt=Adapt(EVERY, policy)))  # 5 ranks: choices can flip
    assert all(ddp.switches == [] and ddp._adjust.rounds >= 25 for _, ddp in runs)


def test_the_bucket_cap_follows_the_backward_time(model, monkeypatch):
    """Buckets become ready over the backward pass: a long one hides small buckets' latencies, a short one
    does not, and one big bucket pays the latency once."""
    far = Network.of(link="10gbit", latency="200us", intra_link="10gbit", intra_latency="200us", gamma=0.25e-9)
    model.set_network(far)
    synthetic(monkeypatch, truth=lambda step: far, backward=lambda step: 0.05 if step < SLOW_FROM else 1e-4)
    policy = Policy(confirmations=2, min_steps=10, window=4, bucket_sizes=(CAP, 1 << 20))  # backward: mean of 4
    runs = run_world(2, lambda r: train(r, adapt=Adapt(EVERY, policy)))
    plain = run_world(2, lambda r: train(r, adapt=None))
    resized = [a for a in runs[0][1].switches if a.switch.op == "bucket_bytes"]
    assert [(a.switch.old, a.switch.new) for a in resized] == [(str(CAP), str(1 << 20))]
    assert SLOW_FROM <= resized[0].step <= SLOW_FROM + policy.window + BOUND
    assert all(summary(ddp) == summary(runs[0][1]) for _, ddp in runs)
    assert len(runs[0][1].bucket_layout) < len(plain[0][1].bucket_layout)
    assert runs[0][1].adaptive.bucket_bytes == runs[0][1].bucket_cap_bytes == 1 << 20
    assert plain[0][1].bucket_cap_bytes == CAP
    assert all(torch.equal(x, ref) for (x, _), (ref, _) in zip(runs, plain))


# ---- off --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{"adapt": None}, {"algorithm": "ring"}, {"compression": "fp16"}])
def test_off_where_it_does_not_apply(kw, model, monkeypatch):
    synthetic(monkeypatch)
    runs = run_world(2, lambda r: train(r, steps=30, **kw))
    assert all(ddp.adaptive is None and ddp.switches == [] for _, ddp in runs)
    assert model.network == BASE  # nobody touched the installed model


def test_off_without_a_model(monkeypatch):
    use_model(monkeypatch, None)
    runs = run_world(2, lambda r: train(r, steps=4))
    assert all(ddp.adaptive is None and ddp.switches == [] for _, ddp in runs)


# ---- the step tuner first ------------------------------------------------------------------------------------
def test_the_step_tuner_decides_first_and_gives_way_at_the_first_switch(model, monkeypatch):
    """The trial (``"auto"`` against the model's best other algorithms) runs first, its clock faked so that
    the first alternative wins; no round runs before the decision; the model's first switch after the
    network slowed hands the buckets back to ``"auto"``."""
    synthetic(monkeypatch, truth=lambda step: SLOW if step >= 30 else BASE)
    real_init = DistributedDataParallel.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        self.sizes = sorted(set(self._launch.messages(self._sets.active).values()))  # what the trial was planned on
        winner, t = self._tuner.candidates[1], [0.0]

        def clock():
            t[0] += 0.5 if self._tuner.current() == winner else 1.0
            return t[0]

        self._steps._clock = clock

    monkeypatch.setattr(DistributedDataParallel, "__init__", init)

    def fn(rank):
        x, ddp = train(rank, steps=50, tune=True)
        return x, ddp, ddp._tuner.candidates, ddp._tuner.decision.choice, ddp.algorithm

    runs = run_world(4, fn)
    _, ddp, candidates, chosen, now = runs[0]
    assert candidates[0] == "auto" and len(candidates) == 3
    assert candidates[1:] == select.Model(BASE).top_algorithms(ddp.sizes, (0, 0, 0, 0))
    assert chosen == candidates[1] and now == "auto"
    ops = [(a.step, a.switch.op) for a in ddp.switches]
    assert ops and ops[0][0] >= 30 and ("algorithm" in {op for _, op in ops})
    handover = next(a for a in ddp.switches if a.switch.op == "algorithm")
    assert (handover.switch.old, handover.switch.new) == (chosen, "auto")
    assert all(summary(d) == summary(ddp) for _, d, *_ in runs)


# ---- a re-trial where the model cannot attribute a move ----------------------------------------------------------
def test_a_move_the_model_cannot_attribute_puts_the_algorithms_on_trial_again(model, monkeypatch):
    """Every constant 3x from step 30: no choice is worth a switch, so the corrector asks for a trial; the
    step tuner times ``"auto"`` against the best other algorithms again (its clock faked so that the
    last candidate wins each trial), and its decision is reported as an ``algorithm`` switch from what ran
    before; every rank alike, rounds paused meanwhile."""
    slow = Network({c: LinkCost(BASE[c].alpha * 3, BASE[c].beta * 3) for c in (INTRA, INTER)}, BASE.gamma * 3)
    synthetic(monkeypatch, truth=lambda step: slow if step >= 30 else BASE)
    real = ddp_module.StepTuner

    def tuner(candidates, sum_across_ranks):
        t, out = [0.0], real(candidates, sum_across_ranks)

        def clock():
            t[0] += 0.5 if out.choice.current() == candidates[-1] else 1.0
            return t[0]

        out._clock = clock
        return out

    monkeypatch.setattr(ddp_module, "StepTuner", tuner)
    policy = Policy(confirmations=3, min_steps=10, half_life=16, bucket_sizes=(CAP,), retrial=1.4)

    def fn(rank):
        _, ddp = train(rank, steps=80, tune=True, adapt=Adapt(EVERY, policy))
        return ddp, ddp._tuner.candidates, ddp.algorithm

    runs = run_world(4, fn)
    ddp, candidates, now = runs[0]
    assert all(summary(d) == summary(ddp) for d, *_ in runs)
    ops = [(a.step, a.switch.op, a.switch.old, a.switch.new) for a in ddp.switches]
    trial = next(i for i, (_, op, _, _) in enumerate(ops) if op == "trial")
    assert 30 <= ops[trial][0] <= 30 + BOUND and all(op != "trial" for _, op, _, _ in ops[trial + 1:])
    step, op, old, new = ops[trial + 1]  # the re-trial's decision
    assert op == "algorithm" and step > ops[trial][0] and new == candidates[-1] and candidates[0] == "auto"
    assert now == candidates[-1]
