"""torch and shm jobs: torch's elastic agent (the engine of torchrun, through its Python API) starts
the ranks of one host; a job over several hosts runs one node launcher per host entry.

Every job rendezvouses statically through :mod:`.store` (node rank = host entry index), with the store
hosted by node 0's agent: a single-host job on 127.0.0.1 and a port the OS picks, a multi-host job on
the first entry's address (``--master-addr``, default its name) and ``--port`` (default a free local
port when the first entry is this machine, else 29500).
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from . import flight_collect
from . import store as rdzv_store
from ..security.secret import SECRET_ENV
from .config import SHIM, LaunchError, RunConfig, say
from .deaths import DeathWatch
from .env import worker_env
from .flight_dir import FLIGHT_ENV
from .hosts import LOOPBACK, free_port, hosts_spec, is_local_host, single_host, store_bind_address
from .status import exit_status, report, root_cause, wait_all

EXIT_ACK_KEY = "ringlet/exit_acks"
EXIT_ACK_TIMEOUT = 30.0  # seconds node 0's agent keeps the store up for agents still leaving the barrier
RDZV_TIMEOUT = 900  # seconds the agents of a multi-host job wait for each other
FAILURE_LINGER = 5.0  # seconds node 0 keeps the job's store up after its ranks failed


def exit_barrier_holding_store(barrier, timeout: float | None = None, before=None):
    """Torch's agent exit barrier followed by a count-out that keeps the job's store up until every agent
    has left it.

    Node 0's agent hosts the job's TCPStore. Torch's barrier releases all agents when the last arrives;
    node 0's then returns, its process exits and the store goes with it, and an agent still receiving
    its release would log "Failed to recv" with a C++ backtrace although the job succeeded. Here every
    agent counts itself out after the barrier, and node 0's waits for all of them (``timeout``, default
    :data:`EXIT_ACK_TIMEOUT`). ``before(store)``: run first, once this host's ranks are done (while the
    job's store is surely up)."""
    def run(agent) -> None:
        if before is not None:
            before(agent._store)
        barrier(agent)
        store, group = agent._store, agent._worker_group
        try:
            left = store.add(EXIT_ACK_KEY, 1)
            if group.group_rank != 0:
                return
            deadline = time.monotonic() + (EXIT_ACK_TIMEOUT if timeout is None else timeout)
            while left < group.group_world_size and time.monotonic() < deadline:
                time.sleep(0.01)
                left = store.add(EXIT_ACK_KEY, 0)
        except Exception as exc:  # noqa: BLE001 - the workers succeeded; the count-out must not fail the job
            say(f"leaving the exit barrier: {exc}")

    return run


class HoldStore:
    """Install :func:`exit_barrier_holding_store` on torch's elastic agent for one launch (``before``: its
    hook for this host's last words)."""

    def __init__(self, before=None) -> None:
        self._before = before

    def __enter__(self):
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

        self._cls, self._orig = SimpleElasticAgent, SimpleElasticAgent._exit_barrier
        SimpleElasticAgent._exit_barrier = exit_barrier_holding_store(self._orig, before=self._before)
        return self

    def __exit__(self, *exc):
        self._cls._exit_barrier = self._orig
        return False


