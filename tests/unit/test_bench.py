"""``ringlet bench``'s machinery in an in-process world: the correctness check catches a wrong
algorithm, busbw follows nccl-tests' factors, and the JSON/CSV files keep their schema."""
from __future__ import annotations

import csv
import json

import pytest
import torch
from conftest import run_world

import ringlet
from ringlet import algorithms
from ringlet.algorithms import ring
from ringlet.bench import SweepSpec, report, run_sweep
from ringlet.bench.sweep import implementations_for
from ringlet.benchmarking import busbw
from ringlet.types import ReduceOp


def _broken(p, n, host_of):
    """A ring that forgets its last all-gather step: some chunks stay partial sums on some ranks."""
    full = ring.allreduce(p, n)
    return algorithms.Schedule("broken", p, full.steps[:-1])


@pytest.fixture
def broken_registered(monkeypatch):
    monkeypatch.setitem(algorithms.ALLREDUCE, "broken", _broken)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_wrong_algorithm_is_reported(p, broken_registered):
    spec = SweepSpec(sizes=(64, 4096), implementations=("ringlet:ring", "ringlet:broken"), iters=2, warmup=1)
    rows = run_world(p, lambda r: run_sweep(spec))[0]
    by_impl = {(r.impl, r.size): r for r in rows}
    for size in (64, 4096):
        assert by_impl[("ringlet:ring", size)].oop_wrong == 0
        assert by_impl[("ringlet:ring", size)].ip_wrong == 0
        assert by_impl[("ringlet:broken", size)].oop_wrong > 0
        assert by_impl[("ringlet:broken", size)].ip_wrong > 0
    assert report.total_wrong(rows) > 0


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bfloat16, torch.uint8])
def test_every_collective_checks_clean(collective, dtype):
    spec = SweepSpec(sizes=(12, 1000), collectives=(collective,), implementations=("ringlet:auto",),
                     dtype=dtype, iters=1, warmup=0)
    rows = run_world(3, lambda r: run_sweep(spec))[0]
    assert rows and report.total_wrong(rows) == 0
    assert all(r.oop_busbw > 0 for r in rows)


@pytest.mark.parametrize("op", ["min", "max", "product", "avg"])
def test_ops_check_clean(op):
    spec = SweepSpec(sizes=(400,), implementations=("ringlet:ring", "ringlet:tree"), op=ReduceOp.parse(op),
                     iters=1, warmup=0)
    rows = run_world(4, lambda r: run_sweep(spec))[0]
    assert report.total_wrong(rows) == 0


def test_busbw_factors():
    # nccl-tests: allreduce 2(p-1)/p, allgather/reduce-scatter/alltoall (p-1)/p, broadcast 1
    assert busbw("allreduce", 4, 1000, 1.0) == pytest.approx(1500)
    assert busbw("allgather", 4, 1000, 1.0) == pytest.approx(750)
    assert busbw("reduce_scatter", 8, 800, 2.0) == pytest.approx(350)
    assert busbw("alltoall", 2, 1000, 1.0) == pytest.approx(500)
    assert busbw("broadcast", 5, 1000, 0.5) == pytest.approx(2000)


def test_other_collectives_collapse_to_one_ringlet_row():
    names = ("ringlet:ring", "ringlet:tree", "native", "mpi")
    assert implementations_for("allreduce", names) == list(names)
    assert implementations_for("allgather", names) == ["ringlet", "native", "mpi"]


def test_json_and_csv_schema(tmp_path):
    spec = SweepSpec(sizes=(8, 64), implementations=("ringlet:ring",), iters=1, warmup=0)
    rows = run_world(2, lambda r: run_sweep(spec))[0]
    report.write_json(str(tmp_path / "r.json"), rows, {"ranks": 2})
    report.write_csv(str(tmp_path / "r.csv"), rows)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["meta"] == {"ranks": 2}
    keys = {"collective", "impl", "size", "count", "dtype", "op", "oop_us", "oop_algbw", "oop_busbw", "oop_wrong",
            "ip_us", "ip_algbw", "ip_busbw", "ip_wrong"}
    assert keys <= set(data["rows"][0])
    with open(tmp_path / "r.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 2 and {"collective", "size", "impl", "oop_busbw", "oop_wrong"} <= set(table[0])
    assert [int(r["size"]) for r in table] == [8, 64]
    assert "out-of-place" in report.table(rows)


def test_plot_writes_png(tmp_path):
    spec = SweepSpec(sizes=(8, 64), implementations=("ringlet:ring",), iters=1, warmup=0)
    rows = run_world(2, lambda r: run_sweep(spec))[0]
    report.plot(str(tmp_path / "p.png"), rows, "t", link_gbps=0.125)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compression_sweep_measures_bytes_and_error():
    """In-process world of 3: bytes from the transport's counter (none: the ring's 2(p-1)/p of the buffer),
    PowerSGD on a near-square matrix (compressed, not summed flat), errors ordered as expected."""
    from ringlet.bench.impls import compressions, near_square
    from ringlet.bench.sweep import run_compression_sweep

    assert near_square(65536) == (256, 256) and near_square(12) == (3, 4) and near_square(7) == (1, 7)
    assert compressions("topk:0.01+ef,fp16,fp16") == ("none", "topk:0.01+ef", "fp16")
    assert compressions("all")[0] == "none" and "powersgd" in compressions("all")
    with pytest.raises(ValueError):
        compressions("fp8")
    spec = SweepSpec(sizes=(3 * 4096 * 4,), compressions=compressions("fp16,int8+ef,powersgd"), iters=2, warmup=1)
    rows = run_world(3, lambda r: run_compression_sweep(spec))
    assert [r.as_dict() for r in rows[0]] == [r.as_dict() for r in rows[1]]
    by = {r.compressor: r for r in rows[0]}
    n = 3 * 4096
    assert by["none"].sent == pytest.approx(2 * 2 / 3 * 4 * n, rel=0.01) and by["none"].ratio == 1.0
    assert by["fp16"].ratio == pytest.approx(0.5, abs=0.01)
    assert 0.25 < by["int8+ef"].ratio < 0.27
    assert by["powersgd"].ratio < 0.1
    assert by["none"].max_err < 1e-5 < by["fp16"].max_err < by["int8+ef"].max_err
    assert all(r.us > 0 and r.native == 0 for r in rows[0])
