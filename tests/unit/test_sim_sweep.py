"""Sweeps: sizes, the time budget, and the fall-back to the cost model (a stand-in with its API)."""
from __future__ import annotations

import sys
import types

import pytest

from ringlet.sim import MODEL, REPLAY, SweepOptions, predicted, run_sweep, simulate, size_range
from ringlet.sim.budget import Budget, Probe, probe
from ringlet.sim.collectives import collective
from ringlet.sim.model import ModelUnavailable
from ringlet.sim.sizes import fmt_size, parse_size
from ringlet.tuning.network import Network, Topology

NET = Network.of(link="10gbit", latency="20us")
TOPO = Topology.uniform(12, 4)
ALL = tuple(collective("allreduce").algorithms)


class Clock:
    """A fake clock: every reading advances it by ``tick`` seconds."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def stand_in(calls: list) -> types.ModuleType:
    """A module with the cost model's API (``predict``, ``predict_allreduce``) answering 1 ms, 3 steps."""
    mod = types.ModuleType("ringlet.tuning.cost")

    def prediction(segment_bytes):
        return types.SimpleNamespace(seconds=1e-3, steps=3, segment_bytes=segment_bytes, terms={})

    def predict_allreduce(algorithm, nbytes, topology, network, *, itemsize=4, segment_bytes=None):
        calls.append(("allreduce", algorithm, nbytes))
        return prediction(segment_bytes)

    def predict(schedule, topology, network, *, itemsize=4, segment_bytes=None):
        calls.append(("schedule", schedule.name, topology.size))
        return prediction(segment_bytes)

    mod.predict, mod.predict_allreduce = predict, predict_allreduce
    return mod


@pytest.fixture
def cost_calls(monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "ringlet.tuning.cost", stand_in(calls))
    return calls


@pytest.fixture
def no_cost_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "ringlet.tuning.cost", None)  # import raises ImportError


def opts(**kw) -> SweepOptions:
    base = dict(topology=TOPO, network=NET, algorithms=ALL, sizes=size_range("4:1M", 16))
    return SweepOptions(**(base | kw))


def test_a_generous_budget_replays_every_row():
    res = run_sweep(opts())
    assert len(res.rows) == 5 * len(ALL) and not res.notices and not res.modelled
    assert [(r.nbytes, r.algorithm) for r in res.rows] == [(n, a) for n in opts().sizes for a in ALL]
    r = res.rows[-1]
    assert r == simulate("allreduce", r.algorithm, r.nbytes, TOPO, NET)


def test_no_budget_takes_every_row_from_the_cost_model(cost_calls):
    res = run_sweep(opts(budget=0))
    assert {r.source for r in res.rows} == {MODEL}
    assert all(r.seconds == 1e-3 and r.steps == 3 for r in res.rows)
    assert len(cost_calls) == len(res.rows)
    assert len(res.notices) == 1 and "cost model" in res.notices[0] and "0 s budget" in res.notices[0]


def test_a_tight_budget_splits_rows(cost_calls):
    """Every clock reading costs 1 s: the probes and a few rows fit in 40 s, the rest is modelled."""
    res = run_sweep(opts(budget=40), clock=Clock(1.0))
    sources = {r.source for r in res.rows}
    assert sources == {MODEL, REPLAY}
    assert len(res.notices) == 1 and f"{len(res.modelled)} of {len(res.rows)} rows" in res.notices[0]
    for a in ALL:  # within an algorithm the smaller sizes are replayed first
        kinds = [r.source for r in res.rows if r.algorithm == a]
        assert kinds == sorted(kinds, key=lambda s: s == MODEL)


def test_without_a_cost_model_rows_are_replayed_anyway(no_cost_model):
    res = run_sweep(opts(budget=0, sizes=(1024,)))
    assert {r.source for r in res.rows} == {REPLAY}
    assert len(res.notices) == 1 and "replayed them anyway" in res.notices[0]


def test_predicted_without_a_cost_model_raises(no_cost_model):
    with pytest.raises(ModelUnavailable):
        predicted("allreduce", "ring", 1024, TOPO, NET)


def test_other_collectives_ask_the_model_with_their_schedule(cost_calls):
    res = run_sweep(opts(collective="allgather", algorithms=("ring", "direct"), budget=0, sizes=(4096,)))
    assert [r.algorithm for r in res.rows] == ["ring", "direct"]
    assert sorted(cost_calls) == [("schedule", "direct_allgather", 12), ("schedule", "ring_allgather", 12)]


def test_auto_segments_in_the_model(cost_calls):
    r = predicted("allreduce", "tree", 1 << 26, TOPO, NET, "auto")
    assert r.source == MODEL and len(cost_calls) == 2  # whole transfers, then the formula's segment


def test_sweep_rejects_bad_options():
    for bad in (dict(sizes=()), dict(sizes=(6,)), dict(sizes=(-4,)), dict(algorithms=()),
                dict(algorithms=("ring", "nope")), dict(collective="gossip")):
        with pytest.raises(ValueError):
            run_sweep(opts(**bad))


def test_budget_accounting():
    clock = Clock(0.5)
    b = Budget(10, clock)
    assert b.scale == 1.0 and b.fits(9)
    b.record(1.0, 3.0)
    assert b.scale == 3.0 and not b.fits(4)
    with pytest.raises(ValueError):
        Budget(-1)


def test_probe_counts_the_schedule():
    pr = probe(collective("allreduce"), "ring", 1 << 10, Topology.uniform(6, 2), Clock(0.25))
    assert (pr.steps, pr.transfers, pr.build, pr.arrays) == (10, 60, 0.25, 0.25)
    assert pr.estimate(2) > pr.estimate(1) > 0.25
    assert isinstance(pr, Probe)


@pytest.mark.parametrize("spec, factor, sizes", [
    ("1K:1G", 2, tuple(1 << k for k in range(10, 31))),
    ("4", 2, (4,)),
    ("0", 2, (0,)),
    ("1K,4M,1K", 2, (1024, 4 << 20)),
    ("1:100", 10, (1, 10, 100)),
    ("4:64,1K", 4, (4, 16, 64, 1024)),
    ("3:7", 1.5, (3, 4, 7)),
    ("2KiB", 2, (2048,)),
])
def test_size_ranges(spec, factor, sizes):
    assert size_range(spec, factor) == sizes


@pytest.mark.parametrize("spec, factor", [("1G:1K", 2), ("0:1K", 2), ("abc", 2), ("1.5", 2), ("-4", 2),
                                          ("1K:1G", 1), ("", 2), ("1:1T", 1.0001), ("1K:", 2)])
def test_bad_size_ranges(spec, factor):
    with pytest.raises(ValueError):
        size_range(spec, factor)


def test_size_text():
    assert parse_size("256M") == 256 << 20 and parse_size("1.5K") == 1536
    assert [fmt_size(n) for n in (0, 7, 1024, 3 << 20, 1 << 30, 1536)] == ["0 B", "7 B", "1 KiB", "3 MiB", "1 GiB",
                                                                          "1536 B"]
