"""The training layer's communicator (ringlet.torch.comm.Comm): every op returns a torch future whose
value is the result and which chains with then(), on ringlet's core queue and through the Horovod
coordinator; errors reach the future; a job may run collectives of its own, async ones included."""
from __future__ import annotations

import pytest
import torch
from conftest import run_world
from hvd_world import hvd_world

import ringlet
from ringlet.torch.comm import ORDERED_QUEUE, Comm, CommFuture
from ringlet.torch.name_matched import NAME_MATCHED
from ringlet.types import MismatchError, ReduceOp


def _ops(rank: int, p: int, scheduler=ORDERED_QUEUE) -> dict:
    comm = Comm(scheduler=scheduler)
    x = torch.full((4,), float(rank + 1))
    doubled = comm.allreduce_(x, ReduceOp.SUM, "c.sum").then(lambda f: f.value() * 2)
    gathered = comm.allgather(torch.full((rank + 1, 2), float(rank)), "c.gather")
    scattered = comm.reduce_scatter(torch.ones(2 * p + 1, 3), ReduceOp.SUM, "c.rs")
    b = torch.full((3,), float(rank))
    bcast = comm.broadcast_(b, "c.bcast")
    assert isinstance(gathered, CommFuture) and isinstance(doubled, torch._C.Future)
    return {"doubled": doubled.wait(), "gathered": gathered.wait(), "scattered": scattered.wait(),
            "bcast": bcast.wait(), "x": x}


def _expect(res: list, p: int) -> None:
    total = p * (p + 1) / 2
    for rank, r in enumerate(res):
        assert torch.equal(r["x"], torch.full((4,), total))
        assert torch.equal(r["doubled"], torch.full((4,), 2 * total))
        assert torch.equal(r["gathered"], torch.cat([torch.full((q + 1, 2), float(q)) for q in range(p)]))
        rows = (2 * p + 1) // p + (1 if rank < (2 * p + 1) % p else 0)
        assert torch.equal(r["scattered"], torch.full((rows, 3), float(p)))
        assert torch.equal(r["bcast"], torch.zeros(3))


@pytest.mark.parametrize("p", [1, 2, 3])
def test_ops_on_the_core_queue(p):
    _expect(run_world(p, lambda rank: _ops(rank, p)), p)


@pytest.mark.parametrize("p", [2, 3])
def test_ops_through_the_coordinator(p):
    _expect(hvd_world(p, lambda rank: _ops(rank, p, NAME_MATCHED)), p)


@pytest.mark.parametrize("p", [2, 3])
def test_the_ordered_queue_is_the_default_also_after_hvd_init(p):
    """hvd.init() in the process changes nothing: a Comm schedules as its caller chose."""
    def fn(rank):
        assert not Comm().coordinated and Comm(scheduler=NAME_MATCHED).coordinated
        return _ops(rank, p)

    _expect(hvd_world(p, fn), p)


@pytest.mark.parametrize("p", [2, 3])
def test_a_job_runs_collectives_of_its_own_and_records_its_span(p):
    def fn(rank):
        comm = Comm()

        def job():
            # Inside a job, even asynchronous ops run in its place (queueing behind itself would never end).
            rows = comm.allgather(torch.full((1, 2), float(rank)), "j.gather").wait()
            return comm.allreduce_(rows, ReduceOp.SUM, "j.sum").wait()

        fut = comm.submit(job)
        out = fut.wait()
        return out, fut.span()

    for out, span in run_world(p, fn):
        assert torch.equal(out, p * torch.arange(p, dtype=torch.float32).repeat_interleave(2).view(p, 2))
        assert span is not None and span[1] >= span[0]


@pytest.mark.parametrize("p", [2, 3])
def test_errors_reach_the_future_and_the_next_op_works(p):
    def fn(rank):
        comm = Comm()
        bad = comm.allreduce_(torch.ones(3 if rank == 0 else 4), ReduceOp.SUM, "bad")
        chained = bad.then(lambda f: f.value() + 1)
        errors = []
        for f in (bad, chained):
            try:
                f.wait()
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                errors.append(exc)
        ok = comm.allreduce_(torch.ones(2), ReduceOp.SUM, "ok").wait()
        return errors, ok

    for errors, ok in run_world(p, fn):
        assert len(errors) == 2 and isinstance(errors[0], MismatchError), errors
        assert torch.equal(ok, torch.full((2,), float(p)))


def test_comm_needs_ringlet():
    with pytest.raises(ValueError, match="not been initialized"):
        Comm()
