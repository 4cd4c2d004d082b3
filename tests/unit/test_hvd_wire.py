"""The negotiation wire format, the response cache and the cross-rank checks (pure functions)."""
from __future__ import annotations

import torch

from ringlet.torch import requests as rq
from ringlet.torch.requests import Cache, Meta, Request, decode_message, encode_message, entry_bytes
from ringlet.engine.meta import mismatch as check

F32, I32 = rq.DTYPE_CODE[torch.float32], rq.DTYPE_CODE[torch.int32]


def _req(meta: Meta) -> Request:
    r = Request(meta, None, None, 1, 0)
    r.wire = meta.encode()
    return r


def test_meta_roundtrip():
    m = Meta("allreduce.layer.0.weight", rq.ALLTOALL, 3, F32, (17, 4, 2), 1, 2, 0.5, 3.25, -1, (1, 0, 16))
    back, end = Meta.decode(m.encode(), 0)
    assert back == m and end == len(m.encode())
    assert back.numel == 17 * 8 and back.torch_dtype == torch.float32
    ctl = Meta("join", rq.JOIN)
    assert Meta.decode(ctl.encode(), 0)[0] == ctl and ctl.torch_dtype is None


def test_message_with_cache_references():
    cache = Cache()
    a = Meta("allreduce.a", rq.ALLREDUCE, 0, F32, (5,))
    b = Meta("allreduce.b", rq.ALLREDUCE, 0, I32, (2, 2))
    full = entry_bytes(_req(a), cache)
    cache.record(a, a.encode())
    ref = entry_bytes(_req(a), cache)
    assert len(ref) == 5 < len(full)
    changed = Meta("allreduce.a", rq.ALLREDUCE, 0, F32, (6,))  # same name, new shape: full record again
    assert entry_bytes(_req(changed), cache)[0] == 0
    msg = encode_message(rq.F_SHUTDOWN, [ref, entry_bytes(_req(b), cache)], 77)
    flags, items, waiting = decode_message(msg + b"\0" * 100, cache)
    assert flags == rq.F_SHUTDOWN and waiting == 77
    assert [m for m, _ in items] == [a, b]


def test_cache_is_bounded_lru():
    cache = Cache(capacity=3)
    metas = [Meta(f"n{i}", rq.ALLREDUCE, 0, F32, (i,)) for i in range(5)]
    for m in metas:
        cache.record(m, m.encode())
    assert cache.lookup("n0", metas[0].encode()) is None
    assert cache.lookup("n4", metas[4].encode()) is not None


def test_check_messages():
    base = dict(kind=rq.ALLREDUCE, ps_id=0)
    ok = {0: Meta("x", dtype=F32, shape=(3,), **base), 1: Meta("x", dtype=F32, shape=(3,), **base)}
    assert check(ok) is None
    shapes = {0: Meta("x", dtype=F32, shape=(17, 17, 17), **base), 1: Meta("x", dtype=F32, shape=(18, 18, 18), **base)}
    assert check(shapes).startswith("Mismatched allreduce tensor shapes: One rank sent a tensor of shape "
                                    "[17, 17, 17], but another rank sent a tensor of shape [18, 18, 18].")
    types = {0: Meta("x", dtype=F32, shape=(3,), **base), 1: Meta("x", dtype=I32, shape=(3,), **base)}
    assert check(types).startswith("Mismatched data types: One rank had type float32, but another rank had "
                                   "type int32.")
    ops = {0: Meta("x", dtype=F32, shape=(3,), op=0, **base), 1: Meta("x", dtype=F32, shape=(3,), op=1, **base)}
    assert "reduction ops" in check(ops)
    pre = {0: Meta("x", dtype=F32, shape=(3,), pre=2.0, **base), 1: Meta("x", dtype=F32, shape=(3,), **base)}
    assert "prescale" in check(pre)
    post = {0: Meta("x", dtype=F32, shape=(3,), post=2.0, **base), 1: Meta("x", dtype=F32, shape=(3,), **base)}
    assert "postscale" in check(post)
    dev = {0: Meta("x", dtype=F32, shape=(3,), device=0, **base), 1: Meta("x", dtype=F32, shape=(3,), **base)}
    assert "device" in check(dev)
    bc = {r: Meta("x", rq.BROADCAST, 0, F32, (3,), root=r) for r in (0, 1)}
    assert "root rank" in check(bc)
    ag = {0: Meta("x", rq.ALLGATHER, 0, F32, (1, 4)), 1: Meta("x", rq.ALLGATHER, 0, F32, (7, 4))}
    assert check(ag) is None  # ragged first dimension is fine
    ag[1] = Meta("x", rq.ALLGATHER, 0, F32, (7, 5))
    assert "Mismatched allgather tensor shapes" in check(ag)
