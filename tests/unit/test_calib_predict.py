"""``ringlet bench --predict``: predictions beside the measured rows (with a stand-in cost model), and
``benchmarks/cost_model/prediction_error.py``'s table from bench JSON."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ringlet.bench import predict
from ringlet.bench.sweep import Row
from ringlet.tuning.network import INTER, INTRA, LinkCost, Network, Topology

NET = Network({INTRA: LinkCost(10e-6, 0.1e-9), INTER: LinkCost(100e-6, 1e-9)}, 0.05e-9)
TOPO = Topology.uniform(4, 2)
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class FakePrediction:
    seconds: float


def stand_in(calls: list):
    """A predict_allreduce with the cost API's signature: 2 steps of alpha + bytes beta (inter)."""
    def predict_allreduce(algorithm, nbytes, topology, network, *, itemsize=4, segment_bytes=None, checked=False):
        calls.append((algorithm, nbytes, topology, network, itemsize, segment_bytes, checked))
        if algorithm == "unknown":
            raise ValueError("no such algorithm")
        return FakePrediction(2 * (network[INTER].alpha + nbytes * network[INTER].beta))
    return predict_allreduce


def row(impl: str, size: int, ip_us: float, oop_us: float = 1.0, collective: str = "allreduce") -> Row:
    return Row(collective, impl, size, size // 4, "float32", "sum", oop_us=oop_us, ip_us=ip_us)


@pytest.mark.parametrize("size", [0, 4, 4093 * 4, 1 << 20, 256 << 20])
def test_predictions_go_into_the_rows(size):
    calls = []
    expected_us = 2 * (100e-6 + size * 1e-9) * 1e6
    rows = [row("ringlet:ring", size, ip_us=expected_us * 1.25), row("ringlet:tree", size, ip_us=expected_us),
            row("ringlet:auto", size, 5.0), row("native", size, 5.0), row("ringlet:unknown", size, 5.0),
            row("ringlet:ring", size, 5.0, collective="allgather")]
    setup = predict.PredictionSetup(NET, TOPO, 4, stand_in(calls), lambda algo, nbytes: 1 << 20)
    n = predict.add_predictions(rows, setup)
    assert n == 2
    assert [c[0] for c in calls] == ["ring", "tree", "unknown"]
    assert all(c[1] == size and c[2] is TOPO and c[3] is NET and c[4:] == (4, 1 << 20, False) for c in calls)
    ring, tree = rows[0].extra, rows[1].extra
    assert ring["predicted_us"] == pytest.approx(expected_us) and ring["pred_err"] == pytest.approx(-0.2)
    assert tree["pred_err"] == pytest.approx(0.0, abs=1e-12) and tree["pred_against"] == "ip_us"
    assert tree["pred_segment_bytes"] == 1 << 20
    assert all("predicted_us" not in r.extra for r in rows[2:])
    text = predict.table(rows)
    assert "ring" in text and "-20.0" in text and "auto" not in text


def test_out_of_place_time_when_there_is_no_in_place_one():
    r = row("ringlet:ring", 1024, ip_us=math.nan, oop_us=400.0)
    predict.add_predictions([r], predict.PredictionSetup(NET, TOPO, 4, stand_in([]), lambda algo, nbytes: None))
    assert r.extra["pred_against"] == "oop_us"
    assert r.extra["pred_err"] == pytest.approx((2 * (100e-6 + 1024e-9) * 1e6 - 400.0) / 400.0)


def test_the_segment_is_the_runtimes_without_a_model():
    seg = predict.executor_segment(4 << 20, (0, 0, 1, 1), 4)
    assert seg("ring", 1 << 30) == 4 << 20 and seg("tree", 4) == 4 << 20
    capped = predict.executor_segment(4 << 20, (0, 0, 1, 1), 4, 1 << 20)  # the transport's cap (MPI)
    assert capped("ring", 1 << 30) == 1 << 20


def test_the_segment_is_the_models_choice(monkeypatch):
    from ringlet.tuning import select

    asked = []

    @dataclass(frozen=True)
    class Choice:
        algorithm: str
        segment_bytes: int | None

    def allreduce_choice(name, p, nbytes, host_of, caps, model, itemsize):
        asked.append((name, p, nbytes, host_of, model, itemsize))
        return Choice(name, None if nbytes < 1024 else 256 << 10)

    model = object()
    monkeypatch.setattr(select, "allreduce_choice", allreduce_choice)
    seg = predict.executor_segment(4 << 20, (0, 0, 1, 1), 2, model=model)
    assert seg("ring", 1 << 20) == 256 << 10 and seg("tree", 4) == 4 << 20
    assert asked == [("ring", 4, 1 << 20, (0, 0, 1, 1), model, 2), ("tree", 4, 4, (0, 0, 1, 1), model, 2)]


def test_without_the_cost_model_there_is_no_predictor(monkeypatch):
    monkeypatch.setitem(sys.modules, "ringlet.tuning.cost", None)  # import fails
    assert predict.default_predictor() is None


def test_algorithm_of():
    assert predict.algorithm_of(row("ringlet:halving_doubling", 4, 1.0)) == "halving_doubling"
    assert predict.algorithm_of(row("ringlet:auto", 4, 1.0)) is None
    assert predict.algorithm_of(row("mpi", 4, 1.0)) is None
    assert predict.algorithm_of(row("ringlet:ring", 4, 1.0, collective="broadcast")) is None


# ---- benchmarks/cost_model/prediction_error.py ----------------------------------------------------
def _script():
    path = ROOT / "benchmarks" / "cost_model" / "prediction_error.py"
    spec = importlib.util.spec_from_file_location("prediction_error", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["prediction_error"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _bench_json(path: Path, errors: dict[tuple[str, int], float], meta=None) -> str:
    rows = [{"collective": "allreduce", "impl": f"ringlet:{a}", "size": s, "extra": {"pred_err": e}}
            for (a, s), e in errors.items()]
    rows.append({"collective": "allreduce", "impl": "native", "size": 4, "extra": {}})
    path.write_text(json.dumps({"meta": meta or {"ranks": 4, "hosts": 2, "transport": "torch"}, "rows": rows}))
    return str(path)


def test_prediction_error_table(tmp_path):
    mod = _script()
    a = _bench_json(tmp_path / "a.json", {("ring", 4): 0.30, ("ring", 1024): -0.10, ("ring", 1 << 20): 0.05,
                                          ("ring", 16 << 20): -0.07, ("tree", 4): 0.5, ("tree", 4 << 20): math.nan})
    b = _bench_json(tmp_path / "b.json", {("ring", 4): 0.01, ("ring", 1 << 20): 0.01})
    out = tmp_path / "table.md"
    assert mod.main([a + ":2 hosts x 2, 1 Gbit/s", b, "--out", str(out), "--command", "ringlet bench --predict auto"]) == 0
    text = out.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert "ringlet bench --predict auto" in text
    assert lines[1] == "| 2 hosts x 2, 1 Gbit/s | ring | 4 | 6.0 | 7.0 | 20.0 | 30.0 | yes |"
    assert lines[2] == "| 2 hosts x 2, 1 Gbit/s | tree | 1 | n/a | n/a | 50.0 | 50.0 | no |"
    assert lines[3] == "| 4 ranks on 2 host(s), torch | ring | 2 | 1.0 | 1.0 | 1.0 | 1.0 | yes |"


def test_prediction_error_refuses_a_file_without_predictions(tmp_path):
    mod = _script()
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({"meta": {}, "rows": [{"collective": "allreduce", "impl": "ringlet:ring", "size": 4,
                                                       "extra": {}}]}))
    with pytest.raises(ValueError, match="no rows with predictions") as err:
        mod.read(str(path))
    assert str(path) in str(err.value)


@pytest.mark.parametrize("content", ["{broken", '{"format": 1}'])
def test_bench_refuses_a_bad_profile_before_launching(tmp_path, content):
    from click.testing import CliRunner

    from ringlet.cli.main import main

    bad = tmp_path / "bad.json"
    bad.write_text(content)
    res = CliRunner().invoke(main, ["bench", "--predict", str(bad)])
    assert res.exit_code == 2 and str(bad) in res.output
    res = CliRunner().invoke(main, ["bench", "--predict", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "missing.json" in res.output


def test_tune_is_a_command():
    from click.testing import CliRunner

    from ringlet.cli.main import main

    res = CliRunner().invoke(main, ["--help"])
    assert "tune" in res.output
    res = CliRunner().invoke(main, ["tune", "--help"])
    assert res.exit_code == 0 and "--quick" in res.output and "--out" in res.output
