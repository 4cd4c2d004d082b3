"""The coordinator's parts: cache positions, this rank's bit vector, the execution queue, shutdown
draining agreed ops, a failure on the execution thread (one rank or all) reaching every rank as
``HorovodInternalError``, the stall warning for a cached name (ranks as threads). The bit-vector path
and the overlap of execution with negotiation are cases of ``tests/workers/hvd_cases_coord.py``
(threads: test_hvd_cases_inproc.py; processes: test_hvd_ops.py)."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import torch
from hvd_world import hvd_world

import ringlet.torch as hvd
from ringlet.torch import mpi_ops
from ringlet.torch import requests as rq
from ringlet.torch.basics import context
from ringlet.torch.cachebits import CachedRequests
from ringlet.torch.exec_queue import ExecQueue
from ringlet.torch.requests import Cache, Meta, Request
from ringlet.types import Options

F32 = rq.DTYPE_CODE[torch.float32]


def _meta(name: str, n: int = 3, ps_id: int = 0) -> Meta:
    return Meta(name, rq.ALLREDUCE, ps_id, F32, (n,))


def _req(meta: Meta) -> Request:
    r = Request(meta, None, None, 1, 0)
    r.wire = meta.encode()
    return r


def test_cache_positions_are_stable_and_reused_after_eviction():
    cache = Cache(capacity=2)
    a, b, c = _meta("a"), _meta("b"), _meta("c")
    assert cache.record(a, a.encode()) == (0, None)
    assert cache.record(b, b.encode()) == (1, None)
    a4 = _meta("a", 4)
    assert cache.record(a4, a4.encode()) == (0, None)  # a re-recorded name keeps its position
    assert cache.lookup("a", a.encode()) is None and cache.lookup("a", a4.encode()) == 0
    assert cache.record(c, c.encode()) == (1, 1)  # full: b (least recently recorded) gives up position 1
    assert cache.lookup("b", b.encode()) is None and cache.get(1) == (c.encode(), c)
    assert cache.span == 2 and len(cache) == 2


class _Sets:
    """Process sets stand-in: set 0 is ranks {0, 1}, set 5 is rank {1} only."""

    def group(self, ps_id):
        class G:
            ranks = (0, 1) if ps_id == 0 else (1,)

            def __contains__(self, r):
                return r in self.ranks

        return G()


def test_bit_vector_of_one_rank():
    cr = CachedRequests(0, _Sets(), capacity=8)
    mine, other = _meta("x"), _meta("y", ps_id=5)
    assert cr.record(mine, mine.encode()) is None and cr.record(other, other.encode()) is None
    assert cr.place(_req(_meta("x", 9)), 0.0) is False  # another record of a cached name: not a bit
    assert cr.place(_req(mine), 0.0) is True
    v = cr.vector(quiet=True, accept=False)
    # quiet, accept, x (waiting here), y (a set rank 0 is not in: always set)
    assert v.tolist() == [True, False, True, True]
    out = cr.agreed(np.array([0, 1]))  # y too (every rank records the same responses); execution skips it
    assert [key for key, _, _ in out] == [(0, "x"), (5, "y")] and out[0][1].metas == {0: mine, 1: mine}
    assert not cr.waiting
    with pytest.raises(RuntimeError, match="not submitted"):
        cr.agreed(np.array([0]))  # agreed again although nothing waits here


def test_exec_queue_runs_in_order_and_stops_at_the_first_failure():
    wake = threading.Event()
    q = ExecQueue(wake.set)
    q.start()
    ran = []
    q.put(lambda: ran.append(1))
    q.put(lambda: 1 / 0)
    q.put(lambda: ran.append(3))
    assert q.drain(timeout=30)
    assert ran == [1] and isinstance(q.error, ZeroDivisionError) and wake.is_set()
    q.put(lambda: ran.append(4))  # dropped after a failure
    q.close(timeout=30)
    assert ran == [1] and not q.busy()


def _inject(ranks, name: str):
    """Make the execution thread of ``ranks`` fail on the all-reduce ``name``."""
    coord = context().coordinator
    real = coord.runner.allreduce
    me = hvd.rank()

    def allreduce(g, items):
        if me in ranks and any(m.name == name for m, _ in items):
            raise RuntimeError("injected failure")
        return real(g, items)

    coord.runner.allreduce = allreduce


@pytest.mark.parametrize("failing", [(0, 1, 2), (0,)])
def test_execution_failure_fails_every_rank_without_hanging(failing):
    def body(r):
        _inject(failing, "allreduce.boom")
        with pytest.raises(hvd.HorovodInternalError) as info:
            mpi_ops.allreduce(torch.ones(4), name="boom", op=hvd.Sum)
        with pytest.raises(hvd.HorovodInternalError):
            mpi_ops.allreduce(torch.ones(2), name="after")  # stopped until re-init
        return str(info.value)

    msgs = hvd_world(3, body, options=Options(timeout=5))
    if failing == (0,):
        assert "injected failure" in msgs[0], msgs[0]
        assert all("failed on rank(s) [0]" in m for m in msgs[1:]), msgs
    else:  # a rank whose own batch had not run yet when a peer's failure arrived reports the peer's
        assert all("injected failure" in m or "failed on rank(s)" in m for m in msgs), msgs


def test_stall_warning_for_a_cached_name(monkeypatch, caplog):
    """A cached name waits as a bit; after half the stall time it moves to the table, where rank 0's
    stall check names it and the rank that did not submit it."""
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "0.2")

    def body(r):
        mpi_ops.allreduce(torch.ones(1), name="cached_slowpoke", op=hvd.Sum)  # now cached everywhere
        if r == 1:
            time.sleep(1.5)
        return mpi_ops.allreduce(torch.ones(1), name="cached_slowpoke", op=hvd.Sum)

    with caplog.at_level(logging.WARNING, logger="ringlet.torch"):
        outs = hvd_world(3, body)
    assert all(torch.equal(o, torch.full((1,), 3.0)) for o in outs)
    msgs = [rec.getMessage() for rec in caplog.records if rec.name == "ringlet.torch"]
    assert any("allreduce.cached_slowpoke" in m and "missing ranks [1]" in m for m in msgs), msgs


def _hold_allreduces(coord) -> tuple[threading.Event, threading.Event]:
    """Make the coordinator's all-reduces wait: ``started`` is set when one begins, which then waits for
    ``release`` (at most 30 s)."""
    started, release = threading.Event(), threading.Event()
    real = coord.runner.allreduce

    def allreduce(g, items):
        started.set()
        release.wait(30)
        return real(g, items)

    coord.runner.allreduce = allreduce
    return started, release


def test_shutdown_drains_agreed_ops():
    """An op agreed and running when shutdown() is called completes with its result, on every rank."""

    def body(r):
        ctx = context()
        coord = ctx.coordinator
        started, release = _hold_allreduces(coord)
        h = mpi_ops.allreduce_async(torch.ones(3), name="drained", op=hvd.Sum)
        assert started.wait(30)
        threading.Timer(0.2, release.set).start()  # lets the op go on once shutdown() is under way
        hvd.shutdown()
        return ctx.handles.wait(h)

    for out in hvd_world(2, body):
        assert torch.equal(out, torch.full((3,), 2.0))


def test_one_rank_survives_a_lost_wake_from_the_execution_thread():
    """On one rank the coordinator sleeps until woken; the execution thread's wake after it takes a batch
    may read no held ops (a stale read). Here every such wake is lost: held ops still go out."""
    hvd.init()
    ctx = context()
    coord = ctx.coordinator
    coord._exec._on_move = lambda: None
    started, release = _hold_allreduces(coord)
    try:
        h1 = mpi_ops.allreduce_async(torch.ones(3), name="running", op=hvd.Sum)
        assert started.wait(30)
        h2 = mpi_ops.allreduce_async(torch.ones(3), name="queued", op=hvd.Sum)
        deadline = time.monotonic() + 30
        while not coord._exec.waiting() and time.monotonic() < deadline:
            time.sleep(0.005)
        h3 = mpi_ops.allreduce_async(torch.ones(3), name="held", op=hvd.Sum)
        while not coord._held and time.monotonic() < deadline:
            time.sleep(0.005)
        assert coord._exec.waiting() and coord._held
        release.set()
        done = threading.Event()
        threading.Thread(target=lambda: (ctx.handles.wait(h3), done.set()), daemon=True).start()
        assert done.wait(10), "a held op waited for a wake that was lost"
        for h in (h1, h2):
            assert torch.equal(ctx.handles.wait(h), torch.ones(3))
    finally:
        release.set()
        hvd.shutdown()


@pytest.mark.parametrize("capacity", ["3", "0"])
def test_small_or_no_cache_with_a_process_set(monkeypatch, capacity):
    """Cache of 3: w0, w1 (world) and s (set {0, 2}) fill it and are agreed by their bits; then a new name
    x evicts the least recently used entry, which must be the same on rank 1 (not in the set) as on
    the members, or the positions of x and s would differ between ranks. Capacity 0: no cache."""
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", capacity)
    plan = [["w0", "w1", "s"]] * 3 + [["x"]] + [["w0", "w1", "x", "s"]] * 3

    def body(r):
        sub = hvd.add_process_set([0, 2])
        outs = []
        for names in plan:
            hs = [mpi_ops.allreduce_async(torch.full((2,), float(r)), name=k, op=hvd.Sum,
                                          process_set=sub if k == "s" else hvd.global_process_set)
                  for k in names if k != "s" or r != 1]
            outs.append([hvd.synchronize(h).tolist() for h in hs])
        hvd.remove_process_set(sub)
        return outs, dict(context().coordinator.stats)

    for r, (outs, stats) in enumerate(hvd_world(3, body)):
        for names, got in zip(plan, outs):
            assert got == [[2.0, 2.0] if k == "s" else [3.0, 3.0] for k in names if k != "s" or r != 1]
        assert (stats["cached_ops"] > 0) == (capacity != "0")


def test_a_waiting_bit_leaves_when_its_position_gets_another_record():
    cr = CachedRequests(0, _Sets(), capacity=1)
    x, y = _meta("x"), _meta("y")
    cr.record(x, x.encode())
    rx = _req(x)
    assert cr.place(rx, 0.0)
    assert cr.record(x, x.encode()) is None  # the same record again: the request keeps waiting
    assert cr.record(y, y.encode()) is rx and not cr.waiting  # y evicts x: the request must go in full
