"""``ringlet run`` as a Python function: check the options, pick the transport, start the job."""
from __future__ import annotations

import os

from ..security.secret import SECRET_ENV, job_secret, new_secret
from .agent import run_torch
from .config import TRANSPORTS, LaunchError, RunConfig, say
from .elastic import ElasticConfig, run_elastic
from .flight_dir import with_flight_dir
from .hosts import fit_hosts, hosts_spec, parse_host_list, single_host
from .mpi import run_mpi


def default_transport(hosts=None, *, cluster: bool = False, elastic: bool = False) -> str:
    """The transport a job gets when none is named: ``shm`` on a single host without GPUs (the fastest
    for CPU tensors there), ``torch`` across hosts, with CUDA devices (NCCL) and for ``--elastic`` jobs
    (only Gloo reports dead peers)."""
    if elastic or cluster:
        return "torch"
    if hosts is not None and not single_host(parse_host_list(hosts)):
        return "torch"
    return "torch" if _cuda_devices() else "shm"


def _cuda_devices() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def run(command, np: int | None = None, *, transport: str | None = None, hosts=None, rsh: str | None = None,
        port: int | None = None, master_addr: str | None = None, node_rank: int | None = None,
        rdzv_endpoint: str | None = None, run_id: str | None = None, env: dict | None = None,
        elastic: bool = False, min_np: int | None = None, max_np: int | None = None,
        restarts: int = 0, elastic_timeout: float = 600.0, mpi_entry: tuple[str, ...] | None = None,
        metrics_port: int | None = None, metrics_per_rank: bool = False) -> int:
    """Run ``command`` (argv list) as ``np`` ranks; return the job's exit status (0 when every rank succeeded,
    else the status of the rank that failed first). ``transport``: ``torch``, ``shm`` or ``mpi``; None picks
    :func:`default_transport`. ``hosts``: ``"h1:4,h2:4"`` or ``[("h1", 4), ...]``. ``env``: extra variables
    for every rank. ``elastic``: survive dead workers while at least ``min_np`` (default ``np``)
    remain, start up to ``restarts`` replacements, at most ``max_np`` ranks (see :mod:`.elastic`).
    ``mpi_entry``: an argv prefix that runs ``mpiexec`` elsewhere (inside an emulated host). Running on
    the emulated hosts of ``ringlet cluster up`` is the cluster tool's: :func:`ringlet.cluster.run_job`
    fills ``hosts``, ``rsh``, ``master_addr``, ``env`` and ``mpi_entry`` and calls this.
    ``rsh``: the remote shell (default ``ssh``). Inside a Slurm allocation with several nodes and without
    ``hosts``, the allocation's nodes are the hosts and ``srun`` the default remote shell
    (:mod:`ringlet.slurm.allocation`, docs/launching.md).
    ``metrics_port``: Prometheus metrics (docs/metrics.md) served on that port by the launcher's agent on
    each host for its ranks, or with ``metrics_per_rank`` by every rank on the port plus its local rank.
    Bad options raise :class:`LaunchError`."""
    hosts, rsh = _placement(np, hosts, rsh, transport, node_rank, elastic)
    if transport is None:
        transport = default_transport(hosts, elastic=elastic)
    # Every job gets a secret; its store and transport endpoints accept only holders (docs/security.md).
    env = {**(env or {}), SECRET_ENV: os.environ.get(SECRET_ENV) or new_secret()}
    try:
        job_secret(env)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    transport = transport.strip().lower()
    host_metrics = _metrics_options(env, metrics_port, metrics_per_rank, transport, elastic)
    if elastic:
        return _run_elastic(command, np, transport, hosts, env, min_np, max_np, restarts, elastic_timeout)
    command = tuple(command)
    if not command:
        raise LaunchError("No command given: ringlet run -np N -- python train.py ...")
    if transport not in TRANSPORTS:
        raise LaunchError(f"Unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}.")
    parsed = None
    if hosts:
        parsed = parse_host_list(hosts)
        if node_rank is None:
            parsed = fit_hosts(parsed, np)
    elif np is None:
        raise LaunchError("Give the number of ranks with -np N (or a host list with --hosts).")
    if np is not None and np < 1:
        raise LaunchError("-np must be at least 1.")
    def launch(job_env: dict) -> int:
        cfg = RunConfig(command, np, transport, parsed, rsh, port, master_addr, node_rank, rdzv_endpoint, run_id,
                        job_env, mpi_entry, host_metrics)
        return run_mpi(cfg) if transport == "mpi" else run_torch(cfg)

    if parsed is not None and not single_host(parsed):
        return launch(dict(env or {}))
    return with_flight_dir(dict(env or {}), launch)


def _placement(np, hosts, rsh, transport, node_rank, elastic):
    """(hosts, rsh): as given, or a Slurm allocation's nodes and ``srun`` (:mod:`ringlet.slurm.allocation`)
    when no host list is given inside one."""
    if hosts or node_rank is not None or elastic or (transport or "").strip().lower() == "mpi":
        return hosts, rsh or "ssh"
    from ..slurm.allocation import allocation_hosts, srun_rsh

    try:
        found = allocation_hosts(np)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if found is None:
        return hosts, rsh or "ssh"
    say(f"inside Slurm allocation {os.environ['SLURM_JOB_ID']}: hosts {hosts_spec(found)}, node launchers "
        f"through {'srun' if rsh is None else rsh}")
    return found, rsh or srun_rsh()


def _metrics_options(env: dict, port: int | None, per_rank: bool, transport: str, elastic: bool) -> int | None:
    """Check the metrics options; per rank, put ``RINGLET_METRICS_PORT`` in ``env``. Returns the port the
    agents serve (None: they serve none)."""
    if port is None:
        if per_rank:
            raise LaunchError("--metrics-per-rank needs --metrics-port PORT (rank r serves on PORT + its local rank).")
        return None
    if not 1 <= int(port) <= 65535:
        raise LaunchError(f"--metrics-port {port}: expected a TCP port number (1-65535).")
    if per_rank:
        env["RINGLET_METRICS_PORT"] = str(int(port))
        return None
    if transport == "mpi" or elastic:
        raise LaunchError("--metrics-port: the per-host endpoint is served by the agents of torch and shm jobs; "
                          f"for {'--elastic' if elastic else 'mpi'} jobs add --metrics-per-rank (every rank serves "
                          "its own on the port plus its local rank).")
    if os.environ.get("RINGLET_METRICS_PORT", "").strip():
        raise LaunchError("--metrics-port (one endpoint per host) with RINGLET_METRICS_PORT set (one per rank): "
                          "unset it, or add --metrics-per-rank.")
    return int(port)


def _run_elastic(command, np, transport, hosts, env, min_np, max_np, restarts, timeout) -> int:
    if transport != "torch":
        raise LaunchError(f"--elastic needs --transport torch (Gloo reports dead peers; {transport} does not "
                          "support changing membership).")
    if hosts:
        raise LaunchError("--elastic runs on this host only (no --hosts / --cluster yet).")
    if np is None:
        raise LaunchError("Give the initial number of ranks with -np N.")
    try:
        cfg = ElasticConfig(tuple(command), np, np if min_np is None else min_np,
                            np if max_np is None else max_np, restarts, timeout, dict(env or {}))
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    return run_elastic(cfg)
