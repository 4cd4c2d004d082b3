"""The engine's pieces alone: the one record (encode/decode, digest, mismatch), the one selection point,
named reductions, and one behaviour every front end shares through them: a forced ``native`` algorithm
that the transport cannot run is an error on the core path and on the Horovod path alike."""
from __future__ import annotations

import pytest
import torch
from conftest import run_world
from hvd_world import hvd_world

import ringlet
import ringlet.torch as hvd
from ringlet.engine import ops
from ringlet.engine.meta import Kind, Meta, mismatch
from ringlet.tuning import select
from ringlet.types import DTYPE_CODE, Options, ReduceOp, reduction


def test_record_roundtrip_and_digest():
    m = Meta("w", Kind.ALLTOALL, 3, DTYPE_CODE[torch.float32], (5, 2), 1, 2, 0.5, 2.0, -1, (1, 4), "ring")
    back, end = Meta.decode(m.encode())
    assert back == m and end == len(m.encode())
    assert Meta.of("x", Kind.ALLREDUCE, torch.ones(2, 3)).shape == (2, 3)
    assert m.digest() == back.digest() and 0 <= m.digest() < 1 << 62
    assert Meta.of("", Kind.ALLREDUCE, torch.ones(3)).digest() != Meta.of("", Kind.ALLREDUCE, torch.ones(4)).digest()


def test_mismatch_names_the_difference_and_the_ranks():
    a = Meta.of("", Kind.ALLREDUCE, torch.ones(3), algorithm="ring")
    b = Meta.of("", Kind.ALLREDUCE, torch.ones(3), algorithm="tree")
    assert mismatch({0: a, 1: a}) is None
    msg = mismatch({0: a, 2: b})
    assert msg.startswith("Mismatched allreduce algorithms") and "rank 0 vs rank 2" in msg
    ragged = {0: Meta.of("g", Kind.ALLGATHER, torch.ones(2, 3)), 1: Meta.of("g", Kind.ALLGATHER, torch.ones(5, 3))}
    assert mismatch(ragged) is None
    kinds = mismatch({0: Meta("", Kind.BROADCAST), 1: Meta("", Kind.REDUCE)})
    assert kinds.startswith("Mismatched operations: One rank did a broadcast, but another rank did a reduce.")


def test_selection_is_one_rule_for_every_front_end():
    none, small = select.Capabilities(), select.Capabilities(native_small=True)
    assert select.requested(None) == "auto" and select.requested("auto", "ring") == "ring"
    assert select.requested("rabenseifner") == "halving_doubling"
    with pytest.raises(ValueError, match="Unknown algorithm"):
        select.requested("bogus")
    assert select.allreduce("auto", 4, 4096, (0, 0, 0, 0), small) == "native"
    assert select.allreduce("auto", 4, 4096, (0, 0, 0, 0), none) == "recursive_doubling"
    assert select.allreduce("auto", 4, 8 << 20, (0, 0, 1, 1), none) == "hierarchical"
    assert select.allreduce("auto", 4, 8 << 20, (0, 1, 2, 3), none) == "ring"
    assert select.allreduce("tree", 4, 4096, (0, 0, 0, 0), small) == "tree"
    assert select.allgather(None) == "ring" and select.allgather("direct") == "direct"


@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "product"])
def test_reductions_are_named_functions(op):
    red = reduction(op)
    dst, src = torch.tensor([1.0, 5.0]), torch.tensor([3.0, 2.0])
    red.combine(dst, src)
    expect = {"sum": [4.0, 7.0], "avg": [4.0, 7.0], "min": [1.0, 2.0], "max": [3.0, 5.0], "product": [3.0, 10.0]}
    assert dst.tolist() == expect[op] and red.averages == (op == "avg") and red.op == ReduceOp.parse(op)
    with pytest.raises(NotImplementedError, match="Adasum"):
        reduction("adasum")


@pytest.mark.parametrize("p", [2, 3])
def test_forced_native_without_a_native_allreduce_is_an_error_on_every_path(p):
    forced = Options(timeout=20, algorithm="native")

    def core(rank):
        with pytest.raises(ValueError, match="'native' is not available on the inproc transport"):
            ringlet.allreduce(torch.ones(4))
        return ringlet.allreduce(torch.ones(4), algorithm="ring")  # the next collective works

    for out in run_world(p, core, options=forced):
        assert torch.equal(out, torch.full((4,), float(p)))

    def horovod(rank):
        with pytest.raises(hvd.HorovodInternalError, match="'native' is not available"):
            hvd.allreduce(torch.ones(4), name="forced.native")
        return True

    assert all(hvd_world(p, horovod, options=forced))


def test_transports_declare_their_abilities_in_one_record():
    from ringlet.transport import Capabilities
    from ringlet.transport.inproc import InprocTransport, InprocWorld
    from ringlet.transport.mpi import MPITransport
    from ringlet.transport.shm import ShmTransport
    from ringlet.transport.torchdist import TorchTransport

    assert MPITransport.capabilities.small_path == "p2p" and MPITransport.capabilities.native_small
    assert MPITransport.capabilities.max_segment_bytes == 1 << 20 and MPITransport.capabilities.group_setup
    assert ShmTransport.capabilities.small_path == "mailbox" and ShmTransport.capabilities.small_bytes > 0
    assert TorchTransport.capabilities.native_digest and TorchTransport.capabilities.small_path is None
    assert InprocTransport.capabilities == Capabilities(partial_receive=True, threaded_posts=True)
    tr = InprocWorld(1).transport(0)
    tr.wait_all([])  # the defaults: wait for each handle in turn; no backend step for a new group
    assert tr.on_new_group(1, (0,)) is None
    with pytest.raises(NotImplementedError, match="no mailbox"):
        tr.small_round(b"", None, 1.0)
    with pytest.raises(ValueError, match="needs partial_receive"):
        Capabilities(small_path="p2p", small_bytes=1)
    with pytest.raises(ValueError, match="small_path must be one of"):
        Capabilities(small_path="carrier-pigeon", small_bytes=1)
    with pytest.raises(ValueError, match="small_bytes > 0"):
        Capabilities(small_path="mailbox")


def test_a_channel_without_a_selector_cannot_choose():
    from ringlet.engine.channel import Channel
    from ringlet.transport.inproc import InprocWorld

    def body(tr):
        with pytest.raises(ValueError, match="no algorithm selector"):
            ops.allreduce_(Channel.world(tr), torch.ones(4), reduction("sum"))
        return True

    assert InprocWorld(2).run(body, timeout=30) == [True, True]
