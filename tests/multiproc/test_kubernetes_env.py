"""Kubernetes' launch environments and multi-node torchrun, emulated on this machine.

Each "pod" is a process group started with the pod command of a manifest in docs/kubernetes/ (read from
the file, so the docs cannot drift from what is tested) and exactly the environment its operator gives
the pod, with two stand-ins for the cluster: 127.0.0.1 for the DNS names of pods and services, and
``RINGLET_HOSTNAME`` for the pod's host name (what ringlet groups ranks into hosts by). Every rank runs
tests/workers/k8s_worker.py as the image's ``train.py``: it checks the world, all-reduces and one DDP step.

- PyTorchJob with one torchrun per pod (2 pods x 2 processes) and without torchrun (one process per pod);
- MPIJob: mpirun with the launcher's HYDRA_HOST_FILE, reaching the "worker pods" through a stand-in for
  ssh (2 pods x 2 slots);
- JobSet: torchrun as node JOB_COMPLETION_INDEX;
- wrong environments (WORLD_SIZE larger than the pods that come, for ringlet's own rendezvous and for
  torchrun's) fail on every pod with the reason, in bounded time;
- multi-node torchrun: two agents on a c10d rendezvous with ``--nnodes 1:2`` (the second joins later)
  run examples/train_digits_ddp.py unchanged as a world of 4.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mp_jobs import kill_tree, require_transport, worker

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "docs" / "kubernetes"
VENV_BIN = str(Path(sys.executable).parent)
SECRET = "5f" * 32
JOB_TIMEOUT = 240  # seconds; a backstop: every job here takes well under a minute

pytestmark = pytest.mark.multiproc

# What a launcher running these tests may have set: a pod starts without any of it.
_LAUNCH_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX", "GLOO_SOCKET_IFNAME"}
_LAUNCH_PREFIXES = ("TORCHELASTIC_", "PET_", "PMI_", "PMIX_", "OMPI_", "MPI_", "HYDRA_", "SLURM_", "RINGLET_",
                    "HOROVOD_")
_KEPT = {"RINGLET_PROFILE_DIR", "RINGLET_TEST_TMPDIR"}  # the test run's own (tests/conftest.py)


def pod_script(manifest: str) -> str:
    """The shell script of the manifest's ``args: - |`` block (every container of it must run the same)."""
    lines = (MANIFESTS / manifest).read_text().splitlines()
    scripts = []
    for i, line in enumerate(lines):
        if line.strip() == "- |" and lines[i - 1].strip() == "args:":
            body = []
            indent = len(lines[i + 1]) - len(lines[i + 1].lstrip())
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) < indent:
                    break
                body.append(nxt[indent:])
            scripts.append("\n".join(body).strip() + "\n")
    assert scripts and len(set(scripts)) == 1, f"{manifest}: expected one pod script, found {scripts}"
    return scripts[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def pod_env(host: str | None, results: Path, **env) -> dict:
    """A pod's environment: this machine's minus every launcher's variables, the venv first on PATH (the
    image's python and torchrun), the Secret as RINGLET_JOB_SECRET, and what the operator sets (``env``)."""
    out = {k: v for k, v in os.environ.items()
           if k in _KEPT or (k not in _LAUNCH_VARS and not k.startswith(_LAUNCH_PREFIXES))}
    out["PATH"] = VENV_BIN + os.pathsep + out.get("PATH", "")
    out.update({"RINGLET_JOB_SECRET": SECRET, "RINGLET_TIMEOUT": "60", "RESULT_DIR": str(results)})
    if host is not None:
        out["RINGLET_HOSTNAME"] = host  # the pod's own host name
    out.update({k: str(v) for k, v in env.items()})
    return out


def workspace(tmp_path: Path) -> Path:
    """The image's working directory: train.py is the checking worker."""
    ws = tmp_path / "workspace"
    ws.mkdir(exist_ok=True)
    shutil.copy(worker("k8s_worker.py"), ws / "train.py")
    return ws


def start_pod(script: str, env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(["/bin/sh", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish_pods(pods: list[subprocess.Popen], timeout: float = JOB_TIMEOUT) -> list[tuple[int, str, str]]:
    """(status, stdout, stderr) of every pod; all are killed (and the test fails) past ``timeout``."""
    deadline = time.monotonic() + timeout
    out = []
    for p in pods:
        try:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in pods:
                kill_tree(q)
            pytest.fail(f"pods did not finish in {timeout}s: {p.args}")
        out.append((p.returncode, o, e))
    return out


def report(done) -> str:
    return "\n".join(f"--- pod {i}: exit {rc}\n{o[-2000:]}\n{e[-4000:]}" for i, (rc, o, e) in enumerate(done))


def check_results(results: Path, world: int, done, *, transport: str, local: int) -> None:
    assert [rc for rc, _, _ in done] == [0] * len(done), report(done)
    facts = [json.loads((results / f"rank-{r}.json").read_text()) for r in range(world)]
    for r, f in enumerate(facts):
        assert f["failed"] == [], (r, f)
        assert (f["rank"], f["world"], f["transport"], f["local_size"]) == (r, world, transport, local), f
        assert f["cross_size"] == world // local, f


@pytest.mark.parametrize("manifest,pods,nproc", [("pytorchjob.yaml", 2, 2), ("jobset.yaml", 2, 1)])
def test_torchrun_per_pod(manifest, pods, nproc, tmp_path):
    """PyTorchJob (the operator's MASTER_*, WORLD_SIZE = pods x nprocPerNode, RANK = pod index, PET_*) and
    JobSet (JOB_COMPLETION_INDEX and the manifest's own variables, NPROC_PER_NODE=1 to save time): a
    torchrun per pod."""
    ws, results, port = workspace(tmp_path), tmp_path / "results", free_port()
    results.mkdir()
    script = pod_script(manifest)
    started = []
    for i in range(pods):
        if manifest == "pytorchjob.yaml":
            host = "ringlet-train-master-0" if i == 0 else f"ringlet-train-worker-{i - 1}"
            operator = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "PET_MASTER_ADDR": "127.0.0.1",
                        "PET_MASTER_PORT": port, "WORLD_SIZE": pods * nproc, "RANK": i, "PET_NNODES": pods,
                        "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": i, "PYTHONUNBUFFERED": "0"}
        else:
            host = f"ringlet-train-workers-0-{i}"
            operator = {"JOB_COMPLETION_INDEX": i, "NNODES": pods, "NPROC_PER_NODE": nproc,
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        started.append(start_pod(script, pod_env(host, results, **operator), ws))
    check_results(results, pods * nproc, finish_pods(started), transport="torch", local=nproc)


def test_pytorchjob_one_process_per_pod(tmp_path):
    """No torchrun: the operator's WORLD_SIZE (pods) and RANK (pod index) go straight to ringlet.init()."""
    ws, results, port = workspace(tmp_path), tmp_path / "results", free_port()
    results.mkdir()
    script, pods = pod_script("pytorchjob-direct.yaml"), 2
    started = [start_pod(script, pod_env("ringlet-train-direct-master-0" if i == 0 else
                                         f"ringlet-train-direct-worker-{i - 1}", results, MASTER_ADDR="127.0.0.1",
                                         MASTER_PORT=port, WORLD_SIZE=pods, RANK=i), ws) for i in range(pods)]
    check_results(results, pods, finish_pods(started), transport="torch", local=1)


@pytest.mark.mpi
def test_mpijob(tmp_path):
    """mpirun in the launcher pod, with the operator's hostfile and Hydra variables, starts 2 ranks in each
    of 2 worker pods (the stand-in for ssh runs the command here under the pod's host name)."""
    require_transport("mpi")
    ws, results = workspace(tmp_path), tmp_path / "results"
    results.mkdir()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"ringlet-train-worker-{i}.ringlet-train.default.svc:2\n" for i in range(2)))
    ssh = tmp_path / "ssh"
    ssh.write_text('#!/bin/sh\n# ssh HOST COMMAND into a worker pod, here: drop the options, become HOST\n'
                   'while [ $# -gt 0 ]; do case "$1" in -o) shift 2;; -*) shift;; *) break;; esac; done\n'
                   'host="$1"; shift\nRINGLET_HOSTNAME="${host%%.*}" exec /bin/sh -c "$*"\n')
    ssh.chmod(0o755)
    env = pod_env(None, results, K_MPI_JOB_ROLE="launcher", HYDRA_HOST_FILE=hostfile,
                  HYDRA_LAUNCH_EXTRA_ARGS="-o ConnectionAttempts=10", HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=ssh)
    done = finish_pods([start_pod(pod_script("mpijob.yaml"), env, ws)])
    check_results(results, 4, done, transport="mpi", local=2)


def test_wrong_world_fails_on_every_pod_in_bounded_time(tmp_path):
    """WORLD_SIZE=3 but only 2 pods come: ringlet's rendezvous (no torchrun) names the missing rank on
    both pods after RINGLET_TIMEOUT; torchrun's static rendezvous (the JobSet's command, its timeout
    shortened) stops with the count of nodes that joined. Both jobs run at once."""
    ws, results = workspace(tmp_path), tmp_path / "results"
    results.mkdir()
    port, agent_port = free_port(), free_port()
    t0 = time.monotonic()
    direct = [start_pod(pod_script("pytorchjob-direct.yaml"),
                        pod_env(f"pod-{i}", results, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=3, RANK=i,
                                RINGLET_TIMEOUT=4), ws) for i in range(2)]
    jobset = start_pod(pod_script("jobset.yaml").replace("timeout=600", "timeout=4"),
                       pod_env("ringlet-train-workers-0-0", results, JOB_COMPLETION_INDEX=0, NNODES=2,
                               NPROC_PER_NODE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=agent_port), ws)
    done = finish_pods(direct + [jobset], timeout=120)
    assert time.monotonic() - t0 < 120
    for rc, _, err in done[:2]:
        assert rc != 0 and re.search(r"RingletError: rank \d: the env:// rendezvous at 127\.0\.0\.1:\d+ failed: 2 of "
                                     r"WORLD_SIZE=3 ranks arrived within 4s \(RINGLET_TIMEOUT\); missing RANK 2\.",
                                     err), report(done)
    rc, _, err = done[2]
    assert rc != 0 and "1/2 clients joined" in err, report(done)
    assert not list(results.iterdir())


def test_multinode_torchrun_elastic(tmp_path):
    """Two torchrun agents as two nodes on a c10d rendezvous, ``--nnodes 1:2 --nproc-per-node 2``: the
    first starts alone, the second joins; examples/train_digits_ddp.py runs unchanged on 4 ranks."""
    port = free_port()
    argv = ["torchrun", "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--rdzv-id", "digits", str(REPO / "examples" / "train_digits_ddp.py"),
            "--epochs", "1"]
    script = " ".join(argv)
    first = start_pod(script, pod_env("node-a", tmp_path), tmp_path)
    # The second comes once the first is in the rendezvous on its own (it hosts the c10d store then);
    # the first waits for more nodes for last_call_timeout (30 s) after reaching its minimum.
    deadline = time.monotonic() + 60
    while not _listening(port) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    second = start_pod(script, pod_env("node-b", tmp_path), tmp_path)
    done = finish_pods([first, second])
    assert [rc for rc, _, _ in done] == [0, 0], report(done)
    out = done[0][1] + done[1][1]
    assert "ringlet over the torch transport" in out, report(done)
    acc = re.search(r"test accuracy: ([\d.]+) .*\(4 ranks, 1 epochs", out)
    assert acc and float(acc.group(1)) > 0.5, report(done)
