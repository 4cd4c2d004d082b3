"""The other collectives through the public API in in-process worlds of 1..8 ranks, against the
reference: broadcast, reduce, ragged allgather, reduce_scatter, alltoall with splits, barrier,
sub-groups, async handles, in-place variants and scale factors."""
from __future__ import annotations

import threading

import pytest
import torch
from conftest import OPS, make_input, run_world

import ringlet
from ringlet.algorithms import ALLTOALL, reference
from ringlet.types import ReduceOp

WORLDS = range(1, 9)


def assert_all_equal(got, expected, label=""):
    assert len(got) == len(expected)
    for r, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype and g.shape == e.shape, f"{label} rank {r}: {g.dtype}{tuple(g.shape)} vs {tuple(e.shape)}"
        assert torch.equal(g, e), f"{label} rank {r}: {g} != {e}"


@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_broadcast_every_root(p, lazy):
    cases = [(dtype, shape, root) for dtype in (torch.bfloat16, torch.int64) for shape in ((3, 5), (0,), ())
             for root in range(p)]
    inputs = {c: [make_input(r, torch.Size(c[1]).numel(), c[0], seed=c[2]).reshape(c[1]) for r in range(p)]
              for c in cases}

    def fn(rank):
        outs = []
        for c in cases:
            t = inputs[c][rank]
            outs.append(ringlet.broadcast(t, root_rank=c[2]))
            inplace = t.clone()
            same = ringlet.broadcast_(inplace, c[2])
            assert same is inplace
            outs.append(inplace)
        return outs

    res = run_world(p, fn, lazy=lazy)
    for i, c in enumerate(cases):
        expected = reference.broadcast(inputs[c], c[2])
        assert_all_equal([res[r][2 * i] for r in range(p)], expected, f"broadcast {c}")
        assert_all_equal([res[r][2 * i + 1] for r in range(p)], expected, f"broadcast_ {c}")


@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_reduce_every_root_and_op(p, lazy):
    cases = [(op, root) for op in OPS for root in range(p)]
    inputs = {c: [make_input(r, 10, torch.int32, c[0], seed=c[1]).reshape(2, 5) for r in range(p)] for c in cases}

    def fn(rank):
        outs = []
        for op, root in cases:
            t = inputs[(op, root)][rank]
            outs.append(ringlet.reduce(t, root, op=op))
            buf = t.clone()
            assert ringlet.reduce_(buf, root, op=op) is buf
            outs.append(buf)
        return outs

    res = run_world(p, fn, lazy=lazy)
    for i, (op, root) in enumerate(cases):
        expected = reference.reduce_to_root(inputs[(op, root)], root, op)
        assert torch.equal(res[root][2 * i], expected[root]), f"reduce {op.name} root {root}"
        assert torch.equal(res[root][2 * i + 1], expected[root])  # in place: only the root is specified


@pytest.mark.parametrize("p", [4, 7])
def test_reduce_returns_input_on_non_roots(p):
    inputs = [make_input(r, 6, torch.int64) for r in range(p)]
    res = run_world(p, lambda rank: ringlet.reduce(inputs[rank], 0))
    assert_all_equal(res, reference.reduce_to_root(inputs, 0), "reduce")


@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("algorithm", ["ring", "direct"])
def test_allgather_ragged(p, lazy, algorithm):
    layouts = {
        "ragged": [(r * 2) % 3 for r in range(p)],  # zeros on some ranks
        "all_zero": [0] * p,
        "one_row": [1] * p,
        "only_last": [0] * (p - 1) + [4],
    }
    inputs = {name: [make_input(r, rows * 3, torch.float16, seed=rows).reshape(rows, 3) for r, rows in enumerate(lay)]
              for name, lay in layouts.items()}
    inputs["vector"] = [make_input(r, r + 1, torch.int16) for r in range(p)]
    names = list(inputs)

    def fn(rank):
        outs = [ringlet.allgather(inputs[name][rank], algorithm=algorithm) for name in names]
        outs.append(ringlet.allgather_async(inputs["ragged"][rank], algorithm=algorithm).wait())
        # Sizes known to every caller: without the exchange (check=False) and verified (check on).
        for check in (False, None):
            outs += [ringlet.allgather(inputs[name][rank], algorithm=algorithm, sizes=layouts[name], check=check)
                     for name in layouts]
            outs.append(ringlet.allgather_async(inputs["ragged"][rank], algorithm=algorithm,
                                                sizes=layouts["ragged"], check=check).wait())
        return outs

    res = run_world(p, fn, lazy=lazy)
    for i, name in enumerate(names):
        ins = inputs[name]
        expected = reference.allgather(ins)
        assert_all_equal([res[r][i] for r in range(p)], expected, f"allgather {name}")
    assert_all_equal([res[r][len(names)] for r in range(p)], reference.allgather(inputs["ragged"]), "allgather_async")
    sized = list(layouts) + ["ragged"]
    for i, name in enumerate(sized + sized):
        assert_all_equal([res[r][len(names) + 1 + i] for r in range(p)], reference.allgather(inputs[name]),
                         f"allgather {name} with sizes")


