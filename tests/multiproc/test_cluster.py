"""``ringlet cluster``: emulated hosts (network namespaces, tbf-capped links, CPU cgroups) and
``ringlet run --cluster`` across them.

The first tests check the pure parts (rates, specs, cgroup files on a fake tree, nsswitch rewrite,
option checks) and run anywhere. The ``multiproc`` tests need root and ``ip netns``; they skip with
the reason otherwise, and also when a cluster (or ``rgl-*`` leftovers) already exists on this
machine, so that they never tear down someone else's cluster. Every one tears down in a ``finally``
and asserts that nothing named ``rgl-*`` is left.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mp_jobs import RINGLET, finish_job, job_report, kill_tree, load_rank_files, require_transport, run_job, worker

from ringlet.cluster import _rsh, cgroup, launch, manager, netns
from ringlet.cluster import state as st
from ringlet.cluster.state import ClusterError, ClusterSpec, ClusterState


# ---- pure parts -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text,bits", [("1gbit", 10**9), ("100mbit", 10**8), ("2.5gbit", 25 * 10**8),
                                       ("125mbps", 10**9), ("64000", 64000), ("10 GBit", 10**10)])
def test_parse_rate(text, bits):
    assert st.parse_rate(text) == bits


@pytest.mark.parametrize("bad", ["", "fast", "1gb/s", "1 parsec", "10bit"])
def test_parse_rate_rejects(bad):
    with pytest.raises(ValueError):
        st.parse_rate(bad)


@pytest.mark.parametrize("bits", [10**9, 10**8, 25 * 10**8, 1234567])
def test_format_rate_round_trips(bits):
    assert st.parse_rate(st.format_rate(bits)) == bits


@pytest.mark.parametrize("kw", [dict(hosts=0), dict(ranks_per_host=0), dict(link="x"), dict(cpus_per_host=-1),
                                dict(intra="rdma"), dict(subnet="8.8.8.0/24"), dict(subnet="10.0.0.0/30", hosts=3),
                                dict(subnet="10.213.0.1/24"), dict(burst=1500), dict(burst=65536)])
def test_spec_rejects_bad_input(kw):
    with pytest.raises(ValueError):
        ClusterSpec(**{"hosts": 2, **kw}).validate()


def test_plan_and_state_round_trip():
    spec = ClusterSpec(3, 2, "1gbit", 0.5, "loopback").validate()
    hosts = st.plan_hosts(spec)
    assert [(h.name, h.addr, h.veth) for h in hosts] == [
        ("rgl-h0", "10.213.0.1", "rgl-v0"), ("rgl-h1", "10.213.0.2", "rgl-v1"), ("rgl-h2", "10.213.0.3", "rgl-v2")]
    s = ClusterState(spec, hosts, 1, "/sys/fs/cgroup/cpu", 0.5)
    assert ClusterState.from_json(s.to_json()) == s
    assert s.host("h1") is s.host("rgl-h1") is s.host("1") is hosts[1]
    with pytest.raises(ClusterError):
        s.host("h7")
    assert ClusterSpec(4, cpus_per_host=None).cpus() == round((os.cpu_count() or 1) / 4, 3)


def test_tbf_burst_covers_a_gso_packet_and_2ms():
    assert netns.tbf_burst(10**9) == 250_000
    assert netns.tbf_burst(10**7) == 96 * 1024  # more than a GSO packet: a 64 KiB bucket splits them
    assert netns.tbf_burst(10 * 10**9) == 2_500_000
    assert netns.tbf_args(10**9)[4] == "250000" and netns.tbf_args(10**9, 98304)[4] == "98304"  # --burst
    spec = ClusterSpec(2, burst=98304).validate()
    s = ClusterState(spec, st.plan_hosts(spec), None, None, 0.0)
    assert ClusterState.from_json(s.to_json()).spec.burst == 98304


def test_port_burst_holds_the_rate_and_no_more():
    # 200 us of traffic in whole 32 KiB, at least 96 KiB: the buckets of the cost model's attempts 9-10.
    assert netns.tbf_burst(10**9, st.PORT) == 96 * 1024
    assert netns.tbf_burst(10 * 10**9, st.PORT) == 256 * 1024
    assert netns.tbf_burst(100 * 10**9, st.PORT) == 77 * 32 * 1024
    assert netns.tbf_args(10 * 10**9, st.PORT)[4] == "262144"
    assert netns.bucket_text(10**9, st.PORT) == "port 98304 B buckets"
    assert netns.bucket_text(10**9, 131072) == "131072 B buckets" and netns.bucket_text(10**9, None) == ""
    spec = ClusterSpec(2, burst=st.PORT).validate()
    s = ClusterState(spec, st.plan_hosts(spec), None, None, 0.0)
    assert ClusterState.from_json(s.to_json()).spec.burst == st.PORT
    with pytest.raises(ValueError, match="bytes or 'port'"):
        ClusterSpec(2, burst="lots").validate()


@pytest.mark.parametrize("version", [1, 2])
def test_cgroup_files_on_a_fake_tree(tmp_path, version):
    if version == 2:
        (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    ctl = cgroup.CpuController(version, str(tmp_path))
    path = Path(ctl.create("rgl-h0", 0.5))
    if version == 1:
        assert (path / "cpu.cfs_period_us").read_text() == "100000"
        assert (path / "cpu.cfs_quota_us").read_text() == "50000"
    else:
        assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
        assert (path / "cpu.max").read_text() == "50000 100000"
    assert ctl.quota("rgl-h0") == 0.5
    assert ctl.groups("rgl-") == ["rgl-h0"]
    with pytest.raises(cgroup.CgroupError):
        ctl.create("rgl-h1", 0.001)


def test_cgroup_detect_prefers_the_v1_cpu_hierarchy(tmp_path):
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw 0 0\n")
    assert cgroup.detect(str(mounts)) == cgroup.CpuController(2, str(v2))
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw 0 0\ncgroup /x/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n")
    assert cgroup.detect(str(mounts)) == cgroup.CpuController(1, "/x/cpu,cpuacct")
    (v2 / "cgroup.controllers").write_text("memory\n")
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw 0 0\n")
    assert cgroup.detect(str(mounts)) is None


def test_nsswitch_uses_files_only(tmp_path):
    f = tmp_path / "nsswitch.conf"
    f.write_text("passwd: files\nhosts:   files mdns4_minimal [NOTFOUND=return] dns\nnetworks: files\n")
    out = netns.nsswitch_files_only(f).splitlines()
    assert out[0] == "passwd: files" and out[1].split() == ["hosts:", "files"] and out[2] == "networks: files"
    assert netns.nsswitch_files_only(tmp_path / "missing") is None


def test_rsh_helper_agrees_with_the_package():
    """_rsh.py runs without importing ringlet, so it repeats a few constants: they must agree."""
    assert _rsh.STATE_PATH == str(st.STATE_PATH)
    assert _rsh.HOST_IFNAME == st.HOST_IFNAME
    spec = ClusterSpec(2, intra="loopback").validate()
    s = json.loads(ClusterState(spec, st.plan_hosts(spec), None, None, 0).to_json())
    assert _rsh.find_host(s, "h1")["name"] == _rsh.find_host(s, "rgl-h1")["name"] == "rgl-h1"
    env = _rsh.host_env(s, _rsh.find_host(s, "1"))
    assert env["RINGLET_HOSTNAME"] == "rgl-h1" and env["RINGLET_CLUSTER_INTRA"] == "loopback"


def test_run_cluster_option_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    missing = tmp_path / "none.json"
    with pytest.raises(ClusterError, match="No emulated cluster is up"):
        launch.run_options("torch", path=missing)
    with pytest.raises(ClusterError, match="chooses --hosts"):
        launch.run_options("torch", hosts="a:1", path=missing)
    spec = ClusterSpec(2).validate()
    path = tmp_path / "c.json"
    st.save(ClusterState(spec, st.plan_hosts(spec), None, None, 0), path)
    mpi = launch.run_options("mpi", path=path)
    # mpiexec runs inside the first host, reaches the others through a one-file remote shell, and keeps
    # MPICH off shared memory between namespaces (it would bypass the capped links).
    assert mpi["mpi_entry"][:1] == (sys.executable,) and "rgl-h0" in mpi["mpi_entry"]
    assert Path(mpi["rsh"]).read_text().startswith("#!/bin/sh") and os.access(mpi["rsh"], os.X_OK)
    assert mpi["env"] == {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self", "FI_PROVIDER": "tcp"}
    with pytest.raises(ClusterError, match="shm"):
        launch.run_options("shm", path=path)
    opts = launch.run_options("torch", path=path)
    assert opts["hosts"] == (("rgl-h0", 1), ("rgl-h1", 1)) and opts["master_addr"] == "10.213.0.1"
    assert str(path) in opts["rsh"] and "_rsh.py" in opts["rsh"]
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        launch.run_options("torch", path=path)


# ---- real clusters (root) ---------------------------------------------------------------------------
def _why_no_cluster() -> str | None:
    if os.geteuid() != 0:
        return "ringlet cluster needs root (network namespaces, tc, cgroups)"
    if netns.missing_tools():
        return f"iproute2 is missing ({', '.join(netns.missing_tools())})"
    try:
        p = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns` does not work here: {exc}"
    if p.returncode != 0:
        return f"`ip netns` does not work here: {p.stderr.decode().strip()}"
    return None


needs_root = pytest.mark.skipif(_why_no_cluster() is not None, reason=str(_why_no_cluster()))


@pytest.fixture
def clean_machine():
    """No cluster before the test (else skip: it belongs to someone else), none after (asserted)."""
    left = manager.leftovers()
    if left:
        pytest.skip(f"a cluster or its leftovers exist on this machine ({', '.join(left[:3])}...); not touching it")
    try:
        yield
    finally:
        manager.down()
        assert manager.leftovers() == []


def _cpus() -> float:
    return 0.0 if cgroup.detect() is None else 1.0


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(RINGLET + ["cluster", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.multiproc
@needs_root
@pytest.mark.parametrize("hosts,per_host,algorithms", [(2, 1, ["auto", "ring"]), (2, 2, ["hierarchical", "ring"])],
                         ids=["2x1", "2x2"])
def test_run_across_emulated_hosts(clean_machine, tmp_path, hosts, per_host, algorithms):
    manager.up(ClusterSpec(hosts, per_host, "1gbit", _cpus()))
    out = tmp_path / "res"
    job = run_job(["--cluster", "--", sys.executable, worker("cluster_worker.py"), str(out), *algorithms],
                  timeout=240)
    assert job.returncode == 0, job_report(job)
    p = hosts * per_host
    recs = load_rank_files(out, p)
    assert all(recs), job_report(job)
    names = [f"rgl-h{r // per_host}" for r in range(p)]
    for r, rec in enumerate(recs):
        assert rec["size"] == p and rec["rank"] == r
        assert (rec["local_rank"], rec["local_size"]) == (r % per_host, per_host)
        assert (rec["cross_rank"], rec["cross_size"]) == (r // per_host, hosts)
        assert rec["uts_hostname"] == rec["cluster_host"] == names[r]
        assert rec["runtime_hosts"] == names
        assert rec["wrong"] and not any(rec["wrong"].values()), rec["wrong"]
    print(f"\n{hosts}x{per_host} at 1gbit, 256 KiB all-reduce (median us, rank 0): {recs[0]['times_us']}")


@pytest.mark.multiproc
@needs_root
@pytest.mark.parametrize("transport", ["torch", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_bench_across_emulated_hosts(clean_machine, tmp_path, transport):
    """Up, a small `ringlet bench` across two emulated hosts with the competitors in the same run, down."""
    require_transport(transport)
    manager.up(ClusterSpec(2, 1, "1gbit", _cpus()))
    out = tmp_path / "bench.json"
    compare = "native,mpi" if transport == "mpi" else "native"
    argv = RINGLET + ["bench", "--cluster", "-np", "2", "--transport", transport, "--compare", compare,
                      "--algorithms", "ring,recursive_doubling", "-b", "4K", "-e", "256K", "-f", "8",
                      "--json", str(out), "--no-progress"]
    t0 = time.monotonic()
    job = finish_job(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True), 300, t0)
    assert job.returncode == 0, job_report(job)
    data = json.loads(out.read_text())
    assert (data["meta"]["ranks"], data["meta"]["hosts"], data["meta"]["transport"]) == (2, 2, transport)
    impls = {r["impl"] for r in data["rows"]}
    assert impls == {"ringlet:ring", "ringlet:recursive_doubling", *compare.split(",")}, impls
    assert {r["size"] for r in data["rows"]} == {4096, 32768, 262144}
    assert all(r["oop_wrong"] == 0 and r["ip_wrong"] == 0 for r in data["rows"]), data["rows"]
    print(f"\n2 hosts at 1gbit ({transport}), 256 KiB busbw GB/s: "
          + ", ".join(f"{r['impl']} {r['oop_busbw']:.3f}" for r in data["rows"] if r["size"] == 262144))


def test_link_flows_over_loopback():
    """The flow machinery of ``linktest.measure`` without namespaces: one flow through 127.0.0.1 moves
    bytes and reports who sent them (no rate asserted)."""
    import socket
    from types import SimpleNamespace

    from ringlet.cluster import linktest

    srv = linktest._listener("127.0.0.1")
    client = socket.create_connection(("127.0.0.1", srv.getsockname()[1]), 5)
    try:
        flows = [(SimpleNamespace(name="a"), SimpleNamespace(name="b"))]
        (res,) = linktest._run_flows(flows, [srv], [client], 0.2, 4 * linktest.CHUNK, 10.0)
    finally:
        client.close()
        srv.close()
    assert (res.src, res.dst) == ("a", "b") and res.nbytes > 0


@pytest.mark.multiproc
@needs_root
def test_links_are_capped_both_ways(clean_machine):
    """Throughput never exceeds the cap: one flow, and two senders into one host (the download cap).
    Upper bounds only, so a loaded machine cannot make this fail."""
    from ringlet.cluster import linktest

    state = manager.up(ClusterSpec(3, link="200mbit", cpus_per_host=0))
    raw = 200e6 / 8 / 1e6  # MB/s on the wire, headers included
    one = linktest.measure(state, [("h0", "h1")], seconds=1.0)
    two = linktest.measure(state, [("h1", "h0"), ("h2", "h0")], seconds=1.0)
    print(f"\n200mbit ({raw:.1f} MB/s raw): one flow {one[0].mbytes_per_s:.1f} MB/s; "
          f"two into one host {[round(r.mbytes_per_s, 1) for r in two]} MB/s")
    assert 0 < one[0].mbytes_per_s <= raw * 1.05
    assert all(r.nbytes > 0 for r in two) and sum(r.mbytes_per_s for r in two) <= raw * 1.05


@pytest.mark.multiproc
@needs_root
def test_cli_up_exec_status_down(clean_machine):
    bad = cli("up", "--hosts", "2", "--burst", "lots")
    assert bad.returncode != 0 and "--burst" in bad.stderr
    p = cli("up", "--hosts", "2", "--link", "100mbit", "--cpus-per-host", str(_cpus() / 2), "--burst", "96K")
    assert p.returncode == 0, p.stderr
    again = cli("up", "--hosts", "2")
    assert again.returncode != 0 and "already up" in again.stderr
    status = cli("status")
    assert status.returncode == 0 and "rgl-h1" in status.stdout and "100mbit" in status.stdout, status.stdout
    assert "98304 B buckets" in status.stdout, status.stdout
    probe = ("import os, socket; print(socket.gethostname(), os.environ['RINGLET_HOSTNAME'], "
             "open('/proc/net/dev').read().count(':'), open('/proc/self/cgroup').read().count('rgl-h1'))")
    ex = cli("exec", "h1", "--", sys.executable, "-c", probe)
    assert ex.returncode == 0, ex.stderr
    name, env_name, nlinks, in_cgroup = ex.stdout.split()
    assert name == env_name == "rgl-h1" and nlinks == "2"  # lo and eth0 only
    assert in_cgroup == ("1" if _cpus() else "0")
    assert cli("exec", "h0", "--", "sh", "-c", "exit 7").returncode == 7
    assert cli("exec", "h9", "--", "true").returncode != 0
    assert cli("link", "300mbit").returncode == 0  # re-shaped live, recorded in the state
    assert cli("link", "50mbit", "--host", "h1").returncode == 0
    rows = cli("status").stdout
    assert "link 300mbit" in rows and "50mbit" in rows and "100mbit" not in rows, rows
    qdisc = netns.sh("tc", "-n", "rgl-h1", "qdisc", "show", "dev", "eth0")
    assert "burst 96Kb" in qdisc, qdisc  # re-shaping keeps the bucket asked for
    assert cli("link", "fast").returncode != 0 and cli("link", "1gbit", "--host", "h7").returncode != 0
    down = cli("down")
    assert down.returncode == 0, down.stderr
    assert manager.leftovers() == []


def _bucket(ns: str) -> int:
    """The tbf bucket of ``ns``'s eth0 in bytes, as tc reads it back (JSON, like netns.qdisc_rate)."""
    qdiscs = json.loads(netns.sh("tc", "-n", ns, "-j", "qdisc", "show", "dev", "eth0"))
    return next(int(q["options"]["burst"]) for q in qdiscs if q.get("kind") == "tbf")


