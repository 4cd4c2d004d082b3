"""ringlet.torch op semantics with ranks as threads, on integer-valued data (exact results): every op
against a reference, the spec's error table (each followed by a working op), fusion on/off
equivalence, join, process sets, grouped and sparse ops."""
from __future__ import annotations

import warnings
import zlib

import pytest
import torch
from hvd_world import hvd_world

import ringlet.torch as hvd
from ringlet.torch import mpi_ops


def data(key: str, rank: int, shape, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}|{rank}".encode()))
    n = 1
    for s in shape:
        n *= s
    return torch.randint(-3, 4, (n,), generator=g).to(dtype).reshape(shape)


def works_after(r, p) -> None:
    # Named: after rank-dependent code paths the per-process noname counters differ (as in Horovod).
    out = mpi_ops.allreduce(torch.ones(3), op=hvd.Sum, name="works_after")
    assert torch.equal(out, torch.full((3,), float(p))), out


@pytest.mark.parametrize("p", [2, 3])
def test_ops_against_reference(p):
    def body(r):
        res = {}
        for dt in (torch.float32, torch.int32, torch.int64, torch.float64):
            x = data(f"ar{dt}", r, (4, 5), dt)
            res[f"sum{dt}"] = mpi_ops.allreduce(x, op=hvd.Sum, name=f"s{dt}")
            res[f"avg{dt}"] = mpi_ops.allreduce(x, name=f"a{dt}")
            res[f"scaled{dt}"] = mpi_ops.allreduce(x, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5,
                                                   name=f"sc{dt}")
            res[f"max{dt}"] = mpi_ops.allreduce(x, op=hvd.Max)
            res[f"min{dt}"] = mpi_ops.allreduce(x, op=hvd.Min)
        y = data("inplace", r, (6,))
        assert mpi_ops.allreduce_(y, op=hvd.Sum) is y
        res["inplace"] = y
        res["gather"] = mpi_ops.allgather(data("ag", r, (r + 1, 3), torch.int16))
        res["gather0d"] = mpi_ops.allgather(torch.tensor(float(r)))
        for root in range(p):
            res[f"bcast{root}"] = mpi_ops.broadcast(data("bc", r, (2, 2)), root)
            z = data("bc_", r, (3,), torch.uint8 if root else torch.int8)
            mpi_ops.broadcast_(z, root)
            res[f"bcast_{root}"] = z
        splits = [(r + d) % 3 for d in range(p)]
        res["a2a"] = mpi_ops.alltoall(data("a2a", r, (sum(splits), 2)), splits=splits)
        res["a2a_even"] = mpi_ops.alltoall(data("a2ae", r, (2 * p,)))
        res["rs_sum"] = mpi_ops.reducescatter(data("rs", r, (2 * p + 1, 2)), op=hvd.Sum)
        res["rs_avg"] = mpi_ops.reducescatter(data("rs", r, (2 * p + 1, 2)))
        return res

    results = hvd_world(p, body)
    for r, res in enumerate(results):
        for dt in (torch.float32, torch.int32, torch.int64, torch.float64):
            xs = [data(f"ar{dt}", j, (4, 5), dt) for j in range(p)]
            s = sum(x.double() for x in xs)
            assert torch.equal(res[f"sum{dt}"], s.to(dt))
            # Average multiplies by 1/p in the tensor's dtype (floats) or in float64 then truncates (ints).
            avg = s.to(dt) * (1.0 / p) if dt.is_floating_point else torch.trunc(s * (1.0 / p)).to(dt)
            assert torch.equal(res[f"avg{dt}"], avg)
            pre = sum(torch.trunc(x.double() * 3.0) if not dt.is_floating_point else x.double() * 3 for x in xs)
            want = pre * 0.5 if dt.is_floating_point else torch.trunc(pre * 0.5)
            assert torch.equal(res[f"scaled{dt}"], want.to(dt))
            assert torch.equal(res[f"max{dt}"], torch.stack(xs).max(0).values)
            assert torch.equal(res[f"min{dt}"], torch.stack(xs).min(0).values)
        assert torch.equal(res["inplace"], sum(data("inplace", j, (6,)) for j in range(p)))
        assert torch.equal(res["gather"], torch.cat([data("ag", j, (j + 1, 3), torch.int16) for j in range(p)]))
        assert torch.equal(res["gather0d"], torch.arange(p, dtype=torch.float32))
        for root in range(p):
            assert torch.equal(res[f"bcast{root}"], data("bc", root, (2, 2)))
            assert torch.equal(res[f"bcast_{root}"], data("bc_", root, (3,), torch.uint8 if root else torch.int8))
        out, recv = res["a2a"]
        sp = [[(j + d) % 3 for d in range(p)] for j in range(p)]
        want = torch.cat([data("a2a", j, (sum(sp[j]), 2))[sum(sp[j][:r]):sum(sp[j][:r + 1])] for j in range(p)])
        assert torch.equal(out, want) and recv.tolist() == [sp[j][r] for j in range(p)]
        assert torch.equal(res["a2a_even"], torch.cat([data("a2ae", j, (2 * p,))[2 * r:2 * r + 2] for j in range(p)]))
        total = sum(data("rs", j, (2 * p + 1, 2)) for j in range(p))
        rows = [2 + (1 if k < 1 else 0) for k in range(p)]
        start = sum(rows[:r])
        assert torch.equal(res["rs_sum"], total[start:start + rows[r]])
        assert torch.equal(res["rs_avg"], total[start:start + rows[r]] * (1.0 / p))


