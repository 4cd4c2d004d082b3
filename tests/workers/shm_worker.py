"""One rank of a shared-memory transport test: ``python shm_worker.py SCENARIO RANK SIZE STORE_FILE``.

Bootstraps a :class:`ShmTransport` through a ``FileStore`` and prints one JSON line with its results.
Scenarios are plain functions below; ``test_shm_transport.py`` launches them and checks the lines.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch.distributed import FileStore

from ringlet.transport.shm import ShmTransport
from ringlet.types import CollectiveTimeout, PeerError

SIZES = (0, 1, 5, 64, 4097, 65_536, 65_600, 1_000_003, 3_000_000)


def payload(src: int, dst: int, k: int, n: int, dtype=torch.float32) -> torch.Tensor:
    return ((torch.arange(n, dtype=torch.int64) * 3 + src * 1000 + dst * 100 + k) % 251).to(dtype)


def exchange(tr: ShmTransport) -> dict:
    """All pairs, every size (0 to > ring capacity) on interleaved tags, receives posted late and out of
    order; then every pair sends big messages to each other at once."""
    me, p = tr.rank, tr.size
    dtypes = (torch.float32, torch.int64, torch.float16, torch.int8)
    sends = [tr.isend(payload(me, q, k, n, dtypes[k % 4]), q, k % 2)
             for q in range(p) if q != me for k, n in enumerate(SIZES)]
    recvs = []
    for tag in (1, 0):
        for q in reversed(range(p)):
            if q != me:
                for k, n in enumerate(SIZES):
                    if k % 2 == tag:
                        buf = torch.empty(n, dtype=dtypes[k % 4])
                        recvs.append((buf, payload(q, me, k, n, dtypes[k % 4]), tr.irecv(buf, q, tag)))
    bad = []
    for buf, want, h in recvs:
        h.wait(60)
        if not torch.equal(buf, want):
            bad.append(want.numel())
    for h in sends:
        h.wait(60)
    # Everybody sends 12 MB to everybody simultaneously, then receives.
    n = 3_000_000
    big = [tr.isend(payload(me, q, 99, n), q, 7) for q in range(p) if q != me]
    for q in range(p):
        if q != me:
            buf = torch.empty(n)
            tr.irecv(buf, q, 7).wait(60)
            if not torch.equal(buf, payload(q, me, 99, n)):
                bad.append(("big", q))
    for h in big:
        h.wait(60)
    return {"bad": bad}


def fifo(tr: ShmTransport) -> dict:
    """Rank 0 sends 40 messages per tag to every peer; peers check they arrive in posting order."""
    count = 40
    if tr.rank == 0:
        hs = [tr.isend(torch.full((1 + 50_000 * (i % 3),), float(i)), q, i % 2)
              for i in range(count) for q in range(1, tr.size)]
        for h in hs:
            h.wait(60)
        return {"order": []}
    got = []
    for i in range(count):
        buf = torch.empty(1 + 50_000 * (i % 3))
        h = tr.irecv(buf, 0, i % 2)
        got.append((buf, h))
    order = []
    for buf, h in got:
        h.wait(60)
        order.append(int(buf[0]) if torch.all(buf == buf[0]) else -1)
    return {"order": order}


def allreduce(tr: ShmTransport) -> dict:
    """The public API on top: ring and automatic all-reduce, exact integer data."""
    import ringlet
    from ringlet.runtime import Runtime
    from ringlet.types import Options

    rt = Runtime(tr, Options(timeout=60))
    ok = []
    with ringlet.use_runtime(rt):
        for n in (1, 1000, 1 << 20, 3_000_001):
            base = torch.arange(n, dtype=torch.float32) % 17
            for algo in ("ring", "auto"):
                out = ringlet.allreduce(base + tr.rank, op="sum", algorithm=algo)
                ok.append(bool(torch.equal(out, base * tr.size + sum(range(tr.size)))))
    rt.close()
    return {"ok": ok}


def dead_peer(tr: ShmTransport) -> dict:
    """The last rank dies abruptly after bootstrap; the others must get PeerError naming it."""
    victim = tr.size - 1
    if tr.rank == victim:
        for q in range(victim):  # a message that is delivered before the death
            tr.isend(torch.ones(10), q, 1).wait(10)
        os._exit(17)
    buf = torch.empty(10)
    tr.irecv(buf, victim, 1).wait(30)
    start = time.monotonic()
    try:
        tr.irecv(torch.empty(10), victim, 2).wait(60)
        return {"error": None}
    except PeerError as exc:
        return {"error": "PeerError", "message": str(exc), "seconds": time.monotonic() - start,
                "first": bool(torch.equal(buf, torch.ones(10)))}
    except CollectiveTimeout as exc:
        return {"error": "CollectiveTimeout", "message": str(exc)}


def dead_receiver(tr: ShmTransport) -> dict:
    """Rank 1 dies without receiving; rank 0's send, far larger than the ring, must fail, not hang."""
    if tr.rank == 1:
        os._exit(17)
    try:
        tr.isend(torch.ones(5_000_000), 1, 3).wait(60)
        return {"error": None}
    except PeerError as exc:
        return {"error": "PeerError", "message": str(exc)}
    except CollectiveTimeout as exc:
        return {"error": "CollectiveTimeout", "message": str(exc)}


