"""``ringlet run``: start N ranks of a command over a transport (torch/Gloo, shm or MPI).

::

    ringlet run -np 4 -- python train.py --epochs 3
    ringlet run -np 4 --transport mpi -- python train.py
    ringlet run --hosts node1:4,node2:4 -- python train.py      # 8 ranks, one launcher per host

torch and shm: torch's elastic agent (the engine of torchrun, through its Python API) starts the
ranks of one host; a single host rendezvouses with c10d on a port the OS picks. mpi: ``mpiexec``
(the one next to ``sys.executable`` if present, else the one on PATH).

Every rank runs under :mod:`ringlet.cli._shim`, which exports ``RINGLET_TRANSPORT``,
``RINGLET_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE`` and the ``HOROVOD_*`` equivalents,
forwards signals and records how its rank ended. Ranks also get ``OMP_NUM_THREADS=1`` and fixed glibc
malloc thresholds (:func:`allocator_env`) unless the user set their own. When a rank fails, the job is stopped and
``ringlet run`` returns the exit status of the rank that failed *first* (its traceback is on stderr;
ranks that died only because a peer died are not blamed). Ctrl-C / SIGTERM are forwarded to the ranks.

``--hosts h1:4,h2:4`` (torch/shm): one node launcher per entry, in entry order, node rank = entry
index, static rendezvous at the first entry (``--master-addr``, default its name; ``--port``, default
a free local port when the first entry is this machine, else 29500). Entries naming this machine
(localhost, 127.x, its hostname) run as local subprocesses; the others start through the remote
shell ``--rsh`` (default ``ssh``), called as ``RSH... HOST 'cd CWD && exec env RINGLET_...=... PYTHON -m
ringlet.cli.main run --node-rank I ...'``: the same Python path and working directory must exist there,
and only ``RINGLET_*`` and ``HOROVOD_*`` variables travel. Stopping the job stops the rsh clients; with ssh use
``--rsh "ssh -tt"`` so that the remote side sees the hangup. Several entries on this machine act as
separate hosts (each rank gets its entry's name as ``RINGLET_HOSTNAME``), which is how hierarchical
algorithms run on one box. Design note for ``ringlet cluster`` (network namespaces as hosts): it
reuses this hook unchanged, with an rsh that maps the host name to ``ip netns exec NS sh -c CMD`` and
``--master-addr`` set to the first namespace's address.

For mpi, ``--hosts`` with other machines becomes ``mpiexec -hosts ... -launcher ssh -launcher-exec RSH``
(Hydra's remote-shell hook, which must name one executable); entries that are all on this machine
only shape the layout (emulated hosts), as above.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import click

from ._shim import parse_hosts

TRANSPORTS = ("torch", "shm", "mpi")
# Started by path, not with -m: importing the ringlet package would import torch (seconds per rank).
SHIM = (str(Path(__file__).with_name("_shim.py")), "--")
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


@dataclass(frozen=True)
class RunConfig:
    """Everything ``ringlet run`` needs; the CLI builds one, Python callers may too."""

    command: tuple[str, ...]
    np: int | None = None
    transport: str = "torch"
    hosts: tuple[tuple[str, int], ...] | None = None
    rsh: str = "ssh"
    port: int | None = None
    master_addr: str | None = None
    # Set only on the per-host launchers that a multi-host run starts (hidden CLI options).
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    run_id: str | None = None
    extra_env: dict = field(default_factory=dict)
    # mpi on emulated hosts: argv prefix that runs mpiexec inside the first host (see cluster.launch).
    mpi_entry: tuple[str, ...] | None = None


class LaunchError(click.ClickException):
    exit_code = 2


# ---- helpers ------------------------------------------------------------------------------------
def is_local_host(name: str) -> bool:
    """True when ``name`` designates this machine (without any network lookup beyond /etc/hosts)."""
    if name in _LOCAL_NAMES or name.startswith("127."):
        return True
    me = {socket.gethostname(), socket.getfqdn()}
    if name in me or name.split(".")[0] == socket.gethostname().split(".")[0]:
        return True
    try:
        addr = socket.gethostbyname(name)
    except OSError:
        return False
    if addr.startswith("127."):
        return True
    try:
        return addr in socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def find_mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise LaunchError("--transport mpi needs mpiexec: pip install 'ringlet[mpi]' (MPICH) or install an MPI.")
    return found


def _hosts_spec(hosts) -> str:
    return ",".join(f"{h}:{n}" for h, n in hosts)


def _fit_hosts(hosts: tuple[tuple[str, int], ...], np: int | None) -> tuple[tuple[str, int], ...]:
    """Fill host slots in order up to ``np`` ranks (all slots when ``np`` is None)."""
    total = sum(n for _, n in hosts)
    if np is None:
        return hosts
    if np > total:
        raise LaunchError(f"-np {np} exceeds the {total} slots of --hosts {_hosts_spec(hosts)}.")
    out, left = [], np
    for h, n in hosts:
        if left <= 0:
            break
        out.append((h, min(n, left)))
        left -= min(n, left)
    return tuple(out)


def _exit_status(code: int) -> int:
    """A shell-style status: a negative returncode (killed by signal s) becomes 128 + s."""
    return code if code >= 0 else 128 - code


def root_cause(run_dir: str) -> dict | None:
    """The failure recorded first by the shims in ``run_dir`` (earliest exit time)."""
    recs = []
    for p in Path(run_dir).glob("exit-*.json"):
        try:
            recs.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    if not recs:
        return None
    # Ranks stopped by the launcher (SIGTERM/SIGKILL/SIGINT) are casualties, not causes, if others failed.
    casualties = {128 + signal.SIGTERM, 128 + signal.SIGKILL, 128 + signal.SIGINT}
    causes = [r for r in recs if r["status"] not in casualties] or recs
    return min(causes, key=lambda r: r["time"])


def _report(rec: dict | None, fallback: int, nfailed: int | None = None) -> int:
    if rec is None:
        click.echo(f"ringlet run: the job failed with exit status {fallback}.", err=True)
        return fallback
    extra = f"; {nfailed - 1} other rank(s) failed after it" if nfailed and nfailed > 1 else ""
    click.echo(f"ringlet run: rank {rec['rank']} (host {rec['host']}) failed first with exit status "
               f"{rec['status']}{extra}; see its output above.", err=True)
    return int(rec["status"])


class _Forwarder:
    """Forward SIGINT/SIGTERM/SIGHUP to child processes while the launcher waits for them."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, procs):
        self.procs = procs
        self.received: int | None = None
        self._old = {}

    def __enter__(self):
        for s in self.SIGNALS:
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, _frame):
        self.received = signum
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        return False