def run_agent(cfg: RunConfig, nproc: int, nnodes: int, node_rank: int, endpoint: str, bind_addr: str,
              run_id: str, env: dict) -> int:
    """Start this host's ``nproc`` ranks under torch's elastic agent; node ``node_rank`` of ``nnodes``,
    rendezvous at ``endpoint`` (node 0 hosts the store there, listening on ``bind_addr``)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    rdzv_store.register()
    run_dir = tempfile.mkdtemp(prefix="ringlet-run-")
    saved = dict(os.environ)
    os.environ.update(env)
    os.environ["RINGLET_RUN_DIR"] = run_dir
    config = LaunchConfig(
        min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=nproc, run_id=run_id, role="ringlet",
        rdzv_endpoint=endpoint, rdzv_backend=rdzv_store.BACKEND,
        rdzv_configs={"rank": node_rank, "timeout": RDZV_TIMEOUT, "bind_addr": bind_addr}, max_restarts=0,
        monitor_interval=0.1, start_method="spawn", logs_specs=DefaultLogsSpecs(log_dir=os.path.join(run_dir, "logs")),
    )
    rdzv_store.endpoint = None
    flight = _flight_folder(nnodes)
    deaths = DeathWatch(run_dir, run_id, lambda: rdzv_store.endpoint).start()
    host_metrics = None

    def deliver(_agent_store) -> None:
        # A host whose ranks succeeded delivers their flight records before the exit barrier (the job may
        # still fail elsewhere, and then node 0's launcher wants them), through the death watch's own
        # connection, unprefixed like node 0's (flushed first, so that its thread no longer uses it).
        deaths.flush()
        _collect_flight(deaths.store(), run_id, node_rank, nnodes, cfg.hosts, flight, failed=False)

    try:
        host_metrics = _host_metrics(cfg, run_dir)
        with HoldStore(before=deliver if nnodes > 1 else None):
            elastic_launch(config, sys.executable)(*SHIM, *cfg.command)
        return 0
    except ChildFailedError as exc:
        _, first = exc.get_first_failure()
        deaths.flush()
        named = node_rank == 0 and deaths.report()
        if nnodes > 1:
            _collect_flight(deaths.store(), run_id, node_rank, nnodes, cfg.hosts, flight, failed=True)
        if node_rank == 0 and nnodes > 1:  # the store lives here: the other hosts' ranks read why the job stops
            time.sleep(FAILURE_LINGER)
        where = "on this host, " if nnodes > 1 or named else ""
        return report(root_cause(run_dir), exit_status(first.exitcode), len(exc.failures), where)
    except SignalException as exc:
        say(f"got {exc.sigval.name}, stopped the ranks.")
        return 128 + int(exc.sigval)
    finally:
        deaths.stop()
        if host_metrics is not None:
            host_metrics.close()
        rdzv_store.hosted = None
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(run_dir, ignore_errors=True)
        if flight is not None:
            shutil.rmtree(flight, ignore_errors=True)


def _flight_folder(nnodes: int) -> str | None:
    """A multi-host job's ranks on this host write their flight records into a folder of this launcher's
    (exported to them), unless ``RINGLET_FLIGHT_DIR`` is set; None when it is, or for a one-host job (its
    launcher gave the job a folder already: :mod:`.flight_dir`)."""
    if nnodes == 1 or os.environ.get(FLIGHT_ENV):
        return None
    folder = tempfile.mkdtemp(prefix="ringlet-flight-host-")
    os.environ[FLIGHT_ENV] = folder
    return folder


def _collect_flight(store, run_id: str, node_rank: int, nnodes: int, hosts, folder, failed: bool) -> None:
    """Deliver this host's flight records through the job's ``store`` (None: unreachable); after a
    failure node 0 gathers and reports them."""
    local = folder or os.environ.get(FLIGHT_ENV, "")
    if store is None or not local:
        return
    world = sum(n for _, n in hosts) if hosts else 0
    flight_collect.collect(store, run_id, node_rank, nnodes, world, local, FAILURE_LINGER, gather=failed)


def _host_metrics(cfg: RunConfig, run_dir: str):
    """The host's metrics endpoint on ``cfg.metrics_port`` over this agent's ranks (they advertise their own
    endpoints in ``run_dir/metrics``, exported to them as RINGLET_METRICS_DIR), or None without one."""
    if cfg.metrics_port is None:
        return None
    from ..metrics.host import HostEndpoint

    folder = os.path.join(run_dir, "metrics")
    try:
        endpoint = HostEndpoint(folder, cfg.metrics_port)
    except OSError as exc:
        raise LaunchError(str(exc)) from None
    os.environ["RINGLET_METRICS_DIR"] = folder
    say(f"metrics of this host's ranks on port {endpoint.port} (/metrics)")
    return endpoint


def run_torch(cfg: RunConfig) -> int:
    """A torch or shm job: this host's ranks, or one node launcher per host entry."""
    hosts = cfg.hosts
    if cfg.node_rank is not None:  # one host of a multi-host job
        if hosts is None or not cfg.rdzv_endpoint or not cfg.run_id:
            raise LaunchError("--node-rank needs --hosts, --rdzv-endpoint and --run-id.")
        if not 0 <= cfg.node_rank < len(hosts):
            raise LaunchError(f"--node-rank {cfg.node_rank} is outside the {len(hosts)} hosts.")
        addr = cfg.rdzv_endpoint.rpartition(":")[0]
        bind = store_bind_address(addr, hosts) if cfg.node_rank == 0 else addr
        return run_agent(cfg, hosts[cfg.node_rank][1], len(hosts), cfg.node_rank, cfg.rdzv_endpoint, bind,
                         cfg.run_id, worker_env(cfg, hosts))
    if single_host(hosts):
        np = cfg.np if hosts is None else hosts[0][1]
        return run_agent(cfg, np, 1, 0, f"{LOOPBACK}:0", LOOPBACK, uuid.uuid4().hex, worker_env(cfg, hosts))
    return run_multi_host(cfg, hosts)


