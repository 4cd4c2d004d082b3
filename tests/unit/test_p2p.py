"""``ringlet.isend``/``irecv``/``send``/``recv`` in-process: exchanges in posting order per tag, beside a
queued all-reduce (posted from the caller's thread, never behind the communication thread), the
timeout naming the peer, and the argument errors."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import run_world

import ringlet
from ringlet.transport.inproc import InprocTransport
from ringlet.types import CollectiveTimeout, Options


def test_ring_exchange_by_tags_in_posting_order():
    def body(rank):
        right, left = (rank + 1) % 3, (rank - 1) % 3
        sends = [ringlet.isend(torch.full((4, 2), 10.0 * rank + i), right, tag=i % 2) for i in range(4)]
        got = [torch.empty(4, 2) for _ in range(4)]
        # tag 1 first: messages of one tag are matched in posting order whatever the other tag does
        recvs = [ringlet.irecv(got[i], left, tag=1) for i in (1, 3)] + [ringlet.irecv(got[i], left, tag=0)
                                                                       for i in (0, 2)]
        for w in sends + recvs:
            w.wait()
        assert all(w.done() for w in recvs)
        return [g[0, 0].item() for g in got]

    for rank, vals in enumerate(run_world(3, body)):
        left = (rank - 1) % 3
        assert vals == [10.0 * left + i for i in range(4)]


def test_blocking_send_recv_with_a_group_and_dtypes():
    def body(rank):
        g = ringlet.new_group([1, 2])
        if rank == 0:
            return None
        peer = 3 - rank
        if rank == 1:
            ringlet.send(torch.arange(6, dtype=torch.int64).reshape(2, 3), peer, tag=7, group=g)
            return ringlet.recv(torch.empty(3, dtype=torch.float16), peer, tag=7, group=g).tolist()
        got = ringlet.recv(torch.empty(2, 3, dtype=torch.int64), peer, tag=7, group=g)
        ringlet.send(torch.tensor([1.5, 2.5, 3.5], dtype=torch.float16), peer, tag=7, group=g)
        return got.tolist()

    res = run_world(3, body)
    assert res[1] == [1.5, 2.5, 3.5] and res[2] == [[0, 1, 2], [3, 4, 5]]


def test_p2p_passes_an_allreduce_still_queued_on_the_communication_thread():
    """Rank 1 holds the communication thread of rank 0 busy (rank 0's all-reduce waits for rank 1's, which
    comes only after the point-to-point round trip): the exchange completes anyway."""
    def body(rank):
        t = torch.full((1000,), float(rank + 1))
        if rank == 0:
            work = ringlet.allreduce_async_(t, op="sum")
            ringlet.send(torch.tensor([1.0]), 1, tag=3)
            back = ringlet.recv(torch.empty(1), 1, tag=4)
            work.wait()
            return back.item(), t[0].item()
        got = ringlet.recv(torch.empty(1), 0, tag=3)
        ringlet.send(got + 1, 0, tag=4)
        ringlet.allreduce_(t, op="sum")
        return got.item(), t[0].item()

    assert run_world(2, body) == [(2.0, 3.0), (1.0, 3.0)]


def test_wait_times_out_naming_peer_and_tag_and_a_short_wait_leaves_it_running():
    def body(rank):
        if rank == 1:
            return None
        w = ringlet.irecv(torch.empty(2), 1, tag=5)
        with pytest.raises(TimeoutError, match="still running"):
            w.wait(timeout=0.01)
        assert not w.done()
        with pytest.raises(CollectiveTimeout, match=r"receive from rank 1 \(tag 5\)"):
            w.wait()
        return True

    assert run_world(2, body, options=Options(timeout=0.3))[0] is True


def test_argument_errors():
    def body(rank):
        t = torch.zeros(4)
        g = ringlet.new_group([0, 1])
        cases = [((t, 0), "this rank"), ((t, 5), "not a member"), ((t, 2, 0, g), "not a member"),
                 ((t, 1, -1), "tag must be"), ((t, 1, 1 << 24), "tag must be"), ((t, 1, True), "tag must be"),
                 ((t, 1.0), "must be an int"), ((torch.zeros(4, 4).t(), 1), "contiguous")]
        for args, msg in cases:
            for fn in (ringlet.isend, ringlet.irecv):
                with pytest.raises(ValueError, match=msg):
                    fn(*args)
        return True

    def first(rank):
        return body(rank) if rank == 0 else ringlet.new_group([0, 1]) and True

    assert run_world(3, first) == [True, True, True]


def test_a_transport_without_threaded_posts_refuses(monkeypatch):
    caps = dataclasses.replace(InprocTransport.capabilities, threaded_posts=False)
    monkeypatch.setattr(InprocTransport, "capabilities", caps)

    def body(rank):
        with pytest.raises(RuntimeError, match="threaded_posts"):
            ringlet.isend(torch.zeros(1), 1 - rank)
        return True

    assert run_world(2, body) == [True, True]


def test_group_slots_leave_the_last_one_to_p2p():
    from ringlet.engine.channel import P2P_SLOT
    from ringlet.runtime import MAX_GROUPS

    assert MAX_GROUPS == P2P_SLOT == 31
