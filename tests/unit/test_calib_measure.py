"""Calibration's instruments and the whole measurement on in-process worlds (ranks as threads): the
traffic patterns, the chain schedules, and a profile that is identical on every rank."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_world, simulate

from ringlet.algorithms.executor import compile_plan
from ringlet.collectives import runtime
from ringlet.tuning.calibrate import PLANS, CalibrationPlan, calibrate, plan_named
from ringlet.tuning.network import INTER, INTRA, LINK_CLASSES, Topology, host_layout
from ringlet.engine.probe import Prober
from ringlet.tuning.patterns import chain, sharing, shift_pattern

TINY = CalibrationPlan("tiny", (4, 4096, 65536), (1, 2), 1, (4096, 65536), 5.0, large_bytes=65536)

LAYOUTS = {  # host_of of every rank
    "1x1": (0,),
    "1x2": (0, 0),
    "1x3": (0, 0, 0),
    "2x1": (0, 1),
    "3x1": (0, 1, 2),
    "2x2": (0, 0, 1, 1),
    "3+2": (0, 0, 0, 1, 1),
    "4x1": (0, 1, 2, 3),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_shift_patterns_stay_in_or_cross_hosts(name):
    host_of = LAYOUTS[name]
    p = len(host_of)
    intra, inter = shift_pattern(host_of, INTRA), shift_pattern(host_of, INTER)
    assert all(host_of[s] == host_of[d] and s != d for s, d in intra)
    assert all(host_of[s] != host_of[d] for s, d in inter)
    layout = host_layout(host_of)
    assert len(intra) == sum(n for n in layout if n > 1)  # every rank with a neighbour on its host sends
    assert len(inter) == (p if len(layout) > 1 else 0)  # every rank sends across when there are hosts to cross
    for pattern in (intra, inter):
        assert len({s for s, _ in pattern}) == len(pattern)  # one send per rank


@pytest.mark.parametrize("name,cls,expected", [
    ("2x2", INTER, 2), ("2x2", INTRA, 1), ("4x1", INTER, 1), ("3+2", INTER, 3), ("1x3", INTRA, 1),
    ("1x1", INTRA, 1),
])
def test_sharing_counts_transfers_per_link(name, cls, expected):
    host_of = LAYOUTS[name]
    assert sharing(shift_pattern(host_of, cls), Topology(host_of)) == expected


def test_unknown_link_class():
    with pytest.raises(ValueError, match="unknown link class"):
        shift_pattern((0, 0), "optical")


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize("steps", [1, 2, 3, 7])
@pytest.mark.parametrize("count", [1, 13])
def test_chain_forwards_what_it_received(p, steps, count):
    pattern = tuple((r, (r + 1) % p) for r in range(p))
    sched = chain(pattern, p, count, steps)
    assert sched.num_steps == steps
    bufs = [(torch.cat([torch.full((count,), float(10 * r + c)) for c in range(3)]),) for r in range(p)]
    out = simulate(sched, bufs)
    # after `steps` forwards, chunk steps % 3 of rank r holds chunk 0 of rank r - steps
    for r in range(p):
        got = out[r][0][(steps % 3) * count:(steps % 3 + 1) * count]
        assert torch.equal(got, torch.full((count,), float(10 * ((r - steps) % p))))
    for r in range(p):  # every receive lands in place: no scratch, no copy
        plan = compile_plan(sched, r, 1 << 20)
        assert all(m.direct for m in plan.msgs if not m.is_send)


def test_plans():
    assert plan_named("quick") is PLANS["quick"] and plan_named("full") is PLANS["full"]
    with pytest.raises(ValueError, match="unknown calibration plan"):
        plan_named("slow")


@pytest.mark.parametrize("kw,match", [
    (dict(sizes=(4, 8)), "ascending sizes"),
    (dict(sizes=(4, 16, 8)), "ascending sizes"),
    (dict(sizes=(0, 4, 8)), "ascending sizes"),
    (dict(chains=(2, 2)), "two distinct chain lengths"),
    (dict(chains=(0, 2)), "two distinct chain lengths"),
    (dict(reps=0), "reps"),
    (dict(budget_s=0.0), "budget_s"),
    (dict(gamma_sizes=(4096,)), "gamma sizes"),
    (dict(large_bytes=-4), "large_bytes"),
    (dict(large_bytes=6), "large_bytes"),
])
def test_bad_plans_are_refused(kw, match):
    args = dict(name="bad", sizes=(4, 64, 4096), chains=(1, 2), reps=1, gamma_sizes=(64, 4096), budget_s=1.0) | kw
    with pytest.raises(ValueError, match=match):
        CalibrationPlan(**args)


# No peers, peers on the host only, on other hosts only, and both (on hosts of different sizes).
@pytest.mark.parametrize("name", ["1x1", "1x2", "2x1", "3+2"])
def test_calibration_gives_every_rank_the_same_profile(name):
    host_of = LAYOUTS[name]
    p = len(host_of)
    profiles = run_world(p, lambda rank: calibrate(Prober(runtime()), TINY, host_of=host_of))
    first = profiles[0]
    assert all(pr.network == first.network and pr.fingerprint == first.fingerprint for pr in profiles)
    assert first.fingerprint.ranks == p and first.fingerprint.layout == host_layout(host_of)
    assert first.fingerprint.transport == "inproc"
    layout = host_layout(host_of)
    expect = sorted(([INTER] if len(layout) > 1 else []) + ([INTRA] if max(layout) > 1 else []))
    assert first.info["measured"] == expect
    # Every step's seconds, in protocol order, adding up to the whole (rank 0's clock).
    steps = first.info["step_seconds"]
    assert list(steps) == [c for c in LINK_CLASSES if c in expect] + ["gamma", "per_call", "large", "wire"]
    assert all(v >= 0 for v in steps.values()) and sum(steps.values()) == pytest.approx(first.info["seconds"])
    assert first.network.gamma > 0  # never 0: without growth with size it is time per byte
    for cls in expect:  # what was measured is there (the values are timings: not asserted)
        assert len(first.info["samples"][cls]["points"]) == 2 * len(TINY.sizes)
    if len(expect) == 1:  # the absent class copies the measured one
        assert first.network[INTRA] == first.network[INTER]
    net = first.network
    # The check: checked minus unchecked whole calls where there are peers, else back-to-back agreements.
    fit = first.info["per_call"].get("fit")
    assert net.op >= 0 and net.check >= 0 and net.check == (fit["check"] if fit else first.info["check_overhead"])
    if fit:
        calls = [v for k, v in first.info["per_call"].items() if k != "fit"]
        extra = sorted(v["checked"] - v["measured"] for v in calls)
        assert fit["check"] == pytest.approx(max(0.0, float(np.median(extra))))
    if p > 1:  # the per-call constant came from whole all-reduces of both kinds
        calls = dict(first.info["per_call"])
        fit = calls.pop("fit")
        assert sorted(calls) == ["direct", "recursive_doubling", "ring"]
        assert fit["op"] == net.op and fit["epsilon"] == net.epsilon and fit["alpha_scale"] >= 0
        assert all(v["measured"] > 0 and v["predicted"] >= 0 and v["endpoints"] > 0 for v in calls.values())
        # One process holds every rank here: one kernel, so the job's ranks share its processors.
        assert net.cpus.scope == ("machine" if len(set(host_of)) > 1 else "host") == fit["cpus"]["scope"]
        # The per-byte price came from whole all-reduces of the plan's large size with both algorithms,
        # and the ring again cut into 32 messages per buffer.
        large = dict(first.info["large_calls"])
        kfit = large.pop("fit")
        assert kfit["bytes"] == TINY.large_bytes and kfit["kappa"] >= 0
        # Step 7's prices: one, or per link class where the intra chains cap kappa below the fit.
        split = kfit["per_class"]
        both = len(set(host_of)) > 1 and len(set(host_of)) < p
        assert bool(split) == (both and kfit["kappa"] > 0)
        kappa, kx = (split["intra_bound"], split["kappa_inter"]) if split.get("split") else (kfit["kappa"], None)
        if split.get("split"):
            assert split["kappa_inter"] > split["intra_bound"] and kfit["kappa"] > split["intra_bound"]
        assert list(large) == ["ring", "halving_doubling", "ring_segmented"]
        assert [v["algorithm"] for v in large.values()] == ["ring", "halving_doubling", "ring"]
        assert large["ring_segmented"]["segment_bytes"] == TINY.large_bytes // 32
        assert all(v["measured"] > 0 and v["predicted"] > 0 and v["segment_bytes"] > 0 for v in large.values())
        wire = first.info["wire"]
        if len(set(host_of)) < 2:  # no link between hosts: nothing to tell apart
            assert wire == {} and (net.kappa, net.kappa_inter) == (kappa, kx)
        else:  # a lone transfer against the inter shift: the prices and the inter beta follow the decision
            assert wire["bytes"] == TINY.large_bytes and wire["lone_s"] > 0 and wire["shift_s"] > 0
            if wire["split"]:
                kappa = max(kappa, wire["processors"])
                kx = None if kx is None else max(kx, wire["processors"])
            assert (net.kappa, net.kappa_inter) == (kappa, kx)
            assert net[INTER].beta == (wire["lone_beta"] if wire["split"] else wire["shift_beta"])
    else:
        assert net.op == 0 and first.info["per_call"] == {} and first.info["large_calls"] == {}
        assert first.info["wire"] == {}
        assert net.kappa == 0


def test_calibration_refuses_a_layout_of_the_wrong_size():
    with pytest.raises(ValueError, match="host_of names 3 ranks"):
        run_world(2, lambda rank: calibrate(Prober(runtime()), TINY, host_of=(0, 0, 1)))


@pytest.mark.parametrize("repeat", [1, 3])
def test_chains_travel_as_whole_messages_whatever_the_segment(repeat):
    from ringlet.types import Options

    count, steps = 16384, 2  # 64 KiB per transfer; the runtime's segment is 1 KiB

    def body(rank):
        rt = runtime()
        prober = Prober(rt)
        buf = torch.ones(3 * count)
        sched = chain(((0, 1), (1, 0)), 2, count, steps)
        before = rt.transport.wire.snapshot()
        prober.time_chain(sched, buf, repeat)
        return (rt.transport.wire.snapshot() - before).messages_sent

    sent = run_world(2, body, options=Options(timeout=20, segment_bytes=1024))
    assert sent == [1 + steps * repeat] * 2  # one barrier message, then one message per step


@pytest.mark.parametrize("budget,measured", [(1e-9, 3), (100.0, 5)])
def test_the_budget_drops_the_largest_sizes_alike_on_every_rank(budget, measured):
    plan = CalibrationPlan("budget", (4, 64, 1024, 16384, 65536), (1, 2), 1, (4096, 65536), budget)
    # a rank deciding otherwise than the others would leave them waiting: the world would time out
    profiles = run_world(3, lambda rank: calibrate(Prober(runtime()), plan, host_of=(0, 0, 1)))
    for cls in (INTRA, INTER):
        assert sorted({pt[0] for pt in profiles[0].info["samples"][cls]["points"]}) == list(plan.sizes[:measured])
