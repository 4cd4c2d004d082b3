"""Hierarchical sharding (``HierarchicalReducer``): shard within a host, replicate across hosts, against
the exact average of every rank's bucket; replicas of a block bitwise identical; unequal hosts refused."""
import pytest
import torch

from ringlet.torch.comm import Comm
from ringlet.torch.training.zero.reduce import Reducer
from ringlet.torch.training.zero.reduce_hierarchical import HierarchicalReducer, Hosts

from conftest import run_world
from zero_reduce_cases import DTYPES, average, block_of, bucket, counts_of

LAYOUTS = {  # hosts x ranks per host
    "2x2": (0, 0, 1, 1),
    "2x3": (0, 0, 0, 1, 1, 1),
    "4x2": (0, 0, 1, 1, 2, 2, 3, 3),
    "2x2-interleaved": (0, 1, 0, 1),
    "3x1": (0, 1, 2),
    "1x3": (5, 5, 5),
}


def local_index(host_of, rank):
    return [r for r in range(len(host_of)) if host_of[r] == host_of[rank]].index(rank)


def run_hierarchical(host_of, n, cut, dtype, *, compression=None, exact=True, steps=1):
    """Every rank's (reducer facts, reduced block of each step, gathered bucket of each step, state)."""
    p = len(host_of)
    per_host = p // len(set(host_of))
    counts = counts_of(n, per_host, cut)

    def body(rank):
        red = HierarchicalReducer(host_of=host_of, compression=compression)
        state, blocks, gathered = {}, [], []
        for step in range(steps):
            flat = bucket(rank, n, dtype, step, exact)
            block = red.reduce_scatter_(flat, counts, "b0", state, check=True).wait()
            assert block.dtype == dtype and block.numel() == counts[red.shard_rank]
            blocks.append(block.clone())
            out = torch.zeros(n, dtype=dtype)
            block_of(out, counts, red.shard_rank).copy_(block)
            red.allgather_(out, counts, "b0", check=True).wait()
            gathered.append(out)
        return (red.world, red.shard_size, red.shard_rank), blocks, gathered, state

    return counts, run_world(p, body)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cut", ["even", "ragged"])
@pytest.mark.parametrize("n", [0, 1, 13, 1009])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_exact_average_and_identical_replicas(layout, n, cut, dtype):
    host_of = LAYOUTS[layout]
    p = len(host_of)
    counts, ranks = run_hierarchical(host_of, n, cut, dtype)
    avg = average([bucket(r, n, dtype) for r in range(p)])
    for r, (facts, blocks, gathered, _) in enumerate(ranks):
        assert facts == (p, len(counts), local_index(host_of, r))
        assert torch.equal(blocks[0], block_of(avg, counts, facts[2]).float().to(dtype))
        assert torch.equal(gathered[0], avg.float().to(dtype))


@pytest.mark.parametrize("layout", ["2x2", "2x3", "4x2"])
def test_replicas_are_bitwise_identical_on_inexact_data(layout):
    """Floats whose sums round: every replica of a block holds the same bits, and within the rounding
    of a few additions the exact average."""
    host_of = LAYOUTS[layout]
    p, n = len(host_of), 517
    counts, ranks = run_hierarchical(host_of, n, "ragged", torch.float32, exact=False)
    avg = average([bucket(r, n, torch.float32, exact=False) for r in range(p)])
    for r, (facts, blocks, gathered, _) in enumerate(ranks):
        for q, (other, oblocks, ogathered, _) in enumerate(ranks):
            if other[2] == facts[2]:
                assert torch.equal(blocks[0], oblocks[0])
            if host_of[q] == host_of[r]:
                assert torch.equal(gathered[0], ogathered[0])
        torch.testing.assert_close(gathered[0].double(), avg, rtol=0, atol=1e-6)