# ---- torch / shm: torch's elastic agent ----------------------------------------------------------
EXIT_ACK_KEY = "ringlet/exit_acks"
EXIT_ACK_TIMEOUT = 30.0  # seconds node 0's agent keeps the store up for agents still leaving the barrier


def exit_barrier_holding_store(barrier, timeout: float | None = None):
    """Torch's agent exit barrier followed by a count-out that keeps the job's store up until every agent
    has left it.

    Node 0's agent hosts the job's TCPStore. Torch's barrier releases all agents when the last arrives;
    node 0's then returns, its process exits and the store goes with it, and an agent still receiving
    its release logs "Failed to recv" with a C++ backtrace although the job succeeded (3 of about 25
    long multi-host runs on the emulated cluster). Here every agent counts itself out after the
    barrier, and node 0's waits for all of them (``timeout``, default :data:`EXIT_ACK_TIMEOUT`)."""
    def run(agent) -> None:
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
            click.echo(f"ringlet run: leaving the exit barrier: {exc}", err=True)

    return run


class _HoldStore:
    """Install :func:`exit_barrier_holding_store` on torch's elastic agent for one launch."""

    def __enter__(self):
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

        self._cls, self._orig = SimpleElasticAgent, SimpleElasticAgent._exit_barrier
        SimpleElasticAgent._exit_barrier = exit_barrier_holding_store(self._orig)
        return self

    def __exit__(self, *exc):
        self._cls._exit_barrier = self._orig
        return False


def _elastic(cfg: RunConfig, nproc: int, nnodes: int, node_rank: int, endpoint: str, backend: str,
             run_id: str, env: dict) -> int:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    run_dir = tempfile.mkdtemp(prefix="ringlet-run-")
    saved = dict(os.environ)
    os.environ.update(env)
    os.environ["RINGLET_RUN_DIR"] = run_dir
    rdzv_configs = {"rank": node_rank, "timeout": 900} if backend == "static" else {"join_timeout": 900}
    config = LaunchConfig(
        min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=nproc, run_id=run_id, role="ringlet",
        rdzv_endpoint=endpoint, rdzv_backend=backend, rdzv_configs=rdzv_configs, max_restarts=0,
        monitor_interval=0.1, start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=os.path.join(run_dir, "logs")),
    )
    try:
        with _HoldStore():
            elastic_launch(config, sys.executable)(*SHIM, *cfg.command)
        return 0
    except ChildFailedError as exc:
        rec = root_cause(run_dir)
        _, first = exc.get_first_failure()
        return _report(rec, _exit_status(first.exitcode), len(exc.failures))
    except SignalException as exc:
        click.echo(f"ringlet run: got {exc.sigval.name}, stopped the ranks.", err=True)
        return 128 + int(exc.sigval)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(run_dir, ignore_errors=True)


