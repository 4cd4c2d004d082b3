"""The path of one all-reduce reads top to bottom (docs/design.md, "The path of one all-reduce").

One dense small all-reduce (the transport's small-message path), one dense large one (agree, select,
schedule), one compressed one (including PowerSGD, whose own schedule is handed the engine's
all-reduce), one asynchronous one (run by the queue's worker thread) and the Horovod executor's
all-reduce run in a 2-rank in-process world under ``sys.setprofile``, which sees every Python function
call and return on the thread that installed it.

Definitions, as the test applies them:

* A *unit* is the module of a function in ringlet, except that the executor's package
  ``ringlet.algorithms`` (schedules, plan compiler, executor: the chain's "execute" station) and the
  transport package ``ringlet.transport`` (the bottom station: a transport's base class calls the
  concrete transport's methods) count as one unit each. Frames outside ringlet (torch, the standard
  library, the test) are left out.
* A *call path* is the sequence of units of the ringlet frames on the stack when a function is entered,
  outermost first, with consecutive repeats merged (a function calling another of its own unit stays
  one entry).
* The path reads top to bottom when **no call path names a unit twice**: once the chain has gone from
  unit A down into unit B, nothing below B calls into A again (a callback upward is a return to a
  module the chain had already left), and when the **units' call graph** (an edge A -> B for every call
  into a frame of unit B whose nearest ringlet frame below it on the stack is of unit A != B) **has no
  cycle**: one order of the units exists in
  which every call goes down, so no unit calls into one that, somewhere in the same all-reduce, calls
  back into it.
"""
from __future__ import annotations

import sys

import pytest
import torch
from conftest import P2P_SMALL, run_world

import ringlet
from ringlet.transport.inproc import InprocTransport
from ringlet.types import ReduceOp

_STATIONS = ("ringlet.algorithms", "ringlet.transport")
_API = ("ringlet.collectives", "ringlet.runtime", "ringlet.engine.requests", "ringlet.engine.allreduce")


def _unit(module: str) -> str | None:
    if not module.startswith("ringlet"):
        return None
    for station in _STATIONS:
        if module == station or module.startswith(station + "."):
            return station
    return module


class _Recorder:
    """Call paths and the units' call graph of everything run under :meth:`run` on this thread."""

    def __init__(self):
        self.stack: list[str | None] = []  # the unit of every frame entered under the profiler (None: not ringlet)
        self.repeats: list[tuple[str, ...]] = []  # call paths that name a unit twice
        self.edges: set[tuple[str, str]] = set()
        self.paths: set[tuple[str, ...]] = set()  # every call path, repeats merged

    def _profile(self, frame, event, arg) -> None:
        if event == "call":
            unit = _unit(frame.f_globals.get("__name__", ""))
            if unit is not None:
                above = [u for u in self.stack if u is not None]
                if above and above[-1] != unit:
                    self.edges.add((above[-1], unit))
                path = _merged(above + [unit])
                self.paths.add(tuple(path))
                if len(set(path)) != len(path):
                    self.repeats.append(tuple(path))
            self.stack.append(unit)
        elif event == "return" and self.stack:
            self.stack.pop()

    def run(self, fn):
        sys.setprofile(self._profile)
        try:
            return fn()
        finally:
            sys.setprofile(None)

    def cycle(self) -> list[str] | None:
        """A cycle of the units' call graph, or None."""
        succ: dict[str, set[str]] = {}
        for a, b in self.edges:
            succ.setdefault(a, set()).add(b)
        state: dict[str, int] = {}

        def visit(u: str, path: list[str]) -> list[str] | None:
            state[u] = 1
            for v in sorted(succ.get(u, ())):
                if state.get(v) == 1:
                    return path[path.index(v):] + [v]
                if v not in state:
                    found = visit(v, path + [v])
                    if found:
                        return found
            state[u] = 2
            return None

        for u in sorted(succ):
            if u not in state:
                found = visit(u, [u])
                if found:
                    return found
        return None


def _merged(units: list[str]) -> list[str]:
    out: list[str] = []
    for u in units:
        if not out or out[-1] != u:
            out.append(u)
    return out