MISMATCHES = {
    "shape": (lambda r: mpi_ops.allreduce(torch.ones((17 + r,) * 3), name="m"),
              "Mismatched allreduce tensor shapes: One rank sent a tensor of shape [17, 17, 17], but another "
              "rank sent a tensor of shape [18, 18, 18]."),
    "dtype": (lambda r: mpi_ops.allreduce(torch.ones(3, dtype=torch.float32 if r == 0 else torch.int32), name="m"),
              "Mismatched data types: One rank had type float32, but another rank had type int32."),
    "op": (lambda r: mpi_ops.allreduce(torch.ones(3), name="m", op=hvd.Sum if r == 0 else hvd.Max),
           "Mismatched allreduce reduction ops"),
    "root": (lambda r: mpi_ops.broadcast(torch.ones(3), r, name="m"), "Mismatched broadcast root ranks"),
    "prescale": (lambda r: mpi_ops.allreduce(torch.ones(3), name="m", prescale_factor=1.0 + r),
                 "Mismatched prescale factors"),
    "postscale": (lambda r: mpi_ops.allreduce(torch.ones(3), name="m", postscale_factor=1.0 + r),
                  "Mismatched postscale factors"),
    "allgather dims": (lambda r: mpi_ops.allgather(torch.ones(2, 2 + r), name="m"),
                       "Mismatched allgather tensor shapes"),
    "reducescatter shape": (lambda r: mpi_ops.reducescatter(torch.ones(4 + r, 2), name="m"),
                            "Mismatched reducescatter tensor shapes"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_mismatch_raises_on_every_rank_then_next_op_works(case):
    fn, message = MISMATCHES[case]

    def body(r):
        with pytest.raises(hvd.HorovodInternalError) as info:
            fn(r)
        works_after(r, 2)
        return str(info.value)

    for msg in hvd_world(2, body):
        assert msg.startswith(message), msg


def test_local_argument_errors_then_next_op_works():
    def body(r):
        with pytest.raises(ValueError, match="Tensor type .* is not supported"):
            hvd.allreduce_async(torch.ones(3, dtype=torch.int8))
        with pytest.raises(ValueError, match="Tensor type .* is not supported"):
            hvd.allgather_async(torch.ones(3, dtype=torch.bool))
        with pytest.raises(ValueError, match="Tensor is required to be contiguous"):
            hvd.allreduce_async(torch.ones(4, 4).t())
        with pytest.raises(ValueError, match="splits"):
            hvd.alltoall_async(torch.ones(5), splits=[1, 1])
        with pytest.raises(ValueError, match="splits"):
            hvd.alltoall_async(torch.ones(5), splits=[1, -1, 5])
        with pytest.raises(ValueError, match="divisible"):
            hvd.alltoall_async(torch.ones(4))
        with pytest.raises(ValueError, match="scalar"):
            hvd.reducescatter_async(torch.tensor(1.0))
        with pytest.raises(ValueError, match="root rank"):
            hvd.broadcast_async(torch.ones(2), 7)
        with pytest.raises(hvd.HorovodInternalError, match="Sum and Average"):
            hvd.reducescatter_async(torch.ones(3), op=hvd.Max)
        with pytest.raises(NotImplementedError, match="Adasum"):
            hvd.allreduce_async(torch.ones(3), op=hvd.Adasum)
        with pytest.raises(ValueError, match="only one"):
            hvd.allreduce_async(torch.ones(3), average=True, op=hvd.Sum)
        ps = hvd.add_process_set([0, 1])
        if r == 2:
            with pytest.raises(ValueError, match="not a member"):
                hvd.allreduce_async(torch.ones(3), process_set=ps)
        works_after(r, 3)
        hvd.remove_process_set(ps)

    hvd_world(3, body)


def test_average_is_deprecated():
    # warnings.catch_warnings is process-wide, so this runs in a world of one (no rank threads).
    hvd.init()
    try:
        with pytest.warns(DeprecationWarning):
            out = mpi_ops.allreduce(torch.ones(2), average=False)
        assert torch.equal(out, torch.ones(2))
    finally:
        hvd.shutdown()


@pytest.mark.parametrize("threshold", ["0", "64", str(128 << 20)])
def test_fusion_on_and_off_give_identical_results(monkeypatch, threshold):
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", threshold)
    from ringlet.torch import execute

    fused_calls = []
    orig = execute.Runner._allreduce_fused
    monkeypatch.setattr(execute.Runner, "_allreduce_fused",
                        lambda self, g, items, outs: (fused_calls.append(len(items)), orig(self, g, items, outs)))
    shapes = [(3,), (5, 2), (1,), (7,), (2, 2, 2), (11,)]

    def body(r):
        xs = [data(f"f{i}", r, s, dt) for i, s in enumerate(shapes) for dt in (torch.float32, torch.int64)]
        hs = [hvd.allreduce_async(x, name=f"f{i}", op=hvd.Sum, prescale_factor=2.0) for i, x in enumerate(xs)]
        return [hvd.synchronize(h) for h in hs]

    for res in hvd_world(2, body):
        i = 0
        for k, s in enumerate(shapes):
            for dt in (torch.float32, torch.int64):
                assert torch.equal(res[i], sum(2 * data(f"f{k}", j, s, dt) for j in range(2)))
                i += 1
    if threshold == "0":
        assert not fused_calls
    else:
        assert fused_calls and max(fused_calls) > 1


def test_join_contributes_zeros_and_returns_last_rank():
    def body(r):
        if r == 2:
            last = hvd.join()
            return last, None, None
        s = mpi_ops.allreduce(torch.full((4,), float(r + 1)), op=hvd.Sum, name="j1")
        a = mpi_ops.allreduce(torch.full((4,), float(3 * (r + 1))), name="j2")  # Average over all 3 ranks
        with pytest.raises(hvd.HorovodInternalError, match="joined"):
            mpi_ops.allgather(torch.ones(1), name="j3")
        if r == 0:
            import time
            time.sleep(0.2)
        return hvd.join(), s, a

    res = hvd_world(3, body)
    assert [x[0] for x in res] == [0, 0, 0]
    for r in (0, 1):
        assert torch.equal(res[r][1], torch.full((4,), 3.0))
        assert torch.equal(res[r][2], torch.full((4,), 3.0))


@pytest.mark.parametrize("first", [0, 1])
def test_unnamed_ops_match_again_after_join(first):
    """The joined rank skips the others' unnamed all-reduces (its noname counter falls behind); after join()
    every rank resumes numbering at the same place, so unnamed ops and allgather_object match."""
    def body(r):
        if r != first:
            for _ in range(3):
                mpi_ops.allreduce(torch.ones(2))
        hvd.join()
        return hvd.allgather_object(r), mpi_ops.allreduce(torch.full((2,), float(r)), op=hvd.Sum)

    for objs, total in hvd_world(2, body):
        assert objs == [0, 1] and torch.equal(total, torch.ones(2))


def test_process_sets_and_barrier_of_a_subset():
    def body(r):
        even = hvd.add_process_set(hvd.ProcessSet([0, 2]))
        odd = hvd.add_process_set([1])
        assert (even.process_set_id, odd.process_set_id) == (1, 2)
        out = None
        if even.included():
            hvd.barrier(process_set=even)  # rank 1 never enters it
            out = mpi_ops.allreduce(torch.full((2,), float(r)), op=hvd.Sum, process_set=even, name="ev")
            assert even.size() == 2 and even.rank() == r // 2
            b = mpi_ops.broadcast(torch.full((1,), float(r)), 2, process_set=even)
            assert b.item() == 2.0
            g = mpi_ops.allgather(torch.full((1,), float(r)), process_set=even)
            assert g.tolist() == [0.0, 2.0]
        else:
            assert not even.included()
            with pytest.raises(ValueError):
                even.rank()
            out = mpi_ops.allreduce(torch.ones(2), op=hvd.Sum, process_set=odd)
        hvd.barrier()
        assert hvd.remove_process_set(even) and hvd.remove_process_set(odd)
        works_after(r, 3)
        return out

    res = hvd_world(3, body)
    assert torch.equal(res[0], torch.full((2,), 2.0)) and torch.equal(res[2], res[0])
    assert torch.equal(res[1], torch.ones(2))


def test_init_with_process_sets():
    from conftest import run_world

    def body(r):
        ps = hvd.ProcessSet([0, 1])
        hvd.init(process_sets=[ps])
        try:
            return ps.process_set_id, mpi_ops.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps).item()
        finally:
            hvd.shutdown()

    assert run_world(2, body) == [(1, 2.0), (1, 2.0)]


def test_grouped_ops():
    def body(r):
        xs = [data(f"g{i}", r, (i + 1, 2)) for i in range(3)]
        red = mpi_ops.grouped_allreduce(xs, op=hvd.Sum, name="grp")
        ys = [x.clone() for x in xs]
        assert mpi_ops.grouped_allreduce_(ys, op=hvd.Sum) == ys
        gat = mpi_ops.grouped_allgather(xs)
        rs = mpi_ops.grouped_reducescatter(xs, op=hvd.Sum)
        empty = hvd.synchronize(hvd.grouped_allreduce_async([]))
        return red, ys, gat, rs, empty

    for r, (red, ys, gat, rs, empty) in enumerate(hvd_world(2, body)):
        for i in range(3):
            total = data(f"g{i}", 0, (i + 1, 2)) + data(f"g{i}", 1, (i + 1, 2))
            assert torch.equal(red[i], total) and torch.equal(ys[i], total)
            assert torch.equal(gat[i], torch.cat([data(f"g{i}", j, (i + 1, 2)) for j in range(2)]))
            rows = [(i + 1) // 2 + (1 if k < (i + 1) % 2 else 0) for k in range(2)]
            assert torch.equal(rs[i], total[sum(rows[:r]):sum(rows[:r + 1])])
        assert empty == []


def test_sparse_allreduce():
    def body(r):
        dense = torch.zeros(4, 3)
        dense[r, :] = r + 1.0
        dense[3, 0] = 1.0
        sp = dense.to_sparse()
        out = hvd.sparse_allreduce_async(sp, name="emb", op=hvd.Sum)()
        avg = hvd.sparse_allreduce_async(sp, name="emb2", op=hvd.Average)()
        return out.to_dense(), avg.to_dense()

    for out, avg in hvd_world(2, body):
        want = torch.zeros(4, 3)
        want[0, :], want[1, :], want[3, 0] = 1.0, 2.0, 2.0
        assert torch.equal(out, want) and torch.equal(avg, want / 2)


def test_timeline_records_per_tensor_phases(tmp_path):
    from ringlet import timeline

    timeline.start_timeline(str(tmp_path / "trace{rank}.json"))
    try:
        def body(r):
            # One submission per rank: the three members become ready in the same round, hence fused.
            hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(8)] * 3, name="tl"))
            mpi_ops.allgather(torch.ones(2), name="tlg")

        hvd_world(2, body)
    finally:
        timeline.stop_timeline()
    (path,) = tmp_path.glob("trace*.json")
    spans = {(e.get("name"), e.get("tid")) for e in timeline.read_events(str(path)) if e.get("ph") == "X"}
    phases = {name for name, _ in spans}
    assert {"NEGOTIATE", "QUEUE", "COMMUNICATE"} <= phases, phases
    assert "FUSE" in phases  # three ready all-reduces of one dtype were fused