# glibc malloc thresholds for the ranks (see allocator_env).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}
_USER_ALLOCATOR_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                        "MALLOC_ARENA_MAX", "MALLOC_CONF", "TCMALLOC_RELEASE_RATE")


def allocator_env(environ) -> dict:
    """The glibc malloc settings ``ringlet run`` gives its ranks, given the launcher's ``environ``.

    A training step frees and allocates the same large tensors (activations, gradients, workspaces)
    every step. glibc serves blocks above its mmap threshold with fresh mappings and gives the top of
    its heap back to the OS above its trim threshold; both thresholds start at 128 KiB and grow only as
    large blocks come and go, so whether a rank keeps its memory depends on the order of its first
    allocations. Measured on the same script: 0 to 7,600 page faults per step from run to run, and about
    6% of the step time on the emulated cluster (``benchmarks/results/e_train_4x1_1gbit_s5``). Fixed
    thresholds (32 MiB, glibc's largest mmap threshold; 128 MiB) keep the memory in the process, as CPU
    training launchers do when they swap in jemalloc or tcmalloc. Nothing is set when the user chose an
    allocator or malloc settings (any of ``_USER_ALLOCATOR_VARS``, malloc tunables in
    ``GLIBC_TUNABLES``, a malloc library in ``LD_PRELOAD``), when ``RINGLET_MALLOC_TUNING=0``, or off Linux.
    """
    if not sys.platform.startswith("linux") or environ.get("RINGLET_MALLOC_TUNING", "1") == "0":
        return {}
    if any(k in environ for k in _USER_ALLOCATOR_VARS) or "glibc.malloc" in environ.get("GLIBC_TUNABLES", ""):
        return {}
    if "malloc" in environ.get("LD_PRELOAD", ""):  # jemalloc, tcmalloc, mimalloc
        return {}
    return dict(MALLOC_ENV)


def _worker_env(cfg: RunConfig, hosts) -> dict:
    env = {"RINGLET_TRANSPORT": cfg.transport}
    if hosts is not None:
        env["RINGLET_RUN_HOSTS"] = _hosts_spec(hosts)
    # Each rank is one process among several on few cores: one intra-op thread, as torchrun does.
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    env.update(allocator_env(os.environ))
    env.update(cfg.extra_env)
    return env


def _run_torch(cfg: RunConfig) -> int:
    hosts = cfg.hosts
    if cfg.node_rank is not None:  # one host of a multi-host job
        if hosts is None or not cfg.rdzv_endpoint or not cfg.run_id:
            raise LaunchError("--node-rank needs --hosts, --rdzv-endpoint and --run-id.")
        if not 0 <= cfg.node_rank < len(hosts):
            raise LaunchError(f"--node-rank {cfg.node_rank} is outside the {len(hosts)} hosts.")
        return _elastic(cfg, hosts[cfg.node_rank][1], len(hosts), cfg.node_rank, cfg.rdzv_endpoint, "static",
                        cfg.run_id, _worker_env(cfg, hosts))
    if hosts is None or (len(hosts) == 1 and is_local_host(hosts[0][0])):
        np = cfg.np if hosts is None else hosts[0][1]
        return _elastic(cfg, np, 1, 0, "localhost:0", "c10d", uuid.uuid4().hex, _worker_env(cfg, hosts))
    return _run_multi_host(cfg, hosts)