def mailbox(tr: ShmTransport) -> dict:
    """engine.small over the mailbox between processes: 300 rounds of changing sizes and dtypes (both
    slots reused many times, a rank late in turn), a shape mismatch every rank must report, then the last rank dies in the
    middle of a round and the others must get PeerError, not a hang."""
    from ringlet.engine import small
    from ringlet.engine.meta import Kind, Meta
    from ringlet.runtime import Runtime
    from ringlet.types import MismatchError, Options, ReduceOp, reduction

    rt = Runtime(tr, Options(timeout=60))
    me, p = tr.rank, tr.size
    ok, dtypes = [], (torch.float32, torch.int64, torch.float16, torch.int8)

    def run(t, op=ReduceOp.SUM):
        flat = t.clone()
        ch = rt.channel(rt.world)
        assert small.takes(ch, t.numel() * t.element_size())
        small.allreduce_(ch, flat, reduction(op), Meta.of("", Kind.ALLREDUCE, t, op=op))
        return flat

    # Without a spin every wait sleeps; with a long liveness interval, a sleeper the last publisher failed
    # to post would sleep for a minute, and the job would time out instead of passing slowly.
    import ringlet.transport.shm as shm_module
    check_every = shm_module._CHECK_EVERY
    if os.environ.get("RINGLET_SHM_MAILBOX_SPIN_US") == "0":
        shm_module._CHECK_EVERY = 60.0
    for k in range(300):
        n, dt = (1, 7, 1000, 8192)[k % 4], dtypes[k % 3]
        base = (torch.arange(n) % 5).to(dt)
        if k % 7 == me:  # a late publisher: the others poll past their spin and sleep on their doorbells
            time.sleep(0.0005)
        ok.append(bool(torch.equal(run(base + me), base * p + sum(range(p)))))
    shm_module._CHECK_EVERY = check_every
    try:
        run(torch.ones(3 if me == 0 else 4))
        mismatch = None
    except MismatchError as exc:
        mismatch = str(exc)
    ok.append(bool(torch.equal(run(torch.ones(4)), torch.full((4,), float(p)))))
    if me == p - 1:
        os._exit(17)
    start = time.monotonic()
    try:
        run(torch.ones(4))
        error = None
    except PeerError as exc:
        error = str(exc)
    return {"ok": ok, "mismatch": mismatch, "error": error, "seconds": time.monotonic() - start}


def suite(tr: ShmTransport) -> dict:
    """exchange, fifo and allreduce in one job (starting processes is the slow part of these tests)."""
    out = exchange(tr)
    out.update(fifo(tr))
    out.update(allreduce(tr))
    return out


SCENARIOS = {f.__name__: f for f in (exchange, fifo, allreduce, dead_peer, dead_receiver, suite, mailbox)}


def main() -> None:
    scenario, rank, size, store_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    tr = ShmTransport(rank, size, FileStore(store_file, size), timeout=60)
    result = {"rank": rank, "path": tr._path, "path_exists_after_start": os.path.exists(tr._path)}
    result.update(SCENARIOS[scenario](tr))
    tr.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
