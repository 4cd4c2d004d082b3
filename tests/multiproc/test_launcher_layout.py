"""Fast checks of the launcher's pure parts: host lists, rank layouts, environment derivation, CLI errors."""
from __future__ import annotations

import os
import sys

import pytest
from click.testing import CliRunner

from launcher_worker import listening_addresses

from ringlet.cli.main import main
from ringlet.launch import default_transport
from ringlet.launch.config import LaunchError, RunConfig
from ringlet.launch.env import MALLOC_ENV, allocator_env, worker_env
from ringlet.launch.hosts import fit_hosts, is_local_host, store_bind_address
from ringlet.launch.shim import derive_layout, layout_env, layout_from_hosts, parse_hosts
from ringlet.launch.store import serve_store
from ringlet.launch.status import root_cause


def test_parse_hosts():
    assert parse_hosts("a:4, b:2,c") == [("a", 4), ("b", 2), ("c", 1)]
    for bad in ("a:0", "a:x", ":3", ""):
        with pytest.raises(ValueError):
            parse_hosts(bad)


@pytest.mark.parametrize("hosts", [[("a", 4), ("b", 4)], [("a", 3), ("b", 1), ("c", 2)], [("a", 1)]])
def test_layout_from_hosts_matches_horovod_definitions(hosts):
    size = sum(n for _, n in hosts)
    lays = [layout_from_hosts(r, size, hosts) for r in range(size)]
    placed = [h for h, n in hosts for _ in range(n)]
    for r, lay in enumerate(lays):
        assert lay.hostname == placed[r]
        same_host = [q for q in range(size) if placed[q] == placed[r]]
        assert (lay.local_rank, lay.local_size) == (same_host.index(r), len(same_host))
        same_local = [q for q in range(size) if lays[q].local_rank == lay.local_rank]
        assert (lay.cross_rank, lay.cross_size) == (same_local.index(r), len(same_local))


def test_layout_rejects_wrong_size():
    with pytest.raises(ValueError):
        layout_from_hosts(0, 5, [("a", 2), ("b", 2)])


def test_derive_layout_torchrun_and_mpi_env():
    torch_env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                 "GROUP_WORLD_SIZE": "2"}
    lay = derive_layout(torch_env)
    assert (lay.rank, lay.size, lay.local_rank, lay.local_size, lay.cross_rank, lay.cross_size) == (5, 8, 1, 4, 1, 2)
    mpi_env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_HOSTNAME": "n1"}
    lay = derive_layout(mpi_env)
    assert (lay.rank, lay.local_rank, lay.local_size, lay.cross_rank, lay.cross_size, lay.hostname) == (3, 1, 2, 1, 2, "n1")
    lay = derive_layout({**mpi_env, "RINGLET_RUN_HOSTS": "x:3,y:1"})
    assert (lay.local_rank, lay.local_size, lay.cross_rank, lay.cross_size, lay.hostname) == (0, 1, 1, 2, "y")
    env = layout_env(lay, {})
    assert env["HOROVOD_HOSTNAME"] == env["RINGLET_HOSTNAME"] == "y"
    assert env["HOROVOD_CROSS_RANK"] == env["RINGLET_CROSS_RANK"] == "1"
    assert "RINGLET_HOSTNAME" not in layout_env(derive_layout(torch_env), {})


def test_fit_hosts_and_local_names():
    assert fit_hosts((("a", 4), ("b", 4)), 6) == (("a", 4), ("b", 2))
    assert fit_hosts((("a", 4),), None) == (("a", 4),)
    assert is_local_host("localhost") and is_local_host("127.0.0.2")


def test_root_cause_prefers_earliest_real_failure(tmp_path):
    import json

    recs = [{"rank": 0, "status": 1, "time": 10.5, "host": "h"}, {"rank": 2, "status": 17, "time": 10.2, "host": "h"},
            {"rank": 1, "status": 143, "time": 10.0, "host": "h"}]  # 143: stopped by the launcher (SIGTERM)
    for rec in recs:
        (tmp_path / f"exit-{rec['rank']}.json").write_text(json.dumps(rec))
    assert root_cause(str(tmp_path))["rank"] == 2


def test_cli_errors_are_clear():
    runner = CliRunner()
    res = runner.invoke(main, ["run", "--", "true"])
    assert res.exit_code == 2 and "-np" in res.output
    res = runner.invoke(main, ["run", "-np", "9", "--hosts", "localhost:2", "--", "true"])
    assert res.exit_code == 2 and "exceeds" in res.output
    res = runner.invoke(main, ["run", "-np", "2", "--transport", "carrier-pigeon", "--", "true"])
    assert res.exit_code == 2
    assert "run" in runner.invoke(main, ["--help"]).output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings are set on Linux only")
def test_allocator_env_fixed_unless_the_user_chose(monkeypatch):
    assert allocator_env({}) == MALLOC_ENV
    assert int(MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"]) == 32 << 20  # glibc refuses a larger mmap threshold
    for user in ({"MALLOC_TRIM_THRESHOLD_": "0"}, {"MALLOC_ARENA_MAX": "2"}, {"RINGLET_MALLOC_TUNING": "0"},
                 {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, {"MALLOC_CONF": "background_thread:true"},
                 {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, {"LD_PRELOAD": "libtcmalloc.so"}):
        assert allocator_env(user) == {}, user
    assert allocator_env({"GLIBC_TUNABLES": "glibc.pthread.rseq=0", "LD_PRELOAD": "libfoo.so"}) == MALLOC_ENV
    for k in list(os.environ):
        if k.startswith(("MALLOC_", "RINGLET_MALLOC")) or k in ("LD_PRELOAD", "GLIBC_TUNABLES"):
            monkeypatch.delenv(k)
    env = worker_env(RunConfig(("true",)), None)
    assert {k: env[k] for k in MALLOC_ENV} == MALLOC_ENV
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1")
    assert not set(MALLOC_ENV) & set(worker_env(RunConfig(("true",)), None))


def test_default_transport_by_job_shape(monkeypatch):
    monkeypatch.setattr("ringlet.launch.api._cuda_devices", lambda: False)
    assert default_transport() == "shm" and default_transport("localhost:4") == "shm"
    assert default_transport("localhost:2,127.0.0.1:2") == "torch"  # host entries act as hosts: not one host
    assert default_transport(elastic=True) == "torch" and default_transport(cluster=True) == "torch"
    monkeypatch.setattr("ringlet.launch.api._cuda_devices", lambda: True)
    assert default_transport() == "torch"


def test_store_bind_address():
    assert store_bind_address("127.0.0.1", (("localhost", 2), ("127.0.0.1", 2))) == "127.0.0.1"
    assert store_bind_address("localhost", (("localhost", 1),)) == "127.0.0.1"
    # node 0's name maps to loopback but another host must reach it: every interface
    assert store_bind_address("localhost", (("localhost", 1), ("far-away.invalid", 1))) == ""
    with pytest.raises(LaunchError, match="Cannot resolve"):
        store_bind_address("no-such-host.invalid", (("no-such-host.invalid", 1),))


def test_serve_store_listens_on_the_given_address_only(monkeypatch):
    from ringlet.security.secret import SECRET_ENV, new_secret
    from ringlet.store.torch_store import connect

    monkeypatch.setenv(SECRET_ENV, new_secret())
    server = serve_store("127.0.0.1", 0)
    assert listening_addresses(server.port) == [f"127.0.0.1:{server.port}"]
    store = connect("127.0.0.1", server.port, timeout=10)
    store.set("k", "v")
    assert store.get("k") == b"v"
    server.close()