def _run_multi_host(cfg: RunConfig, hosts) -> int:
    """One node launcher per host entry; the first entry hosts the rendezvous store."""
    first_local = is_local_host(hosts[0][0])
    all_local = all(is_local_host(h) for h, _ in hosts)
    port = cfg.port or (free_port() if first_local else 29500)
    addr = cfg.master_addr or ("127.0.0.1" if all_local else hosts[0][0])
    endpoint = f"{addr}:{port}"
    run_id = uuid.uuid4().hex
    # Horovod scripts are tuned with HOROVOD_* (cycle time, fusion threshold, timeline): those travel too;
    # the per-rank layout names among them are set again by each rank's shim.
    fwd_env = {k: v for k, v in os.environ.items() if k.startswith(("RINGLET_", "HOROVOD_"))}
    fwd_env.update(cfg.extra_env)
    fwd_env["RINGLET_TRANSPORT"] = cfg.transport
    procs = []
    for i, (host, _) in enumerate(hosts):
        argv = [sys.executable, "-m", "ringlet.cli.main", "run", "--transport", cfg.transport,
                "--hosts", _hosts_spec(hosts), "--node-rank", str(i), "--rdzv-endpoint", endpoint,
                "--run-id", run_id, "--", *cfg.command]
        if is_local_host(host):
            procs.append(subprocess.Popen(argv, env={**os.environ, **fwd_env}))
        else:
            # exec: the remote shell becomes the launcher, so stopping the rsh client stops it (with ssh,
            # only if the connection drop reaches it: use --rsh "ssh -tt" for a hangup on disconnect).
            remote = (f"cd {shlex.quote(os.getcwd())} && exec env "
                      + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(fwd_env.items()))
                      + " " + shlex.join(argv))
            procs.append(subprocess.Popen(shlex.split(cfg.rsh) + [host, remote]))
    return _wait_all(procs)


def _wait_all(procs) -> int:
    """Wait for the node launchers; the first one to fail decides the status and stops the rest."""
    status = 0
    with _Forwarder(procs) as fwd:
        pending = list(procs)
        while pending:
            for p in list(pending):
                rc = p.poll()
                if rc is None:
                    continue
                pending.remove(p)
                if rc != 0 and status == 0:
                    status = _exit_status(rc)
                    for q in pending:
                        q.terminate()
            time.sleep(0.05)
        if fwd.received is not None and status == 0:
            status = 128 + fwd.received
    return status


# ---- mpi ----------------------------------------------------------------------------------------
def _run_mpi(cfg: RunConfig) -> int:
    if cfg.node_rank is not None:
        raise LaunchError("--node-rank is for torch/shm launches; mpiexec starts every host itself.")
    hosts = cfg.hosts
    np = cfg.np if hosts is None else sum(n for _, n in hosts)
    argv = [find_mpiexec(), "-n", str(np)]
    if hosts is not None and not all(is_local_host(h) for h, _ in hosts):
        argv += ["-hosts", _hosts_spec(hosts), "-launcher", "ssh", "-launcher-exec", cfg.rsh]
    argv += [sys.executable, *SHIM, *cfg.command]
    if cfg.mpi_entry:
        argv = [*cfg.mpi_entry, *argv]
    run_dir = tempfile.mkdtemp(prefix="ringlet-run-")
    env = {**os.environ, **_worker_env(cfg, hosts), "RINGLET_RUN_DIR": run_dir}
    try:
        proc = subprocess.Popen(argv, env=env)
        with _Forwarder([proc]) as fwd:
            while True:
                try:
                    rc = proc.wait()
                    break
                except InterruptedError:
                    continue
        if rc == 0:
            return 0
        if fwd.received is not None:
            click.echo(f"ringlet run: got {signal.Signals(fwd.received).name}, stopped the ranks.", err=True)
            return 128 + fwd.received
        nfailed = len(list(Path(run_dir).glob("exit-*.json")))
        return _report(root_cause(run_dir), _exit_status(rc), nfailed)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


