"""The MPI transport's request polling stops when the liveness monitor aborts the transport: the wait
raises the abort's PeerError (naming the silent rank) instead of running into the collective timeout.
No MPI library is started: the poll loop is driven with stand-in requests."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from ringlet.transport import mpi as mpi_module
from ringlet.types import CollectiveTimeout, PeerError


class _MPIError(Exception):
    pass


@pytest.fixture(autouse=True)
def no_mpi(monkeypatch):
    monkeypatch.setattr(mpi_module, "_MPI", SimpleNamespace(Exception=_MPIError))


class _Owner:
    def __init__(self):
        self.aborted = None

    def aborted_error(self):
        return PeerError(str(self.aborted))


def test_an_abort_ends_a_wait_with_its_error():
    owner = _Owner()
    timer = threading.Timer(0.05, lambda: setattr(owner, "aborted", PeerError("rank 3 (host b) went silent")))
    timer.start()
    try:
        with pytest.raises(PeerError, match="rank 3"):
            mpi_module._wait_until(lambda: False, 60.0, lambda: "rank 0: receive", owner)
    finally:
        timer.cancel()


def test_without_an_abort_the_wait_times_out_or_completes():
    with pytest.raises(CollectiveTimeout, match="rank 0: receive timed out"):
        mpi_module._wait_until(lambda: False, 0.05, lambda: "rank 0: receive", _Owner())
    polls = iter([False] * 50 + [True])
    mpi_module._wait_until(lambda: next(polls), 60.0, lambda: "rank 0: receive", _Owner())
