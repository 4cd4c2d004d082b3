"""How ``ringlet run --cluster`` maps an emulated cluster onto the launcher's multi-host options.

The launcher already runs one node launcher per ``--hosts`` entry through a remote shell; a cluster
only has to supply the host list (``rgl-h0:RANKS_PER_HOST,...``), a remote shell that enters a host
(:mod:`ringlet.cluster._rsh`) and the first host's bridge address as ``--master-addr``.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from . import state as st
from .state import ClusterError

RSH_SCRIPT = str(Path(__file__).with_name("_rsh.py"))


def run_job(command, np: int | None = None, *, transport: str | None = None, env: dict | None = None,
            node_rank: int | None = None, elastic: bool = False, path: Path = st.STATE_PATH, **options) -> int:
    """``ringlet run --cluster``: :func:`ringlet.launch.run` on the emulated hosts of the cluster that is
    up, with its host list, remote shell, first host's address (and for ``mpi`` its ``mpiexec`` entry)
    filled in from :func:`run_options`; ``options`` are the launcher's others. A node launcher
    (``node_rank`` given) already has them. Returns the job's exit status; ``LaunchError`` for options
    the cluster cannot run (``--elastic``, ``--hosts``, no cluster up, not root)."""
    from ..launch import LaunchError, default_transport, run

    if elastic:
        raise LaunchError("--elastic runs on this host only (no --hosts / --cluster yet).")
    transport = (transport or default_transport(cluster=True)).strip().lower()
    if node_rank is None:
        try:
            opts = run_options(transport, hosts=options.pop("hosts", None), rsh=options.pop("rsh", "ssh"),
                               master_addr=options.pop("master_addr", None), path=path)
        except ClusterError as exc:
            raise LaunchError(str(exc)) from None
        options.update(hosts=opts["hosts"], rsh=opts["rsh"], master_addr=opts["master_addr"],
                       mpi_entry=opts.get("mpi_entry"))
        env = {**opts.get("env", {}), **(env or {})}
    return run(command, np, transport=transport, env=env, node_rank=node_rank, **options)


def rsh_command(path: Path = st.STATE_PATH) -> str:
    """The ``--rsh`` that runs ``RSH HOST 'command'`` inside emulated host HOST."""
    return shlex.join([sys.executable, RSH_SCRIPT, "--state", str(path)])


def run_options(transport: str, *, hosts=None, rsh: str = "ssh", master_addr: str | None = None,
                path: Path = st.STATE_PATH) -> dict:
    """``hosts``, ``rsh`` and ``master_addr`` for :func:`ringlet.launch.run` on the cluster that is up."""
    if hosts or rsh != "ssh" or master_addr:
        raise ClusterError("--cluster chooses --hosts, --rsh and --master-addr itself; drop them "
                           "(use -np to run fewer ranks than the cluster has slots).")
    state = st.require(path)
    if os.geteuid() != 0:
        raise ClusterError("Running on emulated hosts needs root (entering their namespaces and cgroups): "
                           "`sudo $(which ringlet) run --cluster -- ...`.")
    if transport == "shm" and len(state.hosts) > 1:
        raise ClusterError("The shm transport joins ranks of one host only; use --transport torch on a "
                           f"cluster of {len(state.hosts)} hosts.")
    opts = {
        "hosts": tuple((h.name, state.spec.ranks_per_host) for h in state.hosts),
        "rsh": rsh_command(path),
        "master_addr": state.hosts[0].addr,
    }
    if transport == "mpi":
        opts.update(mpi_options(state, path))
    return opts


def mpi_options(state, path: Path) -> dict:
    """How mpiexec runs across emulated hosts.

    mpiexec itself runs inside the first host: its proxies connect back to it, and the root namespace
    has no address on the hosts' bridge. Hydra wants one executable as its remote shell, so the rsh
    command is written to a script beside the state file. MPICH would otherwise join ranks of
    different namespaces through shared memory (it cannot tell they are separate hosts), bypassing the
    capped links: ``MPIR_CVAR_NOLOCAL=1`` sends everything over TCP, intra-host pairs included.
    """
    script = path.parent / "rsh"
    text = "#!/bin/sh\nexec " + rsh_command(path) + ' "$@"\n'
    if not script.exists() or script.read_text() != text:
        script.write_text(text)
        script.chmod(0o755)
    return {
        "rsh": str(script),
        # The first host's variables must not reach the other hosts through mpiexec's environment.
        "mpi_entry": (sys.executable, RSH_SCRIPT, "--state", str(path), "--argv", state.hosts[0].name,
                      "env", "-u", "RINGLET_HOSTNAME", "-u", "RINGLET_CLUSTER_HOST"),
        "env": {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self", "FI_PROVIDER": "tcp"},
    }