@pytest.mark.multiproc
@needs_root
def test_cli_port_buckets_follow_the_rate(clean_machine):
    p = cli("up", "--hosts", "2", "--link", "10gbit", "--burst", "port")
    assert p.returncode == 0, p.stderr
    try:
        assert "port 262144 B buckets" in cli("status").stdout
        assert _bucket("rgl-h0") == pytest.approx(262144, rel=0.01)  # the kernel rounds it to its ticks
        assert cli("link", "1gbit").returncode == 0  # a port's bucket is recomputed for the new rate
        assert _bucket("rgl-h0") == pytest.approx(98304, rel=0.01)
        assert "port 98304 B buckets" in cli("status").stdout
    finally:
        assert cli("down").returncode == 0
    assert manager.leftovers() == []


@pytest.mark.multiproc
@needs_root
def test_foreground_up_tears_down_on_sigint(clean_machine, tmp_path):
    """`up -- CMD` runs CMD and removes the cluster when CMD ends, including on Ctrl-C; `down` after
    a crash (the owner SIGKILLed) stops the processes left in the hosts and removes everything."""
    marker = tmp_path / "started"
    cmd = ["sh", "-c", f"touch {marker}; exec sleep 60"]
    proc = subprocess.Popen(RINGLET + ["cluster", "up", "--hosts", "2", "--cpus-per-host", "0", "--", *cmd],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert marker.exists(), proc.communicate(timeout=30)
        assert st.load() is not None
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGINT, err
        assert manager.leftovers() == [], err
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    # A crash: the owner dies by SIGKILL while a process runs inside a host.
    proc = subprocess.Popen(RINGLET + ["cluster", "up", "--hosts", "2", "--cpus-per-host", "0", "--", *RINGLET,
                                       "cluster", "exec", "h1", "--", *cmd],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # the orphan keeps pipes open
    marker.unlink()
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert marker.exists(), f"exit status {proc.poll()}"
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    inside = netns.netns_pids("rgl-h1")
    assert inside, "the command should still run in rgl-h1 after its owner was killed"
    assert "gone" in cli("status").stdout
    assert cli("down").returncode == 0
    assert manager.leftovers() == [] and not any(manager.alive(p) and not manager._zombie(p) for p in inside)


def test_cli_without_root_says_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        manager.check_privileges()
