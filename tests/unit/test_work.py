"""The collective handle (:class:`ringlet.runtime.Work`): results and errors through ``wait()``, waiters
on other threads, callbacks before and after completion, and a timeout while it still runs."""
from __future__ import annotations

import threading

import pytest

from ringlet.runtime import Work


def test_a_finished_work_returns_its_result_and_runs_late_callbacks_at_once():
    w = Work()
    w._run(lambda: 42)
    seen = []
    w.add_done_callback(lambda work: seen.append(work.wait()))
    assert w.done() and w.wait() == 42 and seen == [42]
    assert w.span is not None and w.span[0] <= w.span[1]


def test_an_error_is_raised_by_every_wait():
    w = Work()
    w._run(lambda: (_ for _ in ()).throw(ValueError("boom")))
    for _ in range(2):
        with pytest.raises(ValueError, match="boom"):
            w.wait()


def test_waiters_on_other_threads_wake_when_it_finishes():
    w = Work()
    with pytest.raises(TimeoutError):
        w.wait(timeout=0.01)
    early, results = [], []
    w.add_done_callback(lambda work: early.append(work.wait()))
    waiters = [threading.Thread(target=lambda: results.append(w.wait(timeout=30))) for _ in range(3)]
    for t in waiters:
        t.start()
    assert not w.done()
    finisher = threading.Thread(target=lambda: w._run(lambda: "done"))
    finisher.start()
    for t in waiters + [finisher]:
        t.join(30)
    assert results == ["done"] * 3 and early == ["done"]
