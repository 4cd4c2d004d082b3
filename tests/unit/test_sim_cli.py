"""``ringlet simulate``: parsing, the table, JSON and PNG output, profiles, and bad input."""
from __future__ import annotations

import json
import sys
import types

import pytest
from click.testing import CliRunner

from ringlet.cli.main import main
from ringlet.tuning.network import Network
from ringlet.tuning.profile import Fingerprint, Profile

BASE = ["simulate", "--ranks", "16", "--hosts-of", "4", "--link", "10gbit", "--latency", "5us"]


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_table_json_and_plot(tmp_path):
    js, png = tmp_path / "out" / "sim.json", tmp_path / "busbw.png"
    res = invoke(*BASE, "--sizes", "1K:1M", "--factor", "4", "--json", str(js), "--plot", str(png))
    assert res.exit_code == 0, res.output
    assert "16 ranks (4 hosts × 4)" in res.output and "busbw GB/s" in res.output
    assert res.output.count(" replay") == 6 * 7
    doc = json.loads(js.read_text())
    assert doc["ranks"] == 16 and len(doc["rows"]) == 6 * 7 and doc["notices"] == []
    row = doc["rows"][0]
    assert set(row) >= {"bytes", "algorithm", "seconds", "algbw_GBps", "busbw_GBps", "steps", "source"}
    assert row["bytes"] == 1024 and row["source"] == "replay"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_algorithm_list_segment_and_gamma():
    res = invoke(*BASE, "--algorithms", "ring,rabenseifner", "--sizes", "64M", "--segment", "auto",
                 "--gamma", "5", "--intra-link", "100gbit", "--intra-latency", "1us")
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if "64 MiB" in ln]
    assert [ln.split()[2] for ln in lines] == ["ring", "halving_doubling"]
    assert "gamma 5 GB/s" in res.output and "intra 100 Gbit/s, 1 us" in res.output


def test_other_collective():
    res = invoke(*BASE, "--collective", "allgather", "--sizes", "4K,4M")
    assert res.exit_code == 0, res.output
    assert "allgather" in res.output and res.output.count(" replay") == 4


def test_sizes_round_down_to_whole_elements():
    res = invoke(*BASE, "--algorithms", "ring", "--sizes", "1:16")
    assert res.exit_code == 0, res.output
    assert [ln.split()[0] for ln in res.output.splitlines() if " ring " in ln] == ["0", "4", "8", "16"]


def test_from_profile(tmp_path):
    prof = tmp_path / "profile.json"
    net = Network.of(link="1gbit", latency="50us", gamma=1e-10)
    Profile(Fingerprint.of((0, 0, 1, 1, 2, 2), "torch"), net).save(str(prof))
    res = invoke("simulate", "--from-profile", str(prof), "--sizes", "1M", "--algorithms", "ring")
    assert res.exit_code == 0, res.output
    assert "6 ranks (3 hosts × 2)" in res.output and "inter 1 Gbit/s, 50 us" in res.output
    res = invoke("simulate", "--from-profile", str(prof), "--ranks", "64", "--sizes", "1M", "--algorithms", "ring")
    assert res.exit_code == 0 and "64 ranks (32 hosts × 2)" in res.output
    res = invoke("simulate", "--from-profile", str(prof), "--ranks", "64", "--hosts-of", "8", "--sizes", "1M")
    assert res.exit_code == 0 and "64 ranks (8 hosts × 8)" in res.output


def test_budget_fallback_notice(monkeypatch, tmp_path):
    cost = types.ModuleType("ringlet.tuning.cost")
    cost.predict_allreduce = lambda algorithm, nbytes, topology, network, *, itemsize=4, segment_bytes=None: \
        types.SimpleNamespace(seconds=1e-3, steps=2, segment_bytes=segment_bytes)
    monkeypatch.setitem(sys.modules, "ringlet.tuning.cost", cost)
    png = tmp_path / "model.png"
    res = invoke(*BASE, "--sizes", "1K,1M", "--budget", "0", "--plot", str(png))
    assert res.exit_code == 0, res.output
    assert png.stat().st_size > 1000
    rows = [ln for ln in res.output.splitlines() if ln.endswith(" model")]
    assert len(rows) == 14 and "predicted by the cost model" in res.output


@pytest.mark.parametrize("args, message", [
    (["--algorithms", "ring,warp"], "unknown allreduce algorithm 'warp'"),
    (["--sizes", "1G:1K"], "bad size range"),
    (["--sizes", "lots"], "not a size"),
    (["--factor", "1"], "factor must be > 1"),
    (["--link", "fast"], "not a link rate"),
    (["--latency", "soon"], "not a duration"),
    (["--segment", "-4"], "not a size"),
    (["--collective", "gossip"], "unknown collective"),
    (["--gamma", "0"], "gamma"),
    (["--budget", "-1"], "budget"),
    (["--ranks", "0"], "ranks"),
])
def test_bad_input(args, message):
    res = invoke(*BASE, *args)
    assert res.exit_code == 2 and message in res.output, res.output


def test_missing_and_conflicting_network(tmp_path):
    res = invoke("simulate", "--ranks", "8", "--link", "1gbit")
    assert res.exit_code == 2 and "--latency" in res.output
    res = invoke("simulate", "--link", "1gbit", "--latency", "1us")
    assert res.exit_code == 2 and "--ranks" in res.output
    prof = tmp_path / "p.json"
    Profile(Fingerprint.of((0, 1), "torch"), Network.of(link="1gbit", latency="1us")).save(str(prof))
    res = invoke("simulate", "--from-profile", str(prof), "--link", "1gbit")
    assert res.exit_code == 2 and "drop --link" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    res = invoke("simulate", "--from-profile", str(bad))
    assert res.exit_code == 2 and "not a ringlet calibration profile" in res.output
    res = invoke("simulate", "--from-profile", str(tmp_path / "missing.json"))
    assert res.exit_code == 2