@pytest.mark.parametrize("p", [2, 3])
def test_allgather_sizes_that_do_not_match_raise_and_the_next_op_works(p):
    def fn(rank):
        t = torch.full((rank + 1, 2), float(rank))
        with pytest.raises(ValueError, match="this rank's"):
            ringlet.allgather(t, sizes=[1] * (p + 1))  # wrong length: raised before any data moves
        wrong = [r + 1 for r in range(p)]
        wrong[-1] += rank == 0  # only rank 0's list is wrong: it raises, the others get the data
        try:
            got = ringlet.allgather(t, sizes=wrong)
        except ValueError as e:
            got = e
        return got, ringlet.allgather(t, sizes=[r + 1 for r in range(p)], check=False)

    res = run_world(p, fn)
    expected = reference.allgather([torch.full((r + 1, 2), float(r)) for r in range(p)])
    assert isinstance(res[0][0], ValueError) and "first dimensions are" in str(res[0][0])
    assert_all_equal([res[r][0] for r in range(1, p)], expected[1:], "allgather, right sizes")
    assert_all_equal([res[r][1] for r in range(p)], expected, "allgather after the error")


def test_allgather_unknown_algorithm_is_a_clear_error():
    res = run_world(1, lambda rank: pytest.raises(ValueError, ringlet.allgather, torch.ones(2), algorithm="tree"))
    assert "unknown all-gather algorithm" in str(res[0].value)


@pytest.mark.parametrize("p", [2, 5])
def test_allgather_scalars_are_one_row_each(p):
    res = run_world(p, lambda rank: ringlet.allgather(torch.tensor(rank * 10, dtype=torch.int64)))
    ins = [torch.tensor(r * 10, dtype=torch.int64) for r in range(p)]
    assert_all_equal(res, reference.allgather(ins), "allgather 0-d")


