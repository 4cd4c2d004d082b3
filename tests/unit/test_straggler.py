"""Straggler detection in one process: the detector fed summaries (a compute straggler named after
``checks`` checks, a slow but equal job, one slow step, a transient slowdown, recovery, a slow link),
the options, the meter's arithmetic, the heartbeat sharing over a fake store view, and the front ends
(DDP, DistributedOptimizer, ZeRO stages 1 and 3) measuring a rank that sleeps in its forward, ranks as
threads. Real processes: tests/multiproc/test_straggler_processes.py."""
from __future__ import annotations

import logging
import time

import pytest
import torch
from conftest import run_world
from straggler_cases import SlowNic

import ringlet
from ringlet import straggler
from ringlet.straggler import Detector, StepMeter, StragglerOptions
from ringlet.straggler.share import NAME, Sharer
from ringlet.straggler.stepmeter import trimmed_mean
from ringlet.transport.base import LinkCounter

OPTS = StragglerOptions()
HOSTS = ["h0", "h1", "h2", "h3"]


def summ(c: float, w: float = 0.1, k: int = 10, links=None) -> dict:
    out = {"n": 100, "k": k, "c": c, "w": w, "s": c + w}
    if links is not None:
        out["l"] = {str(p): v for p, v in links.items()}
    return out


def run_checks(det: Detector, summaries, n: int) -> list:
    out = []
    for _ in range(n):
        out += det.check(summaries, HOSTS)
    return out


# ---- the detector, fed summaries --------------------------------------------------------------------------
def test_compute_straggler_named_after_the_consecutive_checks_once():
    det = Detector(OPTS)
    s = {0: summ(0.20), 1: summ(0.21), 2: summ(0.19), 3: summ(0.40, w=0.0)}  # 2x: 1.17 checks' evidence each
    assert run_checks(det, s, OPTS.checks - 1) == []
    (c,) = det.check(s, HOSTS)
    assert (c.rank, c.host, c.kind, c.state) == (3, "h3", "compute", "straggler")
    assert c.value == 0.40 and c.median == 0.20
    assert "rank 3 (host h3) is compute-bound" in c.describe() and "+100%" in c.describe()
    assert run_checks(det, s, 10) == []  # not repeated
    assert det.scores[3] == pytest.approx(1.0) and det.scores[0] == 0.0
    assert [x.rank for x in det.stragglers] == [3]


@pytest.mark.parametrize("ratio, checks", [(2.5, 2), (1.9, 3), (1.5, 9), (1.31, None)])
def test_the_evidence_grows_with_how_much_slower(ratio, checks):
    det = Detector(OPTS)
    s = {0: summ(0.2), 1: summ(0.2), 2: summ(0.2 * ratio)}
    named = [n for n in range(1, 40) if det.check(s, HOSTS)]
    assert named == ([checks] if checks else [])


def test_equal_but_slow_job_raises_nothing():
    det = Detector(OPTS)
    s = {r: summ(5.0 + 0.05 * r, w=2.0) for r in range(4)}
    assert run_checks(det, s, 20) == []
    assert max(det.scores.values()) < OPTS.threshold


def test_one_slow_step_moves_no_median_and_raises_nothing():
    clocks = [FakeClock() for _ in range(4)]
    meters = [StepMeter(OPTS, clock=c) for c in clocks]
    det = Detector(OPTS)
    changes = []
    for step in range(30):
        for r, m in enumerate(meters):
            slow = r == 3 and step in (12, 20)
            clocks[r].step(m, compute=2.0 if slow else 0.2 + 0.01 * r, wait=0.0 if r == 3 else 0.05)
        changes += det.check({r: m.summary() for r, m in enumerate(meters)}, HOSTS)
        assert det.scores.get(3, 0.0) < OPTS.threshold
    assert changes == []


def test_transient_slowdown_shorter_than_the_checks_raises_nothing():
    det = Detector(OPTS)
    fast = {r: summ(0.2) for r in range(4)}
    slow, slowish = {**fast, 1: summ(0.6)}, {**fast, 1: summ(0.3)}
    assert run_checks(det, slow, 1) + run_checks(det, fast, 5) + run_checks(det, slowish, 8) + \
        run_checks(det, fast, 1) + run_checks(det, slowish, 8) == []


