"""ringlet.torch lifecycle in one process: flags before init, ValueError before init, re-init, the
error type, op constants, process-set objects, handle bookkeeping."""
from __future__ import annotations

import pytest
import torch

import ringlet
import ringlet.torch as hvd


@pytest.fixture(autouse=True)
def _clean():
    hvd.shutdown()
    yield
    hvd.shutdown()


def test_flags_callable_before_init():
    assert not hvd.is_initialized()
    assert isinstance(hvd.nccl_built(), int)
    for fn in (hvd.mpi_built, hvd.gloo_built, hvd.cuda_built, hvd.rocm_built, hvd.ddl_built, hvd.ccl_built,
               hvd.mpi_enabled, hvd.gloo_enabled):
        assert isinstance(fn(), bool)
    with pytest.raises(ValueError):
        hvd.mpi_threads_supported()


@pytest.mark.parametrize("fn", ["size", "rank", "local_size", "local_rank", "cross_size", "cross_rank"])
def test_topology_before_init_raises(fn):
    with pytest.raises(ValueError, match="has not been initialized; use hvd.init"):
        getattr(hvd, fn)()


def test_init_twice_and_reinit_resets_handles():
    hvd.init()
    hvd.init()  # no-op
    assert (hvd.size(), hvd.rank(), hvd.local_size(), hvd.local_rank(), hvd.cross_size(), hvd.cross_rank()) == \
        (1, 0, 1, 0, 1, 0)
    h1 = hvd.allreduce_async(torch.ones(2))
    h2 = hvd.allreduce_async(torch.ones(2))
    assert (h1, h2) == (1, 2)
    hvd.synchronize(h1), hvd.synchronize(h2)
    for _ in range(3):
        hvd.shutdown()
        assert not hvd.is_initialized()
        hvd.init()
        h = hvd.allreduce_async(torch.arange(3.0), op=hvd.Sum)
        assert h == 1  # the handle counter restarts after shutdown
        assert torch.equal(hvd.synchronize(h), torch.arange(3.0))


def test_error_type_and_ops():
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert issubclass(hvd.HorovodInternalError, ringlet.RingletError)
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)


def test_unknown_handle():
    hvd.init()
    with pytest.raises(ValueError):
        hvd.poll(12345)
    with pytest.raises(ValueError):
        hvd.synchronize(12345)


def test_global_process_set():
    hvd.init()
    ps = hvd.global_process_set
    assert ps.process_set_id == 0 and ps.ranks == [0] and ps.size() == 1 and ps.rank() == 0 and ps.included()
    with pytest.raises(ValueError):
        hvd.remove_process_set(ps)
    same = hvd.add_process_set([0])  # same ranks as the global set: a set of its own
    assert same.process_set_id == 1 and same.size() == 1
    with pytest.raises(ValueError, match="already registered"):
        hvd.add_process_set(same)
    assert hvd.remove_process_set(same) and same.process_set_id is None


def test_pending_ops_fail_at_shutdown_not_hang():
    hvd.init()
    # A name nobody else... in a world of one, every op is ready at once; fail a handle by shutting
    # down first instead: the handle table is failed as a whole.
    ctx = hvd.basics.context()
    h = ctx.handles.allocate(1)
    hvd.shutdown()
    with pytest.raises(hvd.HorovodInternalError, match="shut down"):
        ctx.handles.wait(h)


def test_ops_after_shutdown_raise():
    hvd.init()
    hvd.shutdown()
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.allreduce_async(torch.ones(1))