@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_reduce_scatter_horovod_split(p, lazy):
    cases = [(rows, op) for rows in (1, p, 2 * p + 1, 7) for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX)]
    inputs = {c: [make_input(r, c[0] * 3, torch.float64, c[1], seed=c[0]).reshape(c[0], 3) for r in range(p)]
              for c in cases}

    def fn(rank):
        outs = [ringlet.reduce_scatter(inputs[c][rank], op=c[1]) for c in cases]
        outs.append(ringlet.reduce_scatter_async(inputs[cases[0]][rank], op=cases[0][1]).wait())
        return outs

    res = run_world(p, fn, lazy=lazy)
    for i, (rows, op) in enumerate(cases):
        expected = reference.reduce_scatter(inputs[(rows, op)], op)
        assert [e.shape[0] for e in expected] == [rows // p + (r < rows % p) for r in range(p)]
        assert_all_equal([res[r][i] for r in range(p)], expected, f"reduce_scatter rows={rows} {op.name}")
    assert_all_equal([res[r][-1] for r in range(p)], reference.reduce_scatter(inputs[cases[0]], cases[0][1]))


@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_alltoall_with_splits(p, lazy):
    splits = [[(r + 2 * d) % 3 for d in range(p)] for r in range(p)]  # includes zeros
    inputs = [make_input(r, sum(splits[r]) * 2, torch.int32).reshape(-1, 2) for r in range(p)]
    even = [make_input(r, 2 * p, torch.float32, seed=1) for r in range(p)]

    def fn(rank):
        out, recv = ringlet.alltoall(inputs[rank], splits=splits[rank])
        out2, recv2 = ringlet.alltoall(even[rank])
        out3, recv3 = ringlet.alltoall_async(inputs[rank], splits=torch.tensor(splits[rank])).wait()
        # Every schedule by name (tests/unit/test_alltoall.py checks them in depth).
        named = [ringlet.alltoall_async(inputs[rank], splits[rank], None, algo).wait()[0] for algo in ALLTOALL]
        return out, recv, out2, recv2, out3, recv3, named

    res = run_world(p, fn, lazy=lazy)
    expected = reference.alltoall(inputs, splits)
    assert_all_equal([x[0] for x in res], expected, "alltoall")
    assert_all_equal([x[4] for x in res], expected, "alltoall_async")
    for i, algo in enumerate(ALLTOALL):
        assert_all_equal([x[6][i] for x in res], expected, f"alltoall {algo}")
    for d in range(p):
        assert list(res[d][1]) == [splits[s][d] for s in range(p)]
        assert list(res[d][5]) == [splits[s][d] for s in range(p)]
    assert_all_equal([x[2] for x in res], reference.alltoall(even, [[2] * p] * p), "alltoall even")


@pytest.mark.parametrize("p", WORLDS)
def test_barrier(p):
    arrived: list[int] = []
    lock = threading.Lock()

    def fn(rank):
        seen = []
        for round_ in range(3):
            with lock:
                arrived.append(rank)
            ringlet.barrier() if round_ % 2 == 0 else ringlet.barrier_async().wait()
            with lock:
                seen.append(len(arrived))
            ringlet.barrier()  # nobody starts the next round before everyone has looked
        return seen

    res = run_world(p, fn)
    for seen in res:
        assert seen == [p, 2 * p, 3 * p]


@pytest.mark.parametrize("p", WORLDS)
def test_sub_groups(p):
    evens, odds = list(range(0, p, 2)), list(range(1, p, 2))
    last_two = list(range(max(0, p - 2), p))

    def fn(rank):
        g_even = ringlet.new_group(evens)
        g_odd = ringlet.new_group(odds) if odds else None
        g_tail = ringlet.new_group(last_two)
        x = torch.full((5,), float(rank + 1))
        out = {}
        mine, g = (evens, g_even) if rank % 2 == 0 else (odds, g_odd)
        for algo in ("ring", "tree", "halving_doubling", "torus", "hierarchical"):
            out[algo] = ringlet.allreduce(x, algorithm=algo, group=g)
        out["bcast"] = ringlet.broadcast(x, root_rank=mine[-1], group=g)
        out["gather"] = ringlet.allgather(torch.tensor([rank]), group=g)
        if rank in last_two:
            out["tail"] = ringlet.allreduce_async(x, op="max", group=g_tail).wait()
            ringlet.barrier(group=g_tail)
        out["world"] = ringlet.allreduce(x)  # the world group still works, tags do not collide
        return out

    res = run_world(p, fn)
    for rank, out in enumerate(res):
        mine = evens if rank % 2 == 0 else odds
        total = float(sum(r + 1 for r in mine))
        for algo in ("ring", "tree", "halving_doubling", "torus", "hierarchical"):
            assert torch.equal(out[algo], torch.full((5,), total)), (rank, algo)
        assert torch.equal(out["bcast"], torch.full((5,), float(mine[-1] + 1)))
        assert out["gather"].tolist() == mine
        if rank in last_two:
            assert torch.equal(out["tail"], torch.full((5,), float(last_two[-1] + 1)))
        assert torch.equal(out["world"], torch.full((5,), float(p * (p + 1) // 2)))


@pytest.mark.parametrize("p", WORLDS)
def test_async_handles_in_flight(p):
    sizes = (1, 1000, 0, 70000, 3)
    algos = ("ring", "tree", "halving_doubling", "auto", "torus")
    inputs = [[make_input(r, n, torch.float32, seed=i) for i, n in enumerate(sizes)] for r in range(p)]

    def fn(rank):
        handles = [ringlet.allreduce_async(t, algorithm=a) for t, a in zip(inputs[rank], algos)]
        bh = ringlet.broadcast_async(inputs[rank][1], 0)
        sync = ringlet.allreduce(inputs[rank][4], op="min")  # queued behind the asyncs, same order everywhere
        results = [h.wait() for h in reversed(handles)][::-1]
        assert all(h.done() for h in handles)
        buf = inputs[rank][1].clone()
        hi = ringlet.allreduce_async_(buf, op="max")
        assert hi.wait() is buf
        return results, bh.wait(), sync, buf

    res = run_world(p, fn)
    for i in range(len(sizes)):
        assert_all_equal([x[0][i] for x in res], reference.allreduce([inputs[r][i] for r in range(p)]), f"async {i}")
    assert_all_equal([x[1] for x in res], reference.broadcast([inputs[r][1] for r in range(p)], 0))
    assert_all_equal([x[2] for x in res], reference.allreduce([inputs[r][4] for r in range(p)], ReduceOp.MIN))
    assert_all_equal([x[3] for x in res], reference.allreduce([inputs[r][1] for r in range(p)], ReduceOp.MAX))


@pytest.mark.parametrize("p", WORLDS)
def test_inplace_variants(p):
    inputs = [make_input(r, 12, torch.int16).reshape(3, 4) for r in range(p)]

    def fn(rank):
        t = inputs[rank].clone()
        out = ringlet.allreduce_(t, op="sum")
        assert out is t
        b = inputs[rank].clone()
        assert ringlet.broadcast_async_(b, p - 1).wait() is b
        return t, b

    res = run_world(p, fn)
    assert_all_equal([x[0] for x in res], reference.allreduce(inputs), "allreduce_")
    assert_all_equal([x[1] for x in res], reference.broadcast(inputs, p - 1), "broadcast_async_")


@pytest.mark.parametrize("p", WORLDS)
def test_scale_factors(p):
    cases = [(dtype, op, pre, post) for dtype in (torch.float32, torch.float16, torch.int32, torch.uint8)
             for op in (ReduceOp.SUM, ReduceOp.AVG) for pre, post in ((2.0, 0.5), (1.0, 3.0), (0.5, 1.0))]
    inputs = {c: [make_input(r, 9, c[0], c[1]) for r in range(p)] for c in cases}

    def fn(rank):
        return [ringlet.allreduce(inputs[c][rank], op=c[1], prescale_factor=c[2], postscale_factor=c[3])
                for c in cases]

    res = run_world(p, fn)
    for i, (dtype, op, pre, post) in enumerate(cases):
        expected = reference.allreduce(inputs[(dtype, op, pre, post)], op, pre, post)
        assert_all_equal([x[i] for x in res], expected, f"scale {dtype} {op.name} pre={pre} post={post}")
    # reduce_scatter takes the same factors (floats: exact with powers of two)
    ins = [make_input(r, 2 * p * 3, torch.float64).reshape(2 * p, 3) for r in range(p)]
    rs = run_world(p, lambda rank: ringlet.reduce_scatter(ins[rank], op="avg", prescale_factor=4.0,
                                                          postscale_factor=0.5))
    scaled = reference.reduce_scatter([t * 4.0 for t in ins], ReduceOp.AVG)
    assert_all_equal(rs, [t * 0.5 for t in scaled], "reduce_scatter scale")


def test_rank_and_size_queries():
    res = run_world(4, lambda rank: (ringlet.rank(), ringlet.size(), ringlet.local_rank(), ringlet.local_size(),
                                     ringlet.cross_rank(), ringlet.cross_size()))
    assert res == [(r, 4, r, 4, 0, 1) for r in range(4)]


@pytest.mark.parametrize("p", [1, 3])
def test_a_queued_job_may_run_collectives_of_its_own(p):
    """A job on the communication thread (as DDP's factor gather) issues synchronous collectives: they
    run inline, in the job's place in the queue, instead of waiting behind the job forever."""
    from ringlet.torch.comm import Comm

    def fn(rank):
        comm = Comm()
        before = ringlet.allreduce_async(torch.tensor([1.0]))  # queued ahead of the job
        job = comm.submit(lambda: (ringlet.allgather(torch.tensor([rank])),
                                   ringlet.allreduce(torch.tensor([float(rank)]))))
        after = ringlet.allreduce_async(torch.tensor([2.0]))
        gathered, total = job.wait()
        return before.wait(), gathered, total, after.wait()

    for before, gathered, total, after in run_world(p, fn):
        assert before.item() == p and after.item() == 2 * p
        assert gathered.tolist() == list(range(p)) and total.item() == sum(range(p))
