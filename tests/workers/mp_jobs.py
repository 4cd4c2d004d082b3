"""Helpers for the multiproc tests: launch real jobs with ``ringlet run`` (imported as ``mp_jobs``;
tests/workers is on sys.path through pyproject's ``pythonpath``, and :func:`worker` names the scripts
in it).

Every job runs in its own session with a hard timeout; on timeout the whole process tree (launcher,
elastic agent or mpiexec, shims, ranks) is killed so nothing can outlive the test or hang CI.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RINGLET = [sys.executable, "-m", "ringlet.cli.main"]


@dataclass
class Job:
    argv: list
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and everything it started (elastic puts ranks in sessions of their own)."""
    for pid in _descendants(proc.pid) + [proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def start_job(run_args: list[str], env: dict | None = None) -> subprocess.Popen:
    full_env = {**os.environ, **(env or {})}
    return subprocess.Popen(RINGLET + ["run", *run_args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env, start_new_session=True)


def finish_job(proc: subprocess.Popen, timeout: float, t0: float) -> Job:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate()
        pytest.fail(f"ringlet run {' '.join(proc.args[3:])} did not finish in {timeout}s\n"
                    f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-8000:]}")
    return Job(proc.args, proc.returncode, out, err, time.monotonic() - t0)


def run_job(run_args: list[str], *, timeout: float, env: dict | None = None) -> Job:
    """``ringlet run RUN_ARGS`` with a hard timeout (the whole tree is killed when it expires)."""
    t0 = time.monotonic()
    return finish_job(start_job(run_args, env), timeout, t0)


def require_transport(name: str) -> None:
    """Skip (with the reason) when a transport cannot run here."""
    if name == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            pytest.skip("mpi4py is not installed (pip install 'ringlet[mpi]')")
        from ringlet.launch import LaunchError
        from ringlet.launch.mpi import find_mpiexec

        try:
            find_mpiexec()
        except LaunchError as exc:
            pytest.skip(str(exc))
    elif name == "shm":
        try:
            importlib.import_module("ringlet.transport.shm")
        except Exception as exc:  # noqa: BLE001 - any import failure means "not ready yet"
            pytest.skip(f"ringlet.transport.shm does not import yet: {type(exc).__name__}: {exc}")


def load_rank_files(out: Path, world: int) -> list[dict]:
    files = {r: Path(f"{out}.rank{r}") for r in range(world)}
    return [json.loads(p.read_text()) if p.exists() else None for r, p in sorted(files.items())]


def transport_params():
    return [pytest.param("torch", id="torch"), pytest.param("mpi", id="mpi", marks=pytest.mark.mpi),
            pytest.param("shm", id="shm")]


def transport_world_params(*pairs: tuple[str, int]) -> list:
    """``(transport, world)`` parameters for a job test: a few representative pairs (each transport and
    each world size at least once) rather than every product; mpi's carry the ``mpi`` mark."""
    return [pytest.param(t, w, id=f"{t}-{w}", marks=[pytest.mark.mpi] if t == "mpi" else []) for t, w in pairs]


def job_report(job: Job) -> str:
    return (f"$ {' '.join(map(str, job.argv))}\nexit status {job.returncode} after {job.seconds:.1f}s\n"
            f"--- stdout (tail) ---\n{job.stdout[-3000:]}\n--- stderr (tail) ---\n{job.stderr[-6000:]}")


def worker(name: str) -> str:
    """Absolute path of a worker script in this directory."""
    return str(HERE / name)
