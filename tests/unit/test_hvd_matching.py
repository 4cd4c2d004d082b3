"""The coordinator's liveness contract, ranks as threads: ops match by name whatever the submission
order, a barrier never waits for ops submitted before it, duplicates raise at once, stalls are
reported, and a departed peer or a shut-down peer surfaces as an error at synchronize (no hang)."""
from __future__ import annotations

import logging
import random
import time

import pytest
import torch
from hvd_world import hvd_world

import ringlet.torch as hvd
from ringlet.torch import mpi_ops
from ringlet.transport.inproc import InprocWorld


@pytest.mark.parametrize("p", [2, 3])
def test_different_submission_orders_complete(p):
    names = [f"t{i}" for i in range(8)]

    def body(r):
        order = names[:]
        random.Random(r).shuffle(order)
        hs = {k: mpi_ops.allreduce_async(torch.full((3,), float(r + int(k[1:]))), name=k, op=hvd.Sum)
              for k in order}
        return {k: hvd.synchronize(h) for k, h in hs.items()}

    for res in hvd_world(p, body):
        for k, t in res.items():
            i = int(k[1:])
            assert torch.equal(t, torch.full((3,), float(sum(range(p)) + p * i)))


def test_x_then_barrier_vs_barrier_then_x():
    """The spec's deadlock example: rank 0 submits X then barrier, rank 1 barrier then X."""

    def body(r):
        if r == 0:
            h = mpi_ops.allreduce_async(torch.ones(4), name="X", op=hvd.Sum)
            hvd.barrier()
            return hvd.synchronize(h)
        hvd.barrier()
        return mpi_ops.allreduce(torch.ones(4), name="X", op=hvd.Sum)

    a, b = hvd_world(2, body)
    assert torch.equal(a, torch.full((4,), 2.0)) and torch.equal(b, a)


def test_op_of_some_ranks_then_barrier_does_not_block_the_others():
    """Rank 0 submits 'lonely' and enters a barrier; the other ranks only enter the barrier. Everyone
    leaves the barrier; 'lonely' stays pending on rank 0 (poll False) until the others submit it."""

    def body(r):
        h = mpi_ops.allreduce_async(torch.ones(2), name="lonely", op=hvd.Sum) if r == 0 else None
        hvd.barrier()
        pending = hvd.poll(h) if h is not None else None
        hvd.barrier()
        if r != 0:
            mpi_ops.allreduce(torch.ones(2), name="lonely", op=hvd.Sum)
            return None
        return pending, hvd.synchronize(h)

    res = hvd_world(3, body)
    assert res[0][0] is False
    assert torch.equal(res[0][1], torch.full((2,), 3.0))


def test_duplicate_pending_name_raises_at_once_and_library_keeps_working():
    def body(r):
        if r == 1:
            time.sleep(0.3)  # keep "dup" pending on rank 0 for a while
        h = mpi_ops.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
        err = None
        if r == 0:
            with pytest.raises(ValueError, match="Duplicate name 'allreduce.dup'"):
                mpi_ops.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
            err = "raised"
        out = hvd.synchronize(h)
        again = mpi_ops.allreduce(torch.ones(2), name="dup", op=hvd.Sum)  # done: the name is free again
        return err, out, again

    for r, (err, out, again) in enumerate(hvd_world(2, body)):
        assert err == ("raised" if r == 0 else None)
        assert torch.equal(out, torch.full((2,), 2.0)) and torch.equal(again, out)


def test_poll_is_false_right_after_async_on_a_sizeable_tensor():
    def body(r):
        h = hvd.allreduce_async(torch.ones(1 << 20), name="big")
        first = hvd.poll(h)
        out = hvd.synchronize(h)
        return first, bool(torch.all(out == 1.0))

    assert hvd_world(2, body) == [(False, True), (False, True)]


def test_stall_warning_names_tensor_and_missing_ranks(monkeypatch, caplog):
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "0.2")

    def body(r):
        if r == 1:
            time.sleep(1.0)
        return mpi_ops.allreduce(torch.ones(1), name="slowpoke", op=hvd.Sum)

    with caplog.at_level(logging.WARNING, logger="ringlet.torch"):
        hvd_world(3, body)
    msgs = [rec.getMessage() for rec in caplog.records if rec.name == "ringlet.torch"]
    assert any("allreduce.slowpoke" in m and "missing ranks [1]" in m for m in msgs), msgs


def test_peer_shutdown_fails_pending_ops_instead_of_hanging():
    def body(r):
        if r == 1:
            hvd.shutdown()  # leaves early; hvd_world's own shutdown is then a no-op
            return None
        time.sleep(0.2)
        with pytest.raises(hvd.HorovodInternalError, match="shut down"):
            mpi_ops.allreduce(torch.ones(2), name="late")
        return "raised"

    assert hvd_world(2, body)[0] == "raised"


def test_dead_peer_surfaces_at_synchronize():
    world = InprocWorld(3)

    def body(r):
        if r == 2:
            time.sleep(0.2)
            world.kill(2)
            return None
        h = mpi_ops.allreduce_async(torch.ones(2), name="orphan")
        with pytest.raises(hvd.HorovodInternalError):
            hvd.synchronize(h)
        # Broken until re-init: new ops fail at synchronize too, without hanging.
        with pytest.raises(hvd.HorovodInternalError):
            mpi_ops.allreduce(torch.ones(2), name="after")
        return "raised"

    assert hvd_world(3, body, world=world)[:2] == ["raised", "raised"]
