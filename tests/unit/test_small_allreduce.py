"""The small-message path (ringlet.engine.small) against the reference, element by element, on both
paths: ``p2p`` over the in-process transport declaring it (MPI's path and receive rule) and ``mailbox``
over the shm transport (ranks as threads). World sizes 1..8, counts 0, 1, primes, up to the carrier's limit, every
dtype and op; mismatched records raise MismatchError on every rank and the next call works."""
from __future__ import annotations

import pytest
import torch
from conftest import OPS, P2P_SMALL, make_input, run_world
from test_shm_transport import shm_world

from ringlet import collectives as C
from ringlet.algorithms import reference
from ringlet.engine import small
from ringlet.engine.channel import Channel
from ringlet.engine.meta import Kind, Meta
from ringlet.runtime import Runtime
from ringlet.transport.inproc import InprocTransport
from ringlet.transport.shm import ShmOptions
from ringlet.types import SUPPORTED_DTYPES, MismatchError, Options, ReduceOp, dtype_name, reduction

COUNTS = (0, 1, 2, 7, 13, 251, 1023)


@pytest.fixture
def p2p(monkeypatch):
    """In-process worlds with MPI's small-message path."""
    monkeypatch.setattr(InprocTransport, "capabilities", P2P_SMALL)


def _probe(rt) -> Channel:
    """A channel of the world to ask :func:`small.carrier` with (it takes no tag)."""
    return Channel(rt.transport, rt.world, rt.world.rank_of(rt.rank), 0)


def _run(rt, t: torch.Tensor, op: ReduceOp, check: bool = True) -> torch.Tensor:
    """What the collective layer does with this path: channel, record, the rounds (AVG sums; no scaling)."""
    out = t.clone()
    flat = out.view(-1)
    ch = rt.channel(rt.world)
    if small.carrier(ch) is None:
        assert ch.size == 1
        return out
    meta = Meta.of("", Kind.ALLREDUCE, t, op=op) if check else None
    small.allreduce_(ch, flat, reduction(op), meta)
    return out


def _expected(inputs, op):
    return reference.reduce(inputs, ReduceOp.SUM if op == ReduceOp.AVG else op)


def shm_runtimes(p: int, fn, timeout: float = 120.0) -> list:
    """``fn(rt)`` on every rank of a shm world of ``p`` threads, each with its own Runtime."""
    return shm_world(p, lambda tr: fn(Runtime(tr, Options(timeout=30))), ShmOptions(ring_bytes=64 << 10), timeout)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("p", range(1, 9))
def test_p2p_against_reference(p, dtype, p2p):
    cases = [(n, op) for n in COUNTS for op in OPS]
    inputs = {c: [make_input(r, c[0], dtype, c[1]) for r in range(p)] for c in cases}

    def fn(rank):
        rt = C.runtime()
        if p > 1:
            assert small.carrier(_probe(rt)) == "p2p"
        return [_run(rt, inputs[c][rank], c[1]) for c in cases]

    outs = run_world(p, fn)
    for i, (n, op) in enumerate(cases):
        exp = _expected(inputs[(n, op)], op)
        for r in range(p):
            assert torch.equal(outs[r][i], exp), f"p2p p={p} n={n} {op.name} {dtype_name(dtype)} rank {r}"


@pytest.mark.parametrize("p", range(2, 9))
def test_mailbox_against_reference(p):
    cases = [(n, op, dt) for n in COUNTS for op in OPS for dt in SUPPORTED_DTYPES]
    inputs = {c: [make_input(r, c[0], c[2], c[1]) for r in range(p)] for c in cases}

    def fn(rt):
        assert small.carrier(_probe(rt)) == "mailbox"
        return [_run(rt, inputs[c][rt.rank], c[1]) for c in cases]

    outs = shm_runtimes(p, fn)
    for i, (n, op, dt) in enumerate(cases):
        exp = _expected(inputs[(n, op, dt)], op)
        for r in range(p):
            assert torch.equal(outs[r][i], exp), f"mailbox p={p} n={n} {op.name} {dtype_name(dt)} rank {r}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=dtype_name)
