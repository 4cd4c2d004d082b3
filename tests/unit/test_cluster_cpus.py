"""`ringlet cluster cpus CPUS --host H`: one host's CPU quota changed on a running cluster (against a
cgroup v2 tree in a temporary directory; no root needed)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from ringlet.cli.cluster import cluster_cli
from ringlet.cluster import manager
from ringlet.cluster import state as st
from ringlet.cluster.state import ClusterError, ClusterSpec, ClusterState


def _state(tmp_path, version=2):
    spec = ClusterSpec(3, cpus_per_host=0.5)
    (tmp_path / "cgroup.subtree_control").write_text("cpu\n")
    for i in range(3):
        (tmp_path / st.host_name(i)).mkdir()
    return ClusterState(spec, st.plan_hosts(spec), version, str(tmp_path) if version else None, 0.5)


def test_set_cpus_of_one_host_leaves_the_others(tmp_path):
    saved = []
    state = manager.set_cpus(_state(tmp_path), 0.2, ["h2"], save=saved.append)
    assert (tmp_path / st.host_name(2) / "cpu.max").read_text() == "20000 100000"
    assert not (tmp_path / st.host_name(0) / "cpu.max").exists()
    assert state.cpus == 0.5 and saved == []  # not every host changed: the recorded quota stays


def test_set_cpus_of_every_host_is_recorded(tmp_path):
    saved = []
    state = manager.set_cpus(_state(tmp_path), 0.25, None, save=saved.append)
    assert state.cpus == 0.25 and saved == [state]
    assert all((tmp_path / st.host_name(i) / "cpu.max").read_text() == "25000 100000" for i in range(3))


@pytest.mark.parametrize("cpus, hosts, match", [(0.2, ["h7"], "No host 'h7'"), (0.0, None, "positive"),
                                                (0.001, ["h1"], "below the kernel's minimum")])
def test_set_cpus_refuses_bad_input(tmp_path, cpus, hosts, match):
    with pytest.raises(ClusterError, match=match):
        manager.set_cpus(_state(tmp_path), cpus, hosts, save=lambda s: None)


def test_set_cpus_needs_a_cluster_with_quotas(tmp_path):
    with pytest.raises(ClusterError, match="no CPU quotas"):
        manager.set_cpus(_state(tmp_path, version=None), 0.2, None, save=lambda s: None)


def test_cpus_command_parses_its_arguments():
    res = CliRunner().invoke(cluster_cli, ["cpus", "lots", "--host", "h1"])
    assert res.exit_code == 2 and "is not a valid float" in res.output
    assert "--host" in CliRunner().invoke(cluster_cli, ["cpus", "--help"]).output