@pytest.mark.parametrize("compression", ["fp16", "int8+ef", "topk:0.1+ef"])
@pytest.mark.parametrize("layout", ["2x2", "4x2"])
def test_compressed_across_hosts(layout, compression):
    """The all-reduce across hosts is compressed: replicas still bitwise identical, the error bounded,
    and with error feedback the sum over steps tracks the exact sum (residuals under ``"cross"``)."""
    host_of = LAYOUTS[layout]
    p, n, steps = len(host_of), 301, 8
    counts, ranks = run_hierarchical(host_of, n, "ragged", torch.float32, compression=compression, exact=False,
                                     steps=steps)
    exact = [average([bucket(r, n, torch.float32, t, exact=False) for r in range(p)]) for t in range(steps)]
    for facts, blocks, _, state in ranks:
        replicas = [q for q, other in enumerate(ranks) if other[0][2] == facts[2]]
        for q in replicas:
            assert all(torch.equal(a, b) for a, b in zip(blocks, ranks[q][1]))
        ref = [block_of(e, counts, facts[2]) for e in exact]
        if ref[0].numel() == 0:
            continue
        scale = max(float(x.abs().max()) for x in ref)
        one_step = max(float((b.double() - x).abs().max()) for b, x in zip(blocks, ref))
        assert one_step <= (3.0 if compression.startswith("topk") else 0.05) * scale
        drift = float((sum(b.double() for b in blocks) - sum(ref)).abs().max())
        if compression.startswith("topk"):
            # One compression of each replica's whole block (top-k's gather): the steps' sum is the
            # exact sum less the replicas' last residuals, divided by world.
            kept = sum(ranks[q][3]["cross"]["residual"].double() for q in replicas)
            torch.testing.assert_close(sum(b.double() for b in blocks), sum(ref) - kept / p, rtol=1e-5, atol=1e-5)
        elif compression.endswith("+ef"):
            assert "cross" in state and drift <= 0.05 * scale  # bounded by the last residuals


def test_default_layout_is_the_jobs_hosts():
    """In-process ranks share one hostname: one host, so the reducer shards over everyone, as
    :class:`Reducer` does, and gives the same blocks."""
    n, p = 29, 3
    counts = counts_of(n, p, "ragged")

    def body(rank):
        red, base = HierarchicalReducer(), Reducer(Comm())
        assert (red.world, red.shard_size, red.shard_rank) == (base.world, base.shard_size, base.shard_rank)
        a = red.reduce_scatter_(bucket(rank, n, torch.float32), counts, "h").wait().clone()
        b = base.reduce_scatter_(bucket(rank, n, torch.float32), counts, "f").wait()
        exact = block_of(average([bucket(r, n, torch.float32) for r in range(p)]), counts, rank).float()
        return torch.equal(a, exact) and torch.allclose(a, b, rtol=1e-6, atol=0)

    assert run_world(p, body) == [True] * p


def test_a_sub_group_of_the_world():
    """The data-parallel group is ranks 1..4 of six; ranks outside it make the same groups and are
    refused."""
    import ringlet

    n = 11
    counts = counts_of(n, 2, "ragged")

    def body(rank):
        group = ringlet.new_group([1, 2, 3, 4])
        if rank not in group:
            with pytest.raises(ValueError, match="not a member"):
                HierarchicalReducer(group, host_of=(0, 0, 1, 1))
            return None
        red = HierarchicalReducer(group, host_of=(0, 0, 1, 1))
        assert (red.world, red.shard_size, red.shard_rank) == (4, 2, (rank - 1) % 2)
        return red.reduce_scatter_(bucket(rank, n, torch.float32), counts, "g", check=True).wait().clone()

    outs = run_world(6, body)
    avg = average([bucket(r, n, torch.float32) for r in range(1, 5)])
    assert outs[0] is None and outs[5] is None
    for r in range(1, 5):
        assert torch.equal(outs[r], block_of(avg, counts, (r - 1) % 2).float())


def test_hosts_layout_and_refusals():
    assert Hosts.of((0, 1, 2, 3), ("a", "b", "a", "b")).hosts == ((0, 2), (1, 3))
    assert Hosts.of((0, 1, 2, 3), (0, 0, 1, 1)).replicas() == ((0, 2), (1, 3))
    with pytest.raises(ValueError, match="same number of ranks on every host"):
        Hosts.of((0, 1, 2), (0, 0, 1))
    with pytest.raises(ValueError, match="one host label per rank"):
        Hosts.of((0, 1, 2), (0, 0))

    def body(rank):
        with pytest.raises(ValueError, match="same number of ranks on every host"):
            HierarchicalReducer(host_of=(0, 0, 1))
        with pytest.raises(ValueError, match="one host label per rank"):
            HierarchicalReducer(host_of=(0, 1))
        with pytest.raises(ValueError, match="own all-reduce schedule"):
            HierarchicalReducer(host_of=(0, 1, 2), compression="powersgd")
        red = HierarchicalReducer(host_of=(0, 1, 2), compression="int8+ef")
        with pytest.raises(ValueError, match="state"):
            red.reduce_scatter_(torch.zeros(4), [4], "x")
        with pytest.raises(ValueError, match="do not cut"):
            red.reduce_scatter_(torch.zeros(4), [2, 2], "x", {})
        return True

    assert run_world(3, body) == [True] * 3
