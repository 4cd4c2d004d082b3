"""Threads that run jobs for others (the transport's wait helper, ringlet.torch's execution queue) must
not keep their last job alive while they wait for the next: the job holds a collective's buffers. Over
Gloo this kept an async collective's tensor alive until the thread's next job (the soak's Gloo run
sampled it as resident memory)."""
import gc
import weakref

from ringlet.torch.exec_queue import ExecQueue
from ringlet.transport._waiter import Waiter


class _Buffers:
    """Stands for a collective's tensors."""


def _job_holding(obj):
    def job():
        assert obj is not None
    return job


def test_the_wait_helper_lets_go_of_its_last_job():
    waiter = Waiter()
    buf = _Buffers()
    ref = weakref.ref(buf)
    waiter.wait(_job_holding(buf), lambda: None)
    del buf
    gc.collect()
    assert ref() is None


def test_the_wait_helper_lets_go_of_a_job_that_raised():
    waiter = Waiter()
    buf = _Buffers()
    ref = weakref.ref(buf)

    def job(obj=buf):
        raise ValueError("backend failed")

    try:
        waiter.wait(job, lambda: None)
    except ValueError:
        pass
    del buf, job
    gc.collect()
    assert ref() is None


def test_the_execution_queue_lets_go_of_its_last_batch():
    q = ExecQueue(on_move=lambda: None)
    q.start()
    try:
        buf = _Buffers()
        ref = weakref.ref(buf)
        q.put(_job_holding(buf))
        assert q.drain(timeout=10)
        del buf
        gc.collect()
        assert ref() is None
    finally:
        q.close(timeout=10)