# ---- entry points -------------------------------------------------------------------------------
def run(command, np: int | None = None, *, transport: str = "torch", hosts=None, rsh: str = "ssh",
        port: int | None = None, master_addr: str | None = None, node_rank: int | None = None, rdzv_endpoint: str | None = None,
        run_id: str | None = None, env: dict | None = None, cluster: bool = False, elastic: bool = False,
        min_np: int | None = None, max_np: int | None = None, restarts: int = 0,
        elastic_timeout: float = 600.0) -> int:
    """Run ``command`` (argv list) as ``np`` ranks; return the job's exit status (0 when every rank succeeded,
    else the status of the rank that failed first). ``hosts``: ``"h1:4,h2:4"`` or ``[("h1", 4), ...]``.
    ``env``: extra variables for every rank. ``cluster``: run on the emulated hosts of ``ringlet cluster up``
    (sets ``hosts``, ``rsh`` and ``master_addr``). ``elastic``: survive dead workers while at least ``min_np``
    (default ``np``) remain, start up to ``restarts`` replacements, at most ``max_np`` ranks (see
    :mod:`ringlet.elastic.driver`). Callable from Python; ``ringlet run`` is a thin wrapper."""
    if elastic:
        return _run_elastic(command, np, transport, hosts, cluster, env, min_np, max_np, restarts, elastic_timeout)
    if cluster and node_rank is None:
        from ..cluster import ClusterError, run_options

        try:
            opts = run_options(transport.strip().lower(), hosts=hosts, rsh=rsh, master_addr=master_addr)
        except ClusterError as exc:
            raise LaunchError(str(exc)) from None
        hosts, rsh, master_addr = opts["hosts"], opts["rsh"], opts["master_addr"]
        env = {**opts.get("env", {}), **(env or {})}
        mpi_entry = opts.get("mpi_entry")
    else:
        mpi_entry = None
    command = tuple(command)
    if not command:
        raise LaunchError("No command given: ringlet run -np N -- python train.py ...")
    transport = transport.strip().lower()
    if transport not in TRANSPORTS:
        raise LaunchError(f"Unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}.")
    parsed = None
    if hosts:
        try:
            parsed = tuple(parse_hosts(hosts) if isinstance(hosts, str) else ((str(h), int(n)) for h, n in hosts))
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        if node_rank is None:
            parsed = _fit_hosts(parsed, np)
    elif np is None:
        raise LaunchError("Give the number of ranks with -np N (or a host list with --hosts).")
    if np is not None and np < 1:
        raise LaunchError("-np must be at least 1.")
    cfg = RunConfig(command, np, transport, parsed, rsh, port, master_addr, node_rank, rdzv_endpoint, run_id,
                    dict(env or {}), mpi_entry)
    if transport == "mpi":
        return _run_mpi(cfg)
    return _run_torch(cfg)


def _run_elastic(command, np, transport, hosts, cluster, env, min_np, max_np, restarts, timeout) -> int:
    from ..elastic.driver import ElasticConfig, run_elastic

    if transport.strip().lower() != "torch":
        raise LaunchError(f"--elastic needs --transport torch (Gloo reports dead peers; {transport} does not "
                          "support changing membership).")
    if hosts or cluster:
        raise LaunchError("--elastic runs on this host only (no --hosts / --cluster yet).")
    if np is None:
        raise LaunchError("Give the initial number of ranks with -np N.")
    try:
        cfg = ElasticConfig(tuple(command), np, np if min_np is None else min_np,
                            np if max_np is None else max_np, restarts, timeout, dict(env or {}))
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    return run_elastic(cfg)


@click.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-np", "--np", "np", type=int, default=None, help="Number of ranks (default: all --hosts slots).")
@click.option("-H", "--hosts", default=None, help="Host list NAME:SLOTS,... (default: this machine only).")
@click.option("--transport", type=click.Choice(TRANSPORTS), default="torch", show_default=True,
              help="How ranks talk: torch (Gloo, NCCL for CUDA), shm (shared memory, one host), mpi.")
@click.option("--rsh", default="ssh", show_default=True, help="Remote shell used for hosts other than this one.")
@click.option("--port", type=int, default=None, help="Rendezvous port of a multi-host job (torch/shm).")
@click.option("--master-addr", default=None,
              help="Address the other hosts reach the first host at (default: the first host's name).")
@click.option("--cluster", is_flag=True,
              help="Run on the emulated hosts of `ringlet cluster up` (one node launcher per host).")
@click.option("--elastic", is_flag=True,
              help="Keep going when workers die (hvd.elastic scripts): see --min-np, --max-np, --restarts.")
@click.option("--min-np", type=int, default=None, help="--elastic: fewest ranks the job continues with (default -np).")
@click.option("--max-np", type=int, default=None, help="--elastic: most ranks at a time (default -np).")
@click.option("--restarts", type=int, default=0, show_default=True,
              help="--elastic: replacement workers started for workers that die.")
@click.option("--elastic-timeout", type=float, default=600.0, show_default=True,
              help="--elastic: seconds a new membership may take to assemble before absent workers are stopped.")
@click.option("--node-rank", type=int, default=None, hidden=True)
@click.option("--rdzv-endpoint", default=None, hidden=True)
@click.option("--run-id", default=None, hidden=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run_cli(np, hosts, transport, rsh, port, master_addr, cluster, elastic, min_np, max_np, restarts, elastic_timeout,
            node_rank, rdzv_endpoint, run_id, command):
    """Run COMMAND as NP ranks: ringlet run -np 4 [--transport torch|mpi|shm] -- python train.py ARGS..."""
    sys.exit(run(command, np, transport=transport, hosts=hosts, rsh=rsh, port=port, master_addr=master_addr,
                 node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, run_id=run_id, cluster=cluster,
                 elastic=elastic, min_np=min_np, max_np=max_np, restarts=restarts,
                 elastic_timeout=elastic_timeout))