def test_recovery_is_reported_once_after_the_consecutive_normal_checks():
    det = Detector(OPTS)
    slow = {0: summ(0.2), 1: summ(0.2), 2: summ(0.7)}
    fast = {r: summ(0.2) for r in range(3)}
    assert [c.state for c in run_checks(det, slow, 5)] == ["straggler"]
    between = {**fast, 2: summ(0.2 * (1 + 0.75 * OPTS.threshold))}  # between the two thresholds
    assert run_checks(det, between, 10) == []
    (c,) = run_checks(det, fast, OPTS.checks)
    assert (c.rank, c.state) == (2, "recovered") and "rank 2 (host h2) has recovered" in c.describe()
    assert run_checks(det, fast, 5) == [] and det.stragglers == []


def test_ranks_with_too_few_steps_and_tiny_differences_are_not_compared():
    det = Detector(OPTS)
    s = {0: summ(0.2), 1: summ(0.2), 2: summ(0.9, k=OPTS.min_steps - 1)}
    assert run_checks(det, s, 5) == [] and 2 not in det.scores
    tiny = {0: summ(0.001), 1: summ(0.001), 2: summ(0.0025)}  # +150%, but 1.5 ms
    assert run_checks(Detector(OPTS), tiny, 5) == []


def ring(shares: dict, b: int = 8 << 20) -> dict:
    """Ring links r -> r+1 of 4 ranks with the given blocked shares (default 0.1%)."""
    return {r: summ(0.2, links={(r + 1) % 4: [b, 1.0, shares.get(r, 0.001)]}) for r in range(4)}


def test_slow_link_names_the_host_common_to_the_slow_links():
    det = Detector(OPTS)
    s = ring({2: 0.40, 3: 0.30})  # 2->3 and 3->0 both touch h3
    (c,) = run_checks(det, s, OPTS.checks)
    assert (c.host, c.kind, c.ranks, c.links) == ("h3", "network", (3,), ((2, 3), (3, 0)))
    assert "host h3 (rank 3) is network-bound" in c.describe() and "2->3, 3->0" in c.describe()
    assert det.scores[3] > 1 and det.scores[1] == 0.0


def test_one_slow_link_names_both_its_ends():
    (c,) = run_checks(Detector(OPTS), ring({2: 0.4, 3: 0.015}), OPTS.checks)
    assert (c.host, c.ranks, c.links) == ("h2 or h3", (2, 3), ((2, 3),))
    assert "host h2 or h3 (ranks 2, 3) is network-bound: its link 2->3" in c.describe()
    assert "the sender's upload or the receiver's download" in c.describe()


def test_links_are_compared_with_links_of_the_same_traffic():
    s = ring({0: 0.025, 1: 0.025, 2: 0.03, 3: 0.025})  # an equal ring blocking a little
    for r, peers in ((0, "23"), (1, "30"), (2, "01"), (3, "12")):  # and smaller traffic that never blocks
        s[r]["l"].update({p: [1 << 20, 1.0, 0.0] for p in peers})
    assert run_checks(Detector(OPTS), s, 10) == []


def test_a_named_host_is_cleared_only_below_half_the_floor():
    det = Detector(OPTS)
    assert [c.state for c in run_checks(det, ring({2: 0.4, 3: 0.3}), OPTS.checks)] == ["straggler"]
    between = 0.75 * OPTS.min_blocked_share
    assert run_checks(det, ring({2: between, 3: between}), 10) == []
    low = 0.25 * OPTS.min_blocked_share
    assert [c.state for c in run_checks(det, ring({2: low, 3: low}), OPTS.checks)] == ["recovered"]


def test_equal_links_and_a_compute_straggler_raise_no_network_verdict():
    assert run_checks(Detector(OPTS), ring({}), 10) == []
    s = ring({2: 0.4, 3: 0.3})
    s[3] = dict(s[3], c=0.9)  # rank 3 is late: its senders block, but it is compute-bound
    changes = run_checks(Detector(OPTS), s, 10)
    assert [(c.kind, c.host) for c in changes] == [("compute", "h3")]


def test_links_within_a_host_and_small_ones_are_ignored():
    hosts = ["a", "a", "b", "b"]
    s = {0: summ(0.2, links={1: [8 << 20, 1.0, 0.9]}), 2: summ(0.2, links={3: [8 << 20, 1.0, 0.01]}),
         1: summ(0.2, links={2: [1000, 1.0, 0.9]}), 3: summ(0.2, links={0: [8 << 20, 1.0, 0.01]})}
    det = Detector(OPTS)
    assert [det.check(s, hosts) for _ in range(5)] == [[]] * 5


# ---- options and the meter --------------------------------------------------------------------------------
@pytest.mark.parametrize("env, error", [({"RINGLET_STRAGGLER": "maybe"}, "RINGLET_STRAGGLER"),
                                        ({"RINGLET_STRAGGLER_THRESHOLD": "x"}, "RINGLET_STRAGGLER_THRESHOLD"),
                                        ({"RINGLET_STRAGGLER_THRESHOLD": "-1"}, "positive"),
                                        ({"RINGLET_STRAGGLER_CHECKS": "0"}, "at least 1"),
                                        ({"RINGLET_STRAGGLER_WINDOW": "2.5"}, "integer")])