def test_limits_and_largest(dtype, p2p):
    """Exactly the path's limit (``capabilities.small_bytes``) runs on it (both paths); one element more
    does not."""
    p = 3
    itemsize = torch.empty(0, dtype=dtype).element_size()
    n = P2P_SMALL.small_bytes // itemsize
    inputs = [make_input(r, n, dtype) for r in range(p)]

    def rd(rank):
        rt = C.runtime()
        assert small.takes(_probe(rt), n * itemsize) and not small.takes(_probe(rt), (n + 1) * itemsize)
        return _run(rt, inputs[rank], ReduceOp.SUM)

    def box(rt):
        assert not small.takes(_probe(rt), rt.transport.capabilities.small_bytes + 1)
        return [_run(rt, inputs[rt.rank], ReduceOp.SUM) for _ in range(3)]  # both slots, then the first again

    exp = _expected(inputs, ReduceOp.SUM)
    assert all(torch.equal(o, exp) for o in run_world(p, rd))
    assert all(torch.equal(o, exp) for outs in shm_runtimes(p, box) for o in outs)


def _mismatch_then_ok(rt, rank: int):
    """Rank 1 sends another shape (first a same-size reshape, then another size); every rank must raise
    MismatchError, and then a matching call works."""
    errors = []
    for bad in (torch.ones(2, 3), torch.ones(7)):
        t = bad if rank == 1 else torch.ones(6)
        try:
            _run(rt, t, ReduceOp.SUM)
        except MismatchError as exc:
            errors.append(str(exc))
    try:
        _run(rt, torch.ones(6), ReduceOp.SUM if rank else ReduceOp.MAX)
    except MismatchError as exc:
        errors.append(str(exc))
    ok = _run(rt, torch.full((6,), float(rank)), ReduceOp.SUM)
    return errors, ok