def run_multi_host(cfg: RunConfig, hosts) -> int:
    """One node launcher per host entry; the first entry hosts the rendezvous store."""
    if cfg.metrics_port is not None and sum(is_local_host(h) for h, _ in hosts) > 1:
        raise LaunchError("--metrics-port: several host entries are this machine, and each one's launcher would "
                          "serve on the same port; add --metrics-per-rank (every rank serves its own).")
    first_local = is_local_host(hosts[0][0])
    all_local = all(is_local_host(h) for h, _ in hosts)
    addr = cfg.master_addr or (LOOPBACK if all_local else hosts[0][0])
    port = cfg.port or (free_port(LOOPBACK if all_local else "") if first_local else 29500)
    endpoint = f"{addr}:{port}"
    run_id = uuid.uuid4().hex
    # Horovod scripts are tuned with HOROVOD_* (cycle time, fusion threshold, timeline): those travel too;
    # the per-rank layout names among them are set again by each rank's shim.
    fwd_env = {k: v for k, v in os.environ.items() if k.startswith(("RINGLET_", "HOROVOD_"))}
    fwd_env.update(cfg.extra_env)
    fwd_env["RINGLET_TRANSPORT"] = cfg.transport
    for name in ("RINGLET_HOSTNAME", "HOROVOD_HOSTNAME"):  # this host's names: each host's launcher names its own
        fwd_env.pop(name, None)
    secret = fwd_env.pop(SECRET_ENV)
    procs = []
    for i, (host, _) in enumerate(hosts):
        argv = [sys.executable, "-m", "ringlet.cli.main", "run", "--transport", cfg.transport,
                "--hosts", hosts_spec(hosts), "--node-rank", str(i), "--rdzv-endpoint", endpoint,
                "--run-id", run_id, *_metrics_args(cfg), "--", *cfg.command]
        if is_local_host(host):
            procs.append(subprocess.Popen(argv, env={**os.environ, **fwd_env, SECRET_ENV: secret}))
        else:
            procs.append(_start_remote(cfg.rsh, host, argv, fwd_env, secret))
    return wait_all(procs)


def _metrics_args(cfg: RunConfig) -> list[str]:
    return [] if cfg.metrics_port is None else ["--metrics-port", str(cfg.metrics_port)]


def _start_remote(rsh: str, host: str, argv: list[str], env: dict, secret: str) -> subprocess.Popen:
    """The node launcher of ``host`` through the remote shell. exec: the remote shell becomes the launcher,
    so stopping the rsh client stops it (with ssh, only if the connection drop reaches it: use --rsh
    "ssh -tt" for a hangup on disconnect). The job's secret goes through its standard input, never on
    the command line (which ``ps`` shows to every user of the remote host)."""
    argv = argv[:argv.index("--")] + ["--secret-from-stdin"] + argv[argv.index("--"):]
    remote = (f"cd {shlex.quote(os.getcwd())} && exec env "
              + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
              + " " + shlex.join(argv))
    proc = subprocess.Popen(shlex.split(rsh) + [host, remote], stdin=subprocess.PIPE)
    try:
        proc.stdin.write((secret + "\n").encode())
        proc.stdin.close()
    except OSError:
        pass  # the remote shell failed at once; its exit status says why
    return proc