def test_bad_options_are_refused(env, error):
    with pytest.raises(ValueError, match=error):
        StragglerOptions.from_env(env)


def test_options_from_env():
    o = StragglerOptions.from_env({"RINGLET_STRAGGLER_THRESHOLD": "0.5", "RINGLET_STRAGGLER_WINDOW": "3"})
    assert (o.enabled, o.threshold, o.window, o.min_steps) == (True, 0.5, 3, 3)
    assert not StragglerOptions.from_env({"RINGLET_STRAGGLER": "0"}).enabled


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def step(self, m: StepMeter, compute: float, wait: float, before: float = 0.0) -> None:
        m.begin_step()
        with m.waiting():
            self.t += before
        self.t += compute
        m.grads_ready()
        with m.waiting():
            self.t += wait
        m.end_step()
        self.t += 0.01  # between steps: the next one's


def test_meter_arithmetic():
    clock = FakeClock()
    m = StepMeter(OPTS, clock=clock)
    m.grads_ready()
    m.end_step()  # no step open yet: dropped, and the next one opens now
    assert m.steps == 0
    for c in (0.3, 0.1, 0.2):
        clock.step(m, compute=c, wait=0.5, before=0.25)
    s = m.summary()
    assert s["n"] == s["k"] == 3
    # compute: start to ready less the wait before it, with the 0.01 s between steps (they open at end_step)
    assert s["c"] == pytest.approx((0.3 + 0.11 + 0.21) / 3) and s["w"] == pytest.approx(0.75)
    assert s["s"] == pytest.approx((1.05 + 0.86 + 0.96) / 3)
    for _ in range(20):  # the window: the last 10 steps, or those of the last 5 s when more
        clock.step(m, compute=1.0, wait=0.0)
    assert m.summary()["k"] == 10
    for _ in range(200):
        clock.step(m, compute=0.001, wait=0.0)
    assert 200 < m.summary()["k"] < 205 and m.summary()["c"] == pytest.approx(0.011)
    assert trimmed_mean([1.0] * 8 + [100.0, 0.0]) == 1.0 and trimmed_mean([2.0]) == 2.0


def test_null_meter_without_a_runtime_or_when_off(monkeypatch):
    assert isinstance(straggler.meter(), straggler.NullMeter) and straggler.scores() == {}
    monkeypatch.setenv("RINGLET_STRAGGLER", "0")

    def fn(rank):
        m = straggler.meter()
        return isinstance(m, straggler.NullMeter), ringlet.collectives.runtime().transport.links

    assert run_world(2, fn) == [(True, None)] * 2


# ---- sharing on the heartbeat -------------------------------------------------------------------------------
class FakeView:
    """The StoreView of one rank over a shared dict."""

    def __init__(self, store: dict, rank: int, size: int):
        self.store, self.rank, self.size = store, rank, size

    def publish(self, name, value):
        self.store[(name, self.rank)] = value.encode()

    def read(self, name, ranks):
        return {r: self.store.get((name, r)) for r in ranks}


def test_sharing_logs_once_and_marks_the_timeline(caplog, tmp_path):
    from ringlet import timeline

    clocks = [FakeClock() for _ in range(3)]
    meters = [StepMeter(OPTS, clock=c) for c in clocks]
    sharers = [Sharer(m, r, 3, HOSTS[:3], reporter=r == 0) for r, m in enumerate(meters)]
    store: dict = {}
    # "{rank}": written whatever rank an earlier test of this process left current (rank 0 alone would write)
    timeline.start_timeline(str(tmp_path / "tl-{rank}.json"))
    try:
        with caplog.at_level(logging.WARNING, logger="ringlet"):
            for beat in range(40):
                slow = 5 <= beat < 20
                for r, m in enumerate(meters):
                    clocks[r].step(m, compute=0.6 if r == 1 and slow else 0.2, wait=0.05)
                for r, sh in enumerate(sharers):
                    sh(FakeView(store, r, 3))
    finally:
        timeline.stop_timeline()
    lines = [r.getMessage() for r in caplog.records if r.name == "ringlet"]
    assert len(lines) == 2 and "rank 1 (host h1) is compute-bound" in lines[0] and "recovered" in lines[1]
    assert meters[2].scores() == sharers[2].detector.scores
    assert NAME == "strag" and (NAME, 2) in store
    (path,) = tmp_path.glob("tl-*.json")
    events = [e for e in timeline.read_events(str(path)) if e.get("name", "").startswith("straggler")]
    assert sorted(e["name"] for e in events) == ["straggler"] * 3 + ["straggler_recovered"] * 3  # one per rank
    assert {e["args"]["rank"] for e in events} == {1} and events[0]["args"]["kind"] == "compute"


