"""benchmarks/moe/moe_table.py's arguments, scaling efficiency and table (the job itself runs under
``ringlet run``: ``--small`` on one host, the cluster run through ``moe_cluster.sh``)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("sklearn")  # the script imports examples/digits_data.py
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "moe" / "moe_table.py"


@pytest.fixture(scope="module")
def table_mod():
    spec = importlib.util.spec_from_file_location("moe_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    before = list(sys.path)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = before
    return mod


def _row(arm: str, rate: float, ranks: int, **extra) -> dict:
    mem = {"parameters": 10, "parameter_bytes": 40, "gradient_bytes": 40, "optimizer_bytes": 80,
           "profiled_peak_bytes": None}
    return {"arm": arm, "ranks": ranks, "samples_per_s": rate, "test_accuracy": None, "memory": mem, **extra}


def test_arguments(table_mod):
    small = table_mod.parse_args(["--small"])
    assert (small.d, small.layers, small.rounds, small.epochs) == (32, 2, 2, 1)
    assert table_mod.parse_args(["--small", "--epochs", "0"]).epochs == 0  # a flag given beats --small
    assert table_mod.parse_args(["--arms", "baseline,moe"]).arms == ["baseline", "moe"]
    for bad in (["--arms", "baseline,fifo"], ["--ff", "1023", "--k", "2"]):
        with pytest.raises(SystemExit):
            table_mod.parse_args(bad)


def test_scaling_and_table(table_mod, tmp_path):
    one = tmp_path / "np1.json"
    one.write_text(json.dumps({"results": [_row("baseline", 100.0, 1), _row("moe", 80.0, 1)]}))
    rows = [_row("baseline", 300.0, 4),
            _row("moe", 240.0, 4, time_vs_baseline=[1.2, 1.3], load_balance=1.5, dropped_share=0.1)]
    table_mod.scaling(rows, str(one), 4)
    assert rows[0]["scaling_efficiency"] == pytest.approx(0.75)
    assert rows[1]["scaling_efficiency"] == pytest.approx(0.75)
    assert rows[1]["scaling_vs_one_rank_baseline"] == pytest.approx(0.6)
    args = table_mod.parse_args([])
    text = table_mod.table(args, rows, 4).splitlines()
    assert len(text) == 4 and all(line.count("|") == 12 for line in text)
    assert "| 75% | 75% |" in text[2] and "| 75% | 60% |" in text[3]
    assert "1.250 ± 0.050" in text[3] and "1.50 | 10.00% |" in text[3] and "0.00 | - |" in text[2]
    one.write_text(json.dumps({"results": [_row("baseline", 100.0, 4)]}))
    with pytest.raises(SystemExit):
        table_mod.scaling(rows, str(one), 4)


def test_moe_blocks_start_different(table_mod):
    """The shared model (examples/train_moe.py's Net) seeds each MoE layer apart: no two blocks start with
    the same gate or experts (MoE's seed alone would make them identical)."""
    net = table_mod.Net(16, 2, 32, 3, dict(num_experts=4, ep_size=None, k=2, capacity_factor=1.25))
    gates = [m.gate.weight for m in net.moe_layers()]
    firsts = [m.experts[0][0].weight for m in net.moe_layers()]
    assert len(gates) == 3
    for i in range(3):
        for j in range(i):
            assert not torch.equal(gates[i], gates[j]) and not torch.equal(firsts[i], firsts[j])
