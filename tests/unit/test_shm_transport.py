"""The shared-memory transport alone, with its ranks as threads of one process (the segments, rings,
doorbells and even CMA work the same within one process). Real processes: tests/multiproc."""
from __future__ import annotations

import os
import threading

import pytest
import torch
from torch.distributed import HashStore

import ringlet
from ringlet.runtime import Runtime
from ringlet.transport.shm import ShmOptions, ShmTransport
from ringlet.types import CollectiveTimeout, Options, PeerError

pytestmark = pytest.mark.skipif(not ShmTransport.available(), reason="needs Linux x86 with /dev/shm")

SMALL_RING = 64 << 10  # every message above this streams through the ring in pieces
MODES = {
    "eager": ShmOptions(ring_bytes=SMALL_RING, cma=False),
    "cma": ShmOptions(ring_bytes=SMALL_RING, cma=True, cma_min_bytes=4096),
}


def shm_world(p: int, fn, options: ShmOptions, timeout: float = 60.0) -> list:
    """Build ``p`` transports over one store (one thread each), run ``fn(tr)`` per rank, close them."""
    store = HashStore()
    trs: list = [None] * p
    results: list = [None] * p
    errors: list = [None] * p

    def build(r):
        try:
            trs[r] = ShmTransport(r, p, store, timeout=20, options=options)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[r] = exc

    def body(r):
        try:
            results[r] = fn(trs[r])
        except BaseException as exc:  # noqa: BLE001
            errors[r] = exc

    for target in (build, body):
        threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(p)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in threads), "shm world hung"
        if target is build and any(e is not None for e in errors):
            break
    paths = [tr._path for tr in trs if tr is not None]
    for tr in trs:
        if tr is not None:
            tr.close()
    for e in errors:
        if e is not None:
            raise e
    assert not [p for p in paths if os.path.exists(p)], "segments left in /dev/shm"
    return results


def payload(src: int, dst: int, k: int, n: int, dtype=torch.float32) -> torch.Tensor:
    return ((torch.arange(n, dtype=torch.int64) * 7 + src * 1000 + dst * 100 + k) % 251).to(dtype)


SIZES = (0, 1, 3, 64, 1000, 4096, SMALL_RING - 64, SMALL_RING + 1, 300_001)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("p", [2, 3, 4])
def test_all_pairs_many_sizes_interleaved_tags(p, mode):
    """Every rank sends every size to every peer on three interleaved tags; receives are posted in a
    different order (by tag, newest size first) and some only after sends are out, so both the
    matched and the unexpected paths run, including messages larger than a ring."""
    dtypes = (torch.float32, torch.int16, torch.float64, torch.uint8)

    def fn(tr):
        me = tr.rank
        sends = []
        for q in range(p):
            if q != me:
                for k, n in enumerate(SIZES):
                    sends.append(tr.isend(payload(me, q, k, n, dtypes[k % 4]), q, k % 3))
        recvs = []
        for tag in (2, 0, 1):
            for q in reversed(range(p)):
                if q != me:
                    for k, n in enumerate(SIZES):
                        if k % 3 == tag:
                            buf = torch.empty(n, dtype=dtypes[k % 4])
                            recvs.append((buf, payload(q, me, k, n, dtypes[k % 4]), tr.irecv(buf, q, tag)))
        bad = []
        for buf, want, h in recvs:
            h.wait(30)
            if not torch.equal(buf, want):
                bad.append(want.numel())
        for h in sends:
            h.wait(30)
        return bad

    assert shm_world(p, fn, MODES[mode]) == [[]] * p


@pytest.mark.parametrize("mode", sorted(MODES))
def test_fifo_per_source_destination_tag(mode):
    """Messages of one (src, dst, tag) match receives in posting order, whatever the sizes and the tags
    interleaved between them."""
    count = 12

    def fn(tr):
        other = 1 - tr.rank
        hs = [tr.isend(torch.full((100 + 9000 * (i % 3),), float(i)), other, i % 2) for i in range(count)]
        got = []
        for tag in (1, 0):
            for i in range(count):
                if i % 2 == tag:
                    buf = torch.empty(100 + 9000 * (i % 3))
                    got.append((i, buf, tr.irecv(buf, other, tag)))
        for _, _, h in got:
            h.wait(30)
        for h in hs:
            h.wait(30)
        return sorted(i for i, buf, _ in got if torch.equal(buf, torch.full_like(buf, float(i))))

    assert shm_world(2, fn, MODES[mode]) == [list(range(count))] * 2


@pytest.mark.parametrize("mode", sorted(MODES))
def test_both_peers_send_big_messages_at_once(mode):
    """Each side posts a send far larger than its ring before its receive: progress made while waiting
    on the receive pushes the send, so neither blocks the other."""
    n = 3_000_000

    def fn(tr):
        other = 1 - tr.rank
        out = payload(tr.rank, other, 0, n)
        s = tr.isend(out, other, 5)
        buf = torch.empty(n)
        tr.irecv(buf, other, 5).wait(30)
        s.wait(30)
        return torch.equal(buf, payload(other, tr.rank, 0, n))

    assert shm_world(2, fn, MODES[mode]) == [True, True]


