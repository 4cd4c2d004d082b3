"""Bad input gives a clear error at the call; cross-rank disagreement gives MismatchError on every rank
and the next collective still works; dead or silent peers give PeerError / CollectiveTimeout, never
a hang."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from conftest import P2P_SMALL, run_world

import ringlet
from ringlet.transport.inproc import InprocTransport, InprocWorld
from ringlet.types import CollectiveTimeout, MismatchError, Options, PeerError
from ringlet.engine.channel import META_STEP


def _outcome(fn):
    """Run ``fn`` and return the exception it raised (or None)."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


def _then_works(rank, p):
    """A collective after an error must still produce the right answer on every rank."""
    out = ringlet.allreduce(torch.full((4,), float(rank)))
    assert torch.equal(out, torch.full((4,), float(p * (p - 1) // 2)))


# ---- local validation: ValueError at the call, nothing sent -------------------------------------------
LOCAL_ERRORS = {
    "bool dtype": (lambda: ringlet.allreduce(torch.ones(3, dtype=torch.bool)), "not supported"),
    "complex dtype": (lambda: ringlet.allreduce(torch.ones(3, dtype=torch.complex64)), "not supported"),
    "complex broadcast": (lambda: ringlet.broadcast(torch.ones(3, dtype=torch.complex64), 0), "not supported"),
    "bool allgather": (lambda: ringlet.allgather(torch.ones(3, dtype=torch.bool)), "not supported"),
    "non-contiguous": (lambda: ringlet.allreduce(torch.ones(4, 6).t()), "contiguous"),
    "non-contiguous allgather": (lambda: ringlet.allgather(torch.ones(4, 6)[:, ::2]), "contiguous"),
    "not a tensor": (lambda: ringlet.allreduce([1.0, 2.0]), "torch.Tensor"),
    "root out of range": (lambda: ringlet.broadcast(torch.ones(2), 7), "root"),
    "negative root": (lambda: ringlet.reduce(torch.ones(2), -1), "root"),
    "root not an int": (lambda: ringlet.broadcast(torch.ones(2), 0.5), "root"),
    "unknown algorithm": (lambda: ringlet.allreduce(torch.ones(2), algorithm="bogus"), "Unknown algorithm"),
    "unknown op": (lambda: ringlet.allreduce(torch.ones(2), op="bogus"), "Unknown reduction op"),
    "alltoall split count": (lambda: ringlet.alltoall(torch.ones(3), splits=[3]), "splits"),
    "alltoall split sum": (lambda: ringlet.alltoall(torch.ones(3), splits=[1, 1, 0]), "splits"),
    "reduce_scatter scalar": (lambda: ringlet.reduce_scatter(torch.tensor(1.0)), "scalar"),
}


@pytest.mark.parametrize("case", sorted(LOCAL_ERRORS))
def test_local_validation_errors(case):
    call, needle = LOCAL_ERRORS[case]
    p = 3

    def fn(rank):
        exc = _outcome(call)
        _then_works(rank, p)
        return exc

    for exc in run_world(p, fn):
        assert isinstance(exc, ValueError), f"{case}: got {exc!r}"
        assert needle.lower() in str(exc).lower(), f"{case}: unclear message {exc}"


def test_groups_roots_and_non_members():
    p = 4

    def fn(rank):
        g = ringlet.new_group([0, 1, 2])
        errs = []
        if rank == 3:
            errs.append(_outcome(lambda: ringlet.allreduce(torch.ones(2), group=g)))
            errs.append(_outcome(lambda: ringlet.broadcast(torch.ones(2), 0, group=g)))
            errs.append(_outcome(lambda: ringlet.barrier(group=g)))
        else:
            errs.append(_outcome(lambda: ringlet.broadcast(torch.ones(2), 3, group=g)))  # root not in group
            out = ringlet.allreduce(torch.ones(2), group=g)
            assert torch.equal(out, torch.full((2,), 3.0))
        errs.append(_outcome(lambda: ringlet.new_group([0, 9])))
        _then_works(rank, p)
        return errs

    for rank, errs in enumerate(run_world(p, fn)):
        for exc in errs:
            assert isinstance(exc, ValueError), (rank, exc)
        if rank == 3:
            assert all("not a member" in str(e) for e in errs[:3])
        else:
            assert "root" in str(errs[0]).lower()


def test_before_init_raises_value_error_mentioning_init():
    if ringlet.is_initialized():
        pytest.skip("a global runtime is active in this process")
    for call in (lambda: ringlet.allreduce(torch.ones(2)), lambda: ringlet.rank(), lambda: ringlet.size(),
                 lambda: ringlet.barrier(), lambda: ringlet.new_group([0])):
        with pytest.raises(ValueError, match="init"):
            call()


# ---- cross-rank mismatches: MismatchError on every rank, then business as usual ---------------------
def _mismatch_cases(p):
    odd = lambda r: r == p - 1  # noqa: E731 - the one rank that disagrees
    return {
        "shape": lambda r: ringlet.allreduce(torch.ones(3 if odd(r) else 4)),
        "shape same numel": lambda r: ringlet.allreduce(torch.ones((2, 3) if odd(r) else (3, 2))),
        "dtype": lambda r: ringlet.allreduce(torch.ones(4, dtype=torch.float64 if odd(r) else torch.float32)),
        "op": lambda r: ringlet.allreduce(torch.ones(4), op="max" if odd(r) else "sum"),
        "algorithm": lambda r: ringlet.allreduce(torch.ones(4), algorithm="tree" if odd(r) else "ring"),
        "prescale": lambda r: ringlet.allreduce(torch.ones(4), prescale_factor=2.0 if odd(r) else 1.0),
        "root": lambda r: ringlet.broadcast(torch.ones(4), 0 if odd(r) else 1),
        "reduce root": lambda r: ringlet.reduce(torch.ones(4), 0 if odd(r) else 1),
        "collective": lambda r: ringlet.broadcast(torch.ones(4), 0) if odd(r) else ringlet.allreduce(torch.ones(4)),
        "allgather trailing dims": lambda r: ringlet.allgather(torch.ones(2, 3 if odd(r) else 2)),
        "allgather dtype": lambda r: ringlet.allgather(torch.ones(2, dtype=torch.int8 if odd(r) else torch.int16)),
        "reduce_scatter shape": lambda r: ringlet.reduce_scatter(torch.ones(4 if odd(r) else 6, 2)),
        "alltoall trailing dims": lambda r: ringlet.alltoall(torch.ones(p, 1 if odd(r) else 2)),
        "async shape": lambda r: ringlet.allreduce_async(torch.ones(3 if odd(r) else 4)).wait(),
    }


@pytest.fixture(params=["schedules", "p2p"])
def carrier(request, monkeypatch):
    """The core API's checks and small all-reduces on ringlet's schedules (the in-process default), or
    over the in-band recursive doubling that MPI's transport asks for (``capabilities.small_path == "p2p"``)."""
    if request.param == "p2p":
        monkeypatch.setattr(InprocTransport, "capabilities", P2P_SMALL)
    return request.param


@pytest.mark.parametrize("p", [2, 3, 5])
def test_mismatch_raises_on_every_rank_and_next_collective_works(p, carrier):
    names = sorted(_mismatch_cases(p))

    def fn(rank):
        cases = _mismatch_cases(p)
        errors = []
        for name in names:
            errors.append(_outcome(lambda: cases[name](rank)))
            _then_works(rank, p)
        return errors

    for rank, errors in enumerate(run_world(p, fn)):
        for name, exc in zip(names, errors):
            assert isinstance(exc, MismatchError), f"rank {rank}, {name}: {exc!r}"
            assert "Mismatched" in str(exc)
    # The same message on every rank: all ranks compare the same gathered records.
    res = run_world(p, fn)
    for i in range(len(names)):
        assert len({str(res[r][i]) for r in range(p)}) == 1


@pytest.mark.parametrize("p", [1, 2, 5])
def test_check_off_still_correct_for_matched_calls(p, carrier):
    def fn(rank):
        x = torch.full((2, 3), float(rank + 1))
        outs = [ringlet.allreduce(x, algorithm=a) for a in ("ring", "tree", "halving_doubling", "auto")]
        outs.append(ringlet.broadcast(x, p - 1))
        outs.append(ringlet.allgather(torch.ones(rank, 3)))
        outs.append(ringlet.reduce_scatter(torch.ones(2 * p, 3)))
        outs.append(ringlet.alltoall(torch.full((p,), float(rank)))[0])
        ringlet.barrier()
        return outs

    res = run_world(p, fn, options=Options(timeout=20, check=False))
    total = p * (p + 1) / 2
    for rank, outs in enumerate(res):
        for o in outs[:4]:
            assert torch.equal(o, torch.full((2, 3), total))
        assert torch.equal(outs[4], torch.full((2, 3), float(p)))
        assert outs[5].shape == (p * (p - 1) // 2, 3)
        assert torch.equal(outs[6], torch.full((2, 3), float(p)))
        assert torch.equal(outs[7], torch.arange(p, dtype=torch.float32))


# ---- faults: dead peers and lost messages -------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("while_waiting", [False, True])
def test_killed_rank_gives_peer_error(p, while_waiting):
    world = InprocWorld(p)
    victim = p - 1
    everyone_done = threading.Barrier(p)

    def fn(rank):
        ringlet.allreduce(torch.ones(8))  # a healthy collective first...
        everyone_done.wait()  # ...finished everywhere before the victim dies
        if rank == victim:
            if while_waiting:
                time.sleep(0.3)  # the others are already blocked in the next collective
            world.kill(victim)
            return None
        t0 = time.monotonic()
        exc = _outcome(lambda: ringlet.allreduce(torch.ones(1 << 16)))
        return exc, time.monotonic() - t0

    res = run_world(p, fn, world=world, options=Options(timeout=30))
    for rank in range(p - 1):
        exc, waited = res[rank]
        assert isinstance(exc, PeerError), f"rank {rank}: {exc!r}"
        assert waited < 10, "a dead peer must be noticed at once, not after the timeout"


def test_dropped_message_times_out_naming_the_peer():
    # Drop the data messages (not the metadata exchange) from rank 1 to rank 0.
    drop = lambda src, dst, tag: src == 1 and dst == 0 and (tag & 0xFFFF) < META_STEP  # noqa: E731

    def fn(rank):
        return _outcome(lambda: ringlet.allreduce(torch.ones(100), algorithm="ring"))

    res = run_world(2, fn, drop=drop, options=Options(timeout=0.5))
    assert isinstance(res[0], CollectiveTimeout), repr(res[0])
    assert "rank 1" in str(res[0])
    # Rank 1 starves too (rank 0 never got what it needed to forward): a timeout naming rank 0.
    assert isinstance(res[1], CollectiveTimeout) and "rank 0" in str(res[1])
    assert isinstance(res[0], TimeoutError) and isinstance(res[0], ringlet.RingletError)
