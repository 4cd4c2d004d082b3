"""`ringlet doctor`'s pure parts: the verdict on synthetic tables, the pairing rounds, the parsers."""
from __future__ import annotations

import itertools

import pytest

from ringlet.doctor import probe
from ringlet.doctor.job import rounds
from ringlet.doctor.verdict import format_table, verdict


def _table(n=4, gflops=None, bw=None, offsets=None, mtus=None):
    gflops, offsets, mtus = gflops or {}, offsets or {}, mtus or {}
    hosts = [{"name": f"h{i}", "ranks": [i], "gflops_1t": 10.0, "gflops_nt": gflops.get(i, 20.0), "threads": 2,
              "mem_available": 8 << 30, "mem_limit": None, "iface": "eth0", "mtu": mtus.get(i, 1500),
              "clock_offset_s": offsets.get(i, 0.0), "clock_err_s": 0.0005} for i in range(n)]
    pairs = []
    for a, b in itertools.combinations(range(n), 2):
        v = (bw or (lambda a, b: 0.95))(a, b)
        pairs.append({"a": a, "b": b, "latency_us": 80.0, "bw_ab_gbit": v, "bw_ba_gbit": v, "bw_gbit": v})
    return {"hosts": hosts, "pairs": pairs}


def test_healthy_cluster_has_no_outlier():
    lines = verdict(_table())
    assert lines == ["no outlier: 4 hosts, bandwidth 0.95-0.95 Gbit/s, compute 20-20 GFLOP/s"]


def test_slow_host_is_a_compute_straggler():
    lines = verdict(_table(gflops={3: 8.0}))
    assert len(lines) == 1 and lines[0].startswith("host h3 is a compute straggler: 8 GFLOP/s, 0.40x")


def test_slow_host_link_is_named_once_not_per_pair():
    lines = verdict(_table(bw=lambda a, b: 0.095 if 3 in (a, b) else 0.95))
    assert len(lines) == 1 and lines[0].startswith("host h3's link is slow (network-bound)"), lines


@pytest.mark.parametrize("n", [3, 4, 5])
def test_slow_host_link_on_small_clusters(n):
    lines = verdict(_table(n, bw=lambda a, b: 0.1 if 1 in (a, b) else 1.0))
    assert lines == [l for l in lines if l.startswith("host h1's link is slow")] and len(lines) == 1, lines


def test_one_slow_pair_is_a_link_not_a_host():
    lines = verdict(_table(bw=lambda a, b: 0.3 if (a, b) == (1, 2) else 0.95))
    assert lines == ["link h1-h2 is slow: 0.3 Gbit/s, the other pairs' median 0.95 Gbit/s"]


def test_clock_skew_beyond_threshold_and_uncertainty():
    lines = verdict(_table(offsets={2: 0.05, 1: 0.0101}), clock_threshold_s=0.01)
    assert len(lines) == 1 and lines[0].startswith("host h2's clock is off by +50.0 ms"), lines


def test_mtu_mismatch_names_the_odd_host():
    assert verdict(_table(mtus={0: 9000})) == ["MTU mismatch: host h0 (eth0) has 9000, the others 1500"]


def test_single_host_and_empty_table():
    assert verdict(_table(1))[0] == "no outlier: 1 hosts, compute 20-20 GFLOP/s"
    with pytest.raises(ValueError, match="no hosts"):
        verdict({"hosts": [], "pairs": []})


def test_format_table_has_a_row_per_host_and_pair():
    text = format_table(_table(3))
    assert all(f"h{i} " in text for i in range(3)) and "h0 - h1" in text and "h1 - h2" in text


@pytest.mark.parametrize("n", range(1, 9))
def test_rounds_cover_every_pair_once_with_disjoint_pairs(n):
    rs = rounds(n)
    seen = [p for r in rs for p in r]
    assert sorted(seen) == list(itertools.combinations(range(n), 2))
    for r in rs:
        members = [x for p in r for x in p]
        assert len(members) == len(set(members))


def test_parse_meminfo():
    info = probe.parse_meminfo("MemTotal:       16318460 kB\nMemAvailable:    8000000 kB\nHugePages_Total:       0\n")
    assert info == {"MemTotal": 16318460 * 1024, "MemAvailable": 8000000 * 1024, "HugePages_Total": 0}
    with pytest.raises(ValueError, match="not understood"):
        probe.parse_meminfo("garbage line\n")


def test_parse_cgroup_limit():
    assert probe.parse_cgroup_limit("max\n") is None
    assert probe.parse_cgroup_limit("1073741824\n") == 1 << 30
    assert probe.parse_cgroup_limit("9223372036854771712") is None  # cgroup v1 "unlimited"
    with pytest.raises(ValueError):
        probe.parse_cgroup_limit("lots")


def test_parse_ip_addr_and_read_mtu(tmp_path):
    text = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
            "5: veth0@if6    inet 10.77.0.3/24 brd 10.77.0.255 scope global veth0\\       valid_lft forever\n")
    assert probe.parse_ip_addr(text) == {"127.0.0.1": "lo", "10.77.0.3": "veth0"}
    (tmp_path / "veth0").mkdir()
    (tmp_path / "veth0" / "mtu").write_text("1500\n")
    assert probe.read_mtu("veth0", str(tmp_path)) == 1500
    assert probe.read_mtu("nope", str(tmp_path)) is None
