"""The transports' count of the bytes they moved (``Transport.wire``, ``ringlet.wire_bytes()``)."""
from __future__ import annotations

import torch
from conftest import run_world
from test_shm_transport import shm_world

import ringlet
from ringlet.tuning.select import Selector
from ringlet.compression import FP16
from ringlet.engine import ops
from ringlet.engine.channel import Channel
from ringlet.engine.compressed import compressed_allreduce_
from ringlet.transport import WireCount
from ringlet.transport.inproc import InprocWorld
from ringlet.transport.shm import ShmOptions
from ringlet.types import ReduceOp, reduction


def test_counts_sends_and_receives_of_a_schedule_exactly():
    p, n = 4, 1 << 16

    def body(tr):
        ch = Channel.world(tr, 0, timeout=30, selector=Selector())
        t0 = tr.wire.snapshot()
        ops.allreduce_(ch, torch.ones(n), reduction(ReduceOp.SUM), "ring")
        t1 = tr.wire.snapshot()
        ch = Channel.world(tr, 1 << 16, timeout=30, selector=Selector())
        compressed_allreduce_(ch, torch.ones(n), FP16, {}, True)
        return t1 - t0, tr.wire.snapshot() - t1

    for plain, half in InprocWorld(p).run(body):
        ring_bytes = 2 * (p - 1) * (n // p) * 4  # reduce-scatter + all-gather, n/p floats per step
        assert plain.sent == plain.received == ring_bytes
        assert plain.messages_sent == 2 * (p - 1)  # one segment per step at this size
        assert half.sent == half.received == ring_bytes // 2  # all-to-all + all-gather of float16 payloads
        assert plain.native == half.native == 0


def test_snapshots_subtract():
    a, b = WireCount(10, 20, 1, 2, 5), WireCount(4, 5, 1, 1, 0)
    assert a - b == WireCount(6, 15, 0, 1, 5)


def test_ringlet_wire_bytes_reads_the_runtimes_transport():
    def fn(rank):
        before = ringlet.wire_bytes()
        ringlet.allreduce(torch.ones(1000), algorithm="ring")
        return ringlet.wire_bytes() - before

    for delta in run_world(2, fn):
        # The data (ring: half the vector each way, twice) and the metadata check.
        assert delta.sent >= 4000 and delta.received >= 4000 and delta.messages_sent >= 2


def test_shm_counts_its_mailbox_rounds_and_its_rings():
    p = 3

    def fn(tr):
        t0 = tr.wire.snapshot()
        seq = tr.small_round(b"abcd", torch.ones(10), 20)
        t1 = tr.wire.snapshot()
        ch = Channel.world(tr, 0, timeout=20, selector=Selector())
        ops.allreduce_(ch, torch.ones(3000), reduction(ReduceOp.SUM), "ring")
        return seq, t1 - t0, tr.wire.snapshot() - t1

    for seq, box, ring in shm_world(p, fn, ShmOptions()):
        assert box.sent == box.received == (p - 1) * (4 + 40) and box.messages_sent == p - 1
        assert ring.sent == ring.received == 2 * (p - 1) * 1000 * 4