def _short(path) -> str:
    return " > ".join(u.removeprefix("ringlet.") for u in path)


def _record(call, p: int = 2) -> list[_Recorder]:
    """Run ``call(rank)`` once unrecorded (first-call set-up: caches, workspaces) and once recorded on
    every rank of an in-process world; return each rank's recorder."""

    def body(rank):
        call(rank)
        rec = _Recorder()
        rec.run(lambda: call(rank))
        return rec

    return run_world(p, body)


def _check(recs: list[_Recorder], expected: tuple[str, ...]) -> None:
    for rank, rec in enumerate(recs):
        assert not rec.repeats, f"rank {rank}: a unit entered twice on one call path: {_short(rec.repeats[0])}"
        cycle = rec.cycle()
        assert cycle is None, f"rank {rank}: the units' call graph has a cycle: {' -> '.join(cycle)}"
        to_transport = {path for path in rec.paths if path[-1] == "ringlet.transport"}
        assert expected in to_transport, (f"rank {rank}: no call path {_short(expected)}; the paths to the "
                                          f"transport: {sorted(_short(p) for p in to_transport)}")


def test_dense_small_allreduce_reads_top_to_bottom(monkeypatch):
    monkeypatch.setattr(InprocTransport, "capabilities", P2P_SMALL)
    recs = _record(lambda rank: ringlet.allreduce_(torch.full((8,), float(rank))))
    _check(recs, _API + ("ringlet.engine.small", "ringlet.engine._rd_inband", "ringlet.transport"))


def test_dense_large_allreduce_reads_top_to_bottom():
    recs = _record(lambda rank: ringlet.allreduce_(torch.full((1 << 16,), float(rank))))
    _check(recs, _API + ("ringlet.engine.ops", "ringlet.engine.channel", "ringlet.algorithms", "ringlet.transport"))
    for rec in recs:  # the records agreed before the schedule ran
        assert _API + ("ringlet.engine.agree", "ringlet.engine.channel", "ringlet.algorithms") in rec.paths


@pytest.mark.parametrize("compression", ["fp16", "powersgd"])
def test_compressed_allreduce_reads_top_to_bottom(compression):
    recs = _record(lambda rank: ringlet.allreduce_(torch.full((64, 32), float(rank)), compression=compression))
    via = ("ringlet.compression.powersgd",) if compression == "powersgd" else ()
    _check(recs, _API + ("ringlet.engine.compressed",) + via + ("ringlet.engine.ops", "ringlet.engine.channel",
                                                                "ringlet.algorithms", "ringlet.transport"))


def test_async_allreduce_reads_top_to_bottom_on_the_queue_worker():
    def call(rank):
        rt = ringlet.collectives.runtime()
        ringlet.allreduce_async_(torch.ones(1 << 16)).wait()  # starts the worker, warms the caches
        rec = _Recorder()
        # The queue runs jobs in order on its worker thread: the profiler is installed there around the op.
        rt.submit(lambda: sys.setprofile(rec._profile), sync=False)
        work = ringlet.allreduce_async_(torch.full((1 << 16,), float(rank)))
        rt.submit(lambda: sys.setprofile(None), sync=False).wait()
        assert torch.equal(work.wait(), torch.full((1 << 16,), 1.0))
        return rec

    recs = run_world(2, call)
    _check(recs, _API[1:] + ("ringlet.engine.ops", "ringlet.engine.channel", "ringlet.algorithms", "ringlet.transport"))


def test_horovod_executor_enters_the_engine_at_the_same_entry():
    from ringlet.torch.execute import Runner

    def call(rank):
        rt = ringlet.collectives.runtime()
        Runner(rt, 0).allreduce_flat(rt.world, torch.full((1 << 12,), float(rank)), ReduceOp.SUM, 1.0, 1.0)

    recs = _record(call)
    _check(recs, ("ringlet.torch.execute", "ringlet.engine.allreduce", "ringlet.engine.ops", "ringlet.engine.channel",
                  "ringlet.algorithms", "ringlet.transport"))
