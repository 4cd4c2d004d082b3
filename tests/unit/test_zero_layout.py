"""ZeRO's layout (buckets, shards, pieces) and the seam's flat reduce-scatter / all-gather."""
import pytest
import torch

from ringlet.torch.comm import Comm
from ringlet.torch.training.zero import Even, Layout, WholeParameters
from ringlet.types import ReduceOp

from conftest import run_world, use_model


def named(*shapes, dtype=torch.float32):
    return [(f"p{i}", torch.zeros(s, dtype=dtype)) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("partition", [Even(), WholeParameters()], ids=repr)
def test_pieces_cover_every_element_once(world, partition):
    params = named((3, 5), (7,), (1,), (11, 2), (0,), (13,))
    layout = Layout.bucketed(params, [0] * len(params), world, bucket_bytes=100, partition=partition)
    covered = {name: torch.zeros(t.numel(), dtype=torch.int64) for name, t in params}
    for r in range(world):
        shard = 0
        for piece in layout.pieces(r):
            covered[piece.slot.name][piece.start:piece.end] += 1
            assert piece.shard_start == shard - sum(layout.buckets[b].counts[r] for b in range(piece.bucket))
            shard += piece.numel
        assert shard == layout.shard_numel(r)
    assert all((c == 1).all() for c in covered.values())
    for b in layout.buckets:
        assert sum(b.counts) == b.numel and b.numel * 4 <= max(100, max(s.numel for s in b.slots) * 4)
        if isinstance(partition, Even):
            assert max(b.counts) - min(b.counts) <= 1
        else:  # whole parameters: no parameter is split
            assert all(p.start == 0 and p.end == p.slot.numel for r in range(world) for p in b.pieces(r))


def test_buckets_never_mix_dtypes_or_groups():
    params = named((4,), (4,)) + named((4,), dtype=torch.float16) + named((4,))
    layout = Layout.bucketed(params, [0, 1, 0, 0], 2, bucket_bytes=1 << 20)
    kinds = [(b.dtype, b.group, [s.index for s in b.slots]) for b in layout.buckets]
    assert kinds == [(torch.float32, 0, [0, 3]), (torch.float32, 1, [1]), (torch.float16, 0, [2])]


def test_units_and_bad_input():
    params = named((4,), (6,), (2,))
    layout = Layout.units(params, [0, 0, 0], 2, [[2], [0, 1]])
    assert [[s.name for s in b.slots] for b in layout.buckets] == [["p2"], ["p0", "p1"]]
    with pytest.raises(ValueError, match="exactly one unit"):
        Layout.units(params, [0, 0, 0], 2, [[0], [1]])
    with pytest.raises(ValueError, match="mixes"):
        Layout.units(params, [0, 1, 0], 2, [[0, 1], [2]])
    with pytest.raises(ValueError, match="world"):
        Layout.bucketed(params, [0, 0, 0], 0, 8)
    with pytest.raises(ValueError, match="bucket_bytes"):
        Layout.bucketed(params, [0, 0, 0], 2, 0)


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_flat_reduce_scatter_then_allgather(p, n):
    counts = Even().counts([type("S", (), {"numel": n})()], p)

    def body(rank):
        comm = Comm()
        flat = torch.arange(n, dtype=torch.float32) * (rank + 1)
        block = comm.reduce_scatter_flat_(flat, counts, ReduceOp.AVG, "b0", check=True).wait()
        start = sum(counts[:rank])
        expected = torch.arange(n, dtype=torch.float32)[start:start + counts[rank]] * (p + 1) / 2
        assert torch.equal(block, expected) and block.data_ptr() == flat[start:].data_ptr() or n == 0
        out = torch.zeros(n)
        out[start:start + counts[rank]] = block
        comm.allgather_flat_(out, counts, "b0", check=True).wait()
        return out

    for out in run_world(p, body):
        assert torch.equal(out, torch.arange(n, dtype=torch.float32) * (p + 1) / 2)


def test_flat_ops_refuse_bad_buffers():
    def body(rank):
        comm = Comm()
        with pytest.raises(ValueError, match="1-D and contiguous"):
            comm.reduce_scatter_flat_(torch.zeros(2, 2), [2, 2], ReduceOp.SUM, "x")
        with pytest.raises(ValueError, match="do not cut"):
            comm.allgather_flat_(torch.zeros(4), [1, 2], "x")

    run_world(2, body)


def test_the_allgather_follows_the_runtimes_cost_model(monkeypatch):
    """``"auto"`` (what ZeRO's Reducer asks for) is the ring without a model; with one, the schedule of least
    predicted time, never direct beyond the model's fan-out; a forced name stays as asked."""
    from ringlet.tuning import select
    from ringlet.tuning.network import Network

    slow_steps = select.Model(Network.of(link="100gbit", latency="5ms"), max_fanout=8)  # steps dominate
    assert select.allgather_choice("auto", (100,) * 4, 4, (0, 1, 2, 3), None) == "ring"
    assert select.allgather_choice("auto", (100,) * 4, 4, (0, 1, 2, 3), slow_steps) == "direct"
    assert select.allgather_choice("auto", (100,) * 4, 4, (0, 1, 2, 3), select.Model(slow_steps.network)) == "ring"
    assert select.allgather_choice("ring", (100,) * 4, 4, (0, 1, 2, 3), slow_steps) == "ring"
    with pytest.raises(ValueError, match="unknown all-gather"):
        select.allgather_choice("bogus", (1, 1), 4, (0, 1), None)

    def body(rank):  # the engine runs the model's choice, and the result is the same
        flat = torch.zeros(12)
        flat[rank * 4:(rank + 1) * 4] = rank + 1
        Comm().allgather_flat_(flat, [4, 4, 4], "x", algorithm="auto").wait()
        return flat

    use_model(monkeypatch, slow_steps)  # every rank thread's runtime
    outs = run_world(3, body)
    for out in outs:
        assert torch.equal(out, torch.tensor([1.0] * 4 + [2.0] * 4 + [3.0] * 4))