# ---- the front ends, ranks as threads -------------------------------------------------------------------------
class Net(torch.nn.Module):
    def __init__(self, sleepy: bool):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 2)
        with torch.no_grad():
            for q in self.parameters():
                q.copy_(torch.randn(q.shape, generator=g) * 0.3)
        self.sleepy = sleepy

    def forward(self, x):
        if self.sleepy:
            time.sleep(0.03)
        return self.b(torch.tanh(self.a(x)))


def _train(rank: int, front: str, steps: int = 9) -> dict:
    net = Net(sleepy=rank == 2)
    if front == "ddp":
        model = ringlet.torch.DistributedDataParallel(net, tune=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    elif front == "hvd":
        model = net
        opt = ringlet.torch.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01),
                                                 named_parameters=net.named_parameters())
    else:
        from ringlet.torch.training.zero import ZeroOptimizer

        model = net
        opt = ZeroOptimizer(torch.optim.SGD, net, stage=int(front[-1]), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 16, generator=g)).square().mean().backward()
        opt.step()
    return straggler.meter().summary()


@pytest.mark.parametrize("front", ["ddp", "hvd", "zero1", "zero3"])
def test_front_ends_measure_a_rank_sleeping_in_forward(front):
    import ringlet.torch  # noqa: F401 - the DDP / optimizer classes

    if front == "hvd":
        from hvd_world import hvd_world

        summaries = dict(enumerate(hvd_world(3, lambda r: _train(r, front))))
    else:
        summaries = dict(enumerate(run_world(3, lambda r: _train(r, front))))
    assert all(s["n"] >= 7 for s in summaries.values())
    assert summaries[2]["c"] > 0.025 > max(summaries[r]["c"] for r in (0, 1))
    assert min(summaries[r]["w"] for r in (0, 1)) > summaries[2]["w"]
    changes = run_checks(Detector(OPTS), summaries, OPTS.checks)
    assert [(c.rank, c.kind) for c in changes] == [(2, "compute")]


# ---- large sends' timing per peer, over an emulated slow link ----------------------------------------------------
@pytest.mark.parametrize("slow", [None, 3])
def test_link_timing_names_the_host_behind_a_slow_link(slow):
    """Four ranks, each its own host; the ring all-reduce of 4 MiB with rank 3's link (both ways) at a tenth
    of the others' rate names h3 network-bound, and equal links name nothing."""
    from ringlet.transport.inproc import InprocWorld

    world = InprocWorld(4)
    nic = SlowNic.rates(4, fast=100e6, slow={slow: 10e6} if slow is not None else {})
    world.transport = lambda r: SlowNic(world, r, nic)

    def fn(rank):
        m = straggler.meter()
        for _ in range(OPTS.min_steps):  # links count once the first steps are done
            m.begin_step()
            m.end_step()
        m.mark_links()
        x = torch.ones(1 << 20)
        for _ in range(4):
            ringlet.allreduce(x, algorithm="ring")
        m.mark_links()
        return m.summary()

    summaries = dict(enumerate(run_world(4, fn, world=world)))
    assert all(set(s["l"]) == {str((r + 1) % 4)} for r, s in summaries.items())
    changes = run_checks(Detector(OPTS), summaries, OPTS.checks)
    if slow is None:
        assert changes == []
    else:
        (c,) = changes
        assert c.kind == "network" and "h3" in c.host.split(" or ") and (2, 3) in c.links


def test_link_counter_refuses_a_bad_size_and_sums_per_peer():
    with pytest.raises(ValueError, match="min_bytes"):
        LinkCounter(0)
    lc = LinkCounter()
    lc.add(1, 100, 0.5, 0.25)
    lc.add(1, 50, 0.5, 0.0)
    assert lc.snapshot() == {1: (150, 1.0, 0.25, 2)}