def test_size_mismatch_raises_on_the_receiver():
    def fn(tr):
        if tr.rank == 0:
            tr.isend(torch.ones(10), 1, 3).wait(10)
            tr.isend(torch.ones(2), 1, 4).wait(10)
            return "sent"
        with pytest.raises(PeerError, match="40 bytes"):
            tr.irecv(torch.empty(11), 0, 3).wait(10)
        buf = torch.empty(2)
        tr.irecv(buf, 0, 4).wait(10)  # the stream stays usable after the mismatch
        return torch.equal(buf, torch.ones(2))

    assert shm_world(2, fn, MODES["eager"]) == ["sent", True]


def test_timeout_names_the_peer():
    def fn(tr):
        if tr.rank == 1:
            with pytest.raises(CollectiveTimeout, match="from rank 0"):
                tr.irecv(torch.empty(4), 0, 9).wait(0.2)
        return True

    assert shm_world(2, fn, MODES["eager"]) == [True, True]


def test_peer_that_closes_fails_pending_receives():
    closed = threading.Event()

    def fn(tr):
        if tr.rank == 0:
            tr.close()
            closed.set()
            with pytest.raises(PeerError, match="closed"):
                tr.isend(torch.ones(1), 1, 0)
            return True
        closed.wait(10)
        with pytest.raises(PeerError, match="rank 0 closed"):
            tr.irecv(torch.empty(4), 0, 0).wait(10)
        return True

    assert shm_world(2, fn, MODES["eager"]) == [True, True]


def test_self_messages_and_lone_rank():
    tr = ShmTransport(0, 1)
    try:
        h = tr.irecv(buf := torch.empty(3, dtype=torch.int64), 0, 1)
        assert not h.done()
        tr.isend(torch.tensor([1, 2, 3]), 0, 1).wait()
        h.wait(1)
        assert torch.equal(buf, torch.tensor([1, 2, 3]))
        with pytest.raises(CollectiveTimeout):
            tr.irecv(torch.empty(1), 0, 2).wait(0.05)
    finally:
        tr.close()


def test_lone_rank_runs_collectives():
    rt = Runtime(ShmTransport(0, 1), Options(timeout=10))
    with ringlet.use_runtime(rt):
        try:
            t = torch.arange(6.0)
            assert torch.equal(ringlet.allreduce(t, op="sum", algorithm="ring"), t)
        finally:
            rt.close()


def test_runtime_collectives_over_threads():
    p = 3

    def fn(tr):
        rt = Runtime(tr, Options(timeout=20))
        with ringlet.use_runtime(rt):
            t = torch.arange(100_000, dtype=torch.float32) % 13 + tr.rank
            out = ringlet.allreduce(t, op="sum", algorithm="ring")
            want = (torch.arange(100_000, dtype=torch.float32) % 13) * p + sum(range(p))
            return torch.equal(out, want)

    assert shm_world(p, fn, ShmOptions(ring_bytes=SMALL_RING, cma_min_bytes=4096)) == [True] * p


@pytest.mark.parametrize("bad, err", [
    (torch.ones(4, 4), ValueError),
    (torch.ones(8)[::2], ValueError),
])
def test_bad_buffers_are_refused(bad, err):
    tr = ShmTransport(0, 1)
    try:
        with pytest.raises(err):
            tr.isend(bad, 0, 0)
        with pytest.raises(ValueError, match="outside"):
            tr.irecv(torch.ones(1), 1, 0)
    finally:
        tr.close()


def test_ranks_on_other_hosts_are_refused():
    store = HashStore()
    store.set("info/1", '{"path": "/dev/shm/none", "pid": 1, "start": 0, "host": "elsewhere", "boot": "x", '
                        '"probe": 0, "probe_value": 0}')
    with pytest.raises(ValueError, match="one host"):
        ShmTransport(0, 2, store, timeout=5, options=MODES["eager"])


def test_from_env_refuses_multi_host_jobs(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="one host"):
        ShmTransport.from_env()


def test_from_env_lone_process(monkeypatch):
    for k in ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    tr = ShmTransport.from_env()
    assert (tr.rank, tr.size, tr.name) == (0, 1, "shm")
    tr.close()


@pytest.mark.parametrize("p, cap", [(2, 4 << 20), (8, 4 << 20), (16, 1 << 20), (64, 64 << 10)])
def test_ring_capacity_shrinks_with_the_world(p, cap):
    assert ShmOptions().capacity(p) == cap
    assert ShmOptions(ring_bytes=5000).capacity(p) == 8192