@pytest.mark.parametrize("p", [2, 3, 5])
def test_mismatch_p2p(p, p2p):
    outs = run_world(p, lambda rank: _mismatch_then_ok(C.runtime(), rank))
    for errors, ok in outs:
        assert len(errors) == 3 and "shape" in errors[0] and "reduction ops" in errors[2]
        assert torch.equal(ok, torch.full((6,), float(p * (p - 1) // 2)))
    assert len({tuple(e) for e, _ in outs}) == 1  # the same message on every rank


@pytest.mark.parametrize("p", [2, 3, 5, 6, 7, 8])
def test_mismatch_p2p_records_of_different_lengths(p, p2p):
    """A member whose record is longer than its partner's (more dimensions), at every rank of groups
    with and without folded ranks: the partner forwards it in a wider frame, and every member raises
    the same MismatchError (found by the fuzz: a local ValueError left the others to time out)."""
    def fn(rank, odd):
        rt = C.runtime()
        out = []
        for data in (None, torch.ones(2)):
            meta_t = torch.ones(1, 1, 2) if rank == odd else torch.ones(2)
            ch = rt.channel(rt.world)
            try:
                if data is None:
                    small.records(ch, Meta.of("", Kind.BROADCAST, meta_t, root=0))
                else:
                    small.allreduce_(ch, meta_t.view(-1).clone(), reduction("sum"),
                                     Meta.of("", Kind.ALLREDUCE, meta_t, op=ReduceOp.SUM))
                out.append("no error")
            except MismatchError as exc:
                out.append(str(exc))
        return out

    for odd in range(p):
        msgs = run_world(p, lambda rank: fn(rank, odd))
        assert all(m != "no error" and "shape" in m for ms in msgs for m in ms), msgs
        assert all(ms == msgs[0] for ms in msgs)


def test_mismatch_mailbox():
    p = 3
    outs = shm_runtimes(p, lambda rt: _mismatch_then_ok(rt, rt.rank))
    for errors, ok in outs:
        assert len(errors) == 3 and "shape" in errors[0] and "reduction ops" in errors[2]
        assert torch.equal(ok, torch.full((6,), 3.0))
    assert len({tuple(e) for e, _ in outs}) == 1


def test_unchecked_size_mismatch_is_caught(p2p):
    """Without records the sizes are still compared: a MismatchError, not garbage or a hang."""
    def fn(rt):
        try:
            _run(rt, torch.ones(5 if rt.rank == 0 else 4), ReduceOp.SUM, check=False)
        except MismatchError:
            return True
        return False

    assert shm_runtimes(2, fn) == [True, True]
    assert run_world(2, lambda rank: fn(C.runtime())) == [True, True]


def test_src_and_flat_untouched_on_mismatch(p2p):
    """A separate source (the caller's prescaled copy) is what travels; on a mismatch ``flat`` keeps
    its values on every rank."""
    def fn(rt):
        flat = torch.full((4,), float(rt.rank + 1))
        small.allreduce_(rt.channel(rt.world), flat, reduction("sum"), None, src=flat * 2)
        bad = torch.ones(5 if rt.rank == 1 else 4)
        before = bad.clone()
        meta = Meta.of("", Kind.ALLREDUCE, bad, op=ReduceOp.SUM)
        try:
            small.allreduce_(rt.channel(rt.world), bad, reduction("sum"), meta)
        except MismatchError:
            pass
        return flat, torch.equal(bad, before)

    for flat, untouched in shm_runtimes(3, fn) + run_world(3, lambda rank: fn(C.runtime())):
        assert torch.equal(flat, torch.full((4,), 12.0)) and untouched


def _check_vs_allreduce(rt):
    """Rank 0 checks a broadcast's record while the others all-reduce."""
    t = torch.ones(4)
    try:
        if rt.rank == 0:
            small.records(rt.channel(rt.world), Meta.of("", Kind.BROADCAST, t, root=0))
        else:
            _run(rt, t, ReduceOp.SUM)
    except MismatchError as exc:
        return str(exc)
    return ""


def test_check_records_meets_allreduce(p2p):
    """A rank checking another collective's record meets the all-reduce in the same exchange (mailbox
    and in-band p2p): every rank raises MismatchError naming the operations; matching checks pass."""
    for msgs in (shm_runtimes(3, _check_vs_allreduce), run_world(3, lambda r: _check_vs_allreduce(C.runtime())),
                 run_world(5, lambda r: _check_vs_allreduce(C.runtime()))):
        assert all("Mismatched operations" in m for m in msgs) and len(set(msgs)) == 1

    def ok(rt):
        meta = Meta("", Kind.BARRIER)
        return small.records(rt.channel(rt.world), meta) == [meta] * rt.size

    assert shm_runtimes(2, ok) == [True, True]
    assert run_world(3, lambda r: ok(C.runtime())) == [True] * 3


def test_exchange_records_ragged(p2p):
    """The records are exchanged without comparing them (the ragged all-gather's first dimensions)."""
    def fn(rt):
        meta = Meta("", Kind.ALLGATHER, shape=(rt.rank * 10, 7))
        got = small.records(rt.channel(rt.world), meta, check=False)
        return [list(m.shape) for m in got]

    want = [[[q * 10, 7] for q in range(3)]] * 3
    assert shm_runtimes(3, fn) == want
    assert run_world(3, lambda r: fn(C.runtime())) == want


def test_the_carrier_follows_the_transport(monkeypatch):
    """The small-message path follows the transport's declaration: none over point-to-point unless the
    transport declares the in-band recursive doubling (``capabilities.small_path == "p2p"``, as MPI's
    does); then every group, not only the world, has it, up to ``capabilities.small_bytes``."""
    def carriers(r):
        rt = C.runtime()
        sub = rt.new_group([0, 1])
        sub_ch = Channel(rt.transport, sub, sub.rank_of(rt.rank), 0) if rt.rank in sub else None
        return (small.carrier(_probe(rt)), small.takes(_probe(rt), P2P_SMALL.small_bytes + 1),
                None if sub_ch is None else small.carrier(sub_ch))

    assert run_world(3, carriers) == [(None, False, None), (None, False, None), (None, False, None)]
    monkeypatch.setattr(InprocTransport, "capabilities", P2P_SMALL)
    assert run_world(3, carriers) == [("p2p", False, "p2p")] * 2 + [("p2p", False, None)]
