"""mpi jobs: ``mpiexec`` (the one next to ``sys.executable`` if present, else the one on PATH) starts
every rank under the per-rank shim.

``--hosts`` with other machines becomes ``mpiexec -hosts ... -launcher ssh -launcher-exec RSH``
(Hydra's remote-shell hook, which must name one executable); entries that are all on this machine
only shape the layout (emulated hosts).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .config import SHIM, LaunchError, RunConfig, say
from .env import worker_env
from .hosts import hosts_spec, is_local_host
from .status import Forwarder, exit_status, report, root_cause


def find_mpiexec() -> str:
    """The ``mpiexec`` to use; ``LaunchError`` with the fix when there is none."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise LaunchError("--transport mpi needs mpiexec: pip install 'ringlet[mpi]' (MPICH) or install an MPI.")
    return found


def mpiexec_argv(cfg: RunConfig) -> list[str]:
    """The command line that starts the job's ranks."""
    hosts = cfg.hosts
    np = cfg.np if hosts is None else sum(n for _, n in hosts)
    argv = [find_mpiexec(), "-n", str(np)]
    if hosts is not None and not all(is_local_host(h) for h, _ in hosts):
        argv += ["-hosts", hosts_spec(hosts), "-launcher", "ssh", "-launcher-exec", cfg.rsh]
    argv += [sys.executable, *SHIM, *cfg.command]
    return [*cfg.mpi_entry, *argv] if cfg.mpi_entry else argv


def run_mpi(cfg: RunConfig) -> int:
    """Run the job under mpiexec; return its status (the first failed rank's, as for torch jobs)."""
    if cfg.node_rank is not None:
        raise LaunchError("--node-rank is for torch/shm launches; mpiexec starts every host itself.")
    argv = mpiexec_argv(cfg)
    run_dir = tempfile.mkdtemp(prefix="ringlet-run-")
    env = {**os.environ, **worker_env(cfg, cfg.hosts), "RINGLET_RUN_DIR": run_dir}
    try:
        proc = subprocess.Popen(argv, env=env)
        with Forwarder([proc]) as fwd:
            while True:
                try:
                    rc = proc.wait()
                    break
                except InterruptedError:
                    continue
        if rc == 0:
            return 0
        if fwd.received is not None:
            say(f"got {signal.Signals(fwd.received).name}, stopped the ranks.")
            return 128 + fwd.received
        nfailed = len(list(Path(run_dir).glob("exit-*.json")))
        return report(root_cause(run_dir), exit_status(rc), nfailed)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