# ---- ringlet report lists the verdicts of a timeline -------------------------------------------------------------
def test_report_lists_the_stragglers_of_a_timeline(tmp_path):
    import json

    from click.testing import CliRunner

    from ringlet import timeline
    from ringlet.cli.main import main
    from ringlet.cli.report import stragglers
    from ringlet.straggler import Change

    path = tmp_path / "t.json"
    tl = timeline.Timeline(str(path), 0)
    tl.instant(timeline.STEP_TRACK, timeline.STEP_EVENT, ts_us=0.0)
    tl.span("backward", "BACKWARD", 0.0, 50.0)
    tl.span("bucket0", "COMMUNICATE", 40.0, 60.0)
    tl.instant(timeline.STEP_TRACK, timeline.STEP_EVENT, ts_us=100.0)
    tl.instant("straggler", "straggler", Change(3, "h3", "compute", "straggler", 0.5, 0.2).args(), ts_us=20.0)
    tl.instant("straggler", "straggler", Change(2, "h2", "network", "straggler", 0.4, 0.02, (2,),
                                                ((1, 2), (2, 3))).args(), ts_us=30.0)
    tl.instant("straggler", "straggler_recovered", Change(3, "h3", "compute", "recovered", 0.2, 0.2).args(),
               ts_us=90.0)
    tl.close()
    res = CliRunner().invoke(main, ["report", "--skip", "0", str(path)])
    assert res.exit_code == 0, res.output
    out = res.output.split("stragglers:")[1].splitlines()
    assert "rank 3 (host h3) compute-bound: 0.500 s per step against the others' median 0.200 s" in out[1]
    assert "host h2 (ranks 2) network-bound: senders blocked 40.0% on 1->2, 2->3 against the median 2.0%" in out[2]
    assert "rank 3 (host h3) recovered (compute-bound before)" in out[3]
    data = json.loads(CliRunner().invoke(main, ["report", "--json", "--skip", "0", str(path)]).output)
    assert [(v["rank"], v["kind"], v["state"]) for v in data["stragglers"]] == [
        (3, "compute", "straggler"), (2, "network", "straggler"), (3, "compute", "recovered")]
    two = [{"name": "straggler", "ph": "i", "pid": pid, "ts": ts, "args": {"rank": pid}}
           for pid, ts in ((2, 1), (1, 2))]
    assert stragglers(two) == [{"rank": 1, "ts_us": 2.0}]  # the lowest rank's marks only
    empty = tmp_path / "e.json"
    tl = timeline.Timeline(str(empty), 0)
    tl.span("backward", "BACKWARD", 0.0, 50.0)
    tl.close()
    assert "stragglers: none named" in CliRunner().invoke(main, ["report", str(empty)]).output


# ---- cohorts: pipeline stages are compared within themselves ------------------------------------------------------
def test_cohorts_compare_their_own_members_only():
    s = {0: dict(summ(0.2), g="a"), 1: dict(summ(0.2), g="a"), 2: dict(summ(0.9), g="b"), 3: dict(summ(0.9), g="b")}
    assert run_checks(Detector(OPTS), s, 5) == []
    s[3] = dict(summ(1.5), g="b")
    assert [(c.rank, c.kind) for c in run_checks(Detector(OPTS), s, 5)] == [(3, "compute")]
    alone = {0: dict(summ(0.2), g="a"), 1: dict(summ(0.9), g="b")}
    assert run_checks(Detector(OPTS), alone, 5) == []


class Pause(torch.nn.Module):
    def __init__(self, seconds: dict):
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds.get(ringlet.collectives.runtime().rank, 0.0))
        return x


@pytest.mark.parametrize("pauses, named", [({2: 0.01, 3: 0.01}, []), ({2: 0.01, 3: 0.04}, [3])])
def test_pipeline_replicas_are_compared_within_their_stage(pauses, named):
    """2 stages x 2 replicas; stage 1 sleeps in every micro-batch's forward (slower than stage 0, which is
    no straggler), and with rank 3 sleeping longer, rank 3 is named."""
    import torch.nn.functional as F

    from ringlet.torch import Pipeline

    def body(rank):
        g = torch.Generator().manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), Pause(pauses), torch.nn.Linear(6, 3))
        with torch.no_grad():
            for q in net.parameters():
                q.copy_(torch.randn(q.shape, generator=g) * 0.5)
        pipe = Pipeline(net, 2, 2, "1f1b", balance=[2, 2], tune=False)
        opt = torch.optim.SGD(pipe.parameters(), lr=0.01)
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        for _ in range(8):
            opt.zero_grad()
            pipe.step(x if pipe.is_first else None, y if pipe.is_last else None, F.mse_loss)
            opt.step()
        return straggler.meter().summary()

    summaries = dict(enumerate(run_world(4, body)))
    assert [summaries[r]["g"] for r in range(4)] == ["pipeline stage 0"] * 2 + ["pipeline stage 1"] * 2
    assert summaries[2]["c"] > summaries[0]["c"] + 0.01  # stage 1 sleeps, stage 0 waits for it
    assert [c.rank for c in run_checks(Detector(OPTS), summaries, OPTS.checks)] == named
