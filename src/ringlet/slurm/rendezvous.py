"""``ringlet.init()`` in a task of ``srun``: form the step's world, or fail within seconds on every task.

:func:`prepare` runs before the transport is created. In a multi-task step (:func:`.step.in_step`):

1. the step is read and checked (:func:`.step.read_step`); the job's secret must be in the environment
   (``RINGLET_JOB_SECRET``, exported before ``srun``, which propagates it);
2. task 0 hosts ringlet's authenticated store (:class:`ringlet.store.StoreServer`) on the rendezvous
   host's address and port;
3. every task connects (within ``RINGLET_SLURM_TIMEOUT`` seconds, else it names the host and port that
   did not answer), checks that task 0 describes the same step, and checks in under its rank; all wait
   until every rank has checked in. A task whose own variables are wrong, or that finds its rank taken,
   posts why before it raises, and the others raise with that reason; a rank that never arrives makes
   every task raise after the timeout, naming the missing ranks;
4. the environment then describes the world as torchrun's would (``RANK``, ``WORLD_SIZE``,
   ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``MASTER_ADDR``,
   ``MASTER_PORT``, ``TORCHELASTIC_USE_AGENT_STORE=True``), with ``RINGLET_HOSTNAME`` set to the task's
   Slurm node and the ``RINGLET_*``/``HOROVOD_*`` layout names: the torch transport joins over the store.

At exit every task counts itself out and task 0 keeps the store up until all have (at most
:data:`EXIT_WAIT` seconds), so no task loses the store while it shuts down.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import os
import socket
import threading
import time

from ..layout import Layout, layout_env
from ..security.handshake import AuthError
from ..security.secret import SECRET_ENV, job_secret
from ..store import StoreClient, StoreError, StoreServer
from .step import (ENV_ADDR, ENV_PORT, ENV_TIMEOUT, SlurmEnvError, SlurmStep, TaskEnvError, endpoint_hint, in_step,
                   read_step)

PREFIX = "ringlet/slurm"
ERROR_KEY = f"{PREFIX}/error"
EXIT_WAIT = 30.0  # seconds task 0 keeps the store up at exit for tasks still counting out
POLL = 0.05
HINT_WAIT = 2.0  # seconds a task whose step variables are wrong tries to tell the others
LINGER = 2.0  # seconds task 0's store stays up after a failed rendezvous, for the others to read why

_server: StoreServer | None = None   # task 0's store, for the life of the process
_client: StoreClient | None = None   # this task's rendezvous connection, kept for the count-out
_step: SlurmStep | None = None


def _fail(step_or_env, msg: str) -> SlurmEnvError:
    who = step_or_env.rank if isinstance(step_or_env, SlurmStep) else step_or_env.get("SLURM_PROCID", "?")
    return SlurmEnvError(f"ringlet.init under Slurm (task {who}): {msg} (see docs/launching.md)")


def prepare(transport=None, env=None) -> SlurmStep | None:
    """Form the world of the Slurm step this process is a task of (module docstring); None when it is
    not in a multi-task step, when another launcher describes the world, or when ``transport`` names one
    that forms its own (``mpi``). Raises :class:`SlurmEnvError` naming what is wrong."""
    env = os.environ if env is None else env
    name = (transport if isinstance(transport, str) else env.get("RINGLET_TRANSPORT", "")).strip().lower()
    if name not in ("", "torch", "shm") or not in_step(env):
        return None
    try:
        step = read_step(env)
    except TaskEnvError as exc:
        secret = _secret(env, exc.step)
        _tell_others(exc.step.addr, exc.step.port, secret, f"task {exc.step.rank}: {exc}", min(exc.step.timeout, 5.0))
        raise _fail(exc.step, str(exc)) from None
    except SlurmEnvError as exc:
        hint = endpoint_hint(env)
        if hint is not None and env.get(SECRET_ENV, "").strip():
            with contextlib.suppress(ValueError):
                _tell_others(*hint, job_secret(env), f"task {env.get('SLURM_PROCID', '?')}: {exc}", HINT_WAIT)
        raise _fail(env, str(exc)) from None
    secret = _secret(env, step)
    client = _join(step, secret)
    _export(step, env)
    global _client, _step
    _client, _step = client, step
    atexit.register(_count_out)
    return step


def _secret(env, step: SlurmStep) -> bytes:
    try:
        secret = job_secret(env)
    except ValueError as exc:
        raise _fail(step, str(exc)) from None
    if secret is None:
        raise _fail(step, f"{SECRET_ENV} is not set. Every task needs the job's secret, so that the rendezvous "
                          "refuses strangers: export RINGLET_JOB_SECRET=$(python3 -c 'import secrets; "
                          "print(secrets.token_hex(32))') before srun (srun passes the environment on)")
    return secret


def _where(step: SlurmStep) -> str:
    return f"{step.addr}:{step.port}"


def _serve(step: SlurmStep, secret: bytes) -> StoreServer:
    """Task 0's store on the rendezvous address (every interface when that resolves to loopback in a step
    over several nodes, as an /etc/hosts entry 127.0.1.1 would)."""
    try:
        ip = socket.getaddrinfo(step.addr, step.port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, IndexError) as exc:
        raise _fail(step, f"cannot resolve the rendezvous host {step.addr!r}: {exc}; set {ENV_ADDR}") from None
    bind = "" if ip.startswith("127.") and len(set(step.nodes)) > 1 else ip
    try:
        return StoreServer(bind, step.port, secret)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            why = (f"port {step.port} is in use on {step.addr} (another job or step on this node?); set {ENV_PORT} "
                   "to a free port")
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = (f"the rendezvous host {step.addr} ({ip}) is not an address of this node ({step.node}), where "
                   f"task 0 runs; set {ENV_ADDR} to this node's address")
        else:
            why = f"cannot listen on {ip}:{step.port}: {exc}"
        raise _fail(step, why) from None


def _connect(step: SlurmStep, secret: bytes, timeout: float) -> StoreClient:
    try:
        return StoreClient(step.addr, step.port, secret, timeout=step.timeout, connect_timeout=timeout)
    except AuthError as exc:
        raise _fail(step, f"the rendezvous at {_where(step)} did not accept this task's {SECRET_ENV} ({exc}): the "
                          f"tasks' secrets differ, or another program holds the port (set {ENV_PORT})") from None
    except (StoreError, OSError) as exc:
        raise _fail(step, f"the rendezvous host {_where(step)} (task 0, on node {step.nodes[0]}) did not answer "
                          f"within {timeout:g}s ({exc}); is task 0 running there? ({ENV_ADDR}, {ENV_PORT} and "
                          f"{ENV_TIMEOUT} change the host, port and wait)") from None


def _tell_others(addr: str, port: int, secret: bytes, msg: str, wait: float) -> None:
    """Best effort: post ``msg`` where the other tasks wait (trying to reach it for ``wait`` seconds), so that
    they stop now rather than at the timeout. The first reason posted stays."""
    try:
        client = StoreClient(addr, port, secret, timeout=5.0, connect_timeout=wait)
        client.compare_set(ERROR_KEY, "", msg)
        client.close()
    except Exception:  # noqa: BLE001 - the task raises its own error anyway
        pass


def _join(step: SlurmStep, secret: bytes) -> StoreClient:
    """Steps 2-3 of the module docstring; returns this task's connection to the store. When it fails, task 0
    posts why (the others stop at once) and closes its store :data:`LINGER` seconds later."""
    global _server
    if step.rank == 0 and _server is None:
        _server = _serve(step, secret)
    client = None
    try:
        client = _connect(step, secret, step.timeout)
        _same_step(client, step)
        _check_in(client, step)
        return client
    except StoreError as exc:
        err = _fail(step, f"the rendezvous at {_where(step)} failed: {exc}")
    except SlurmEnvError as exc:
        err = exc
    if client is not None:
        client.close()
    if step.rank == 0 and _server is not None:
        _tell_others(step.addr, step.port, secret, str(err), 1.0)
        threading.Timer(LINGER, _server.close).start()
        _server = None
    raise err


def _same_step(client: StoreClient, step: SlurmStep) -> None:
    key = f"{PREFIX}/step"
    if step.rank == 0:
        client.set(key, step.describe())
        return
    try:
        theirs = client.get(key, timeout=step.timeout).decode()
    except StoreError:
        raise _fail(step, f"the store at {_where(step)} never said which step it serves") from None
    if theirs != step.describe():
        client.compare_set(ERROR_KEY, "", f"task {step.rank} is in {step.describe()!r}, task 0 in {theirs!r}")
        raise _fail(step, f"the rendezvous at {_where(step)} serves {theirs!r}, but this task is in "
                          f"{step.describe()!r}: the tasks' Slurm variables disagree, or another step holds the "
                          f"port (set {ENV_PORT})")


def _check_in(client: StoreClient, step: SlurmStep) -> None:
    if client.add(f"{PREFIX}/task/{step.rank}", 1) > 1:
        msg = f"two tasks have SLURM_PROCID={step.rank}"
        client.compare_set(ERROR_KEY, "", msg)
        raise _fail(step, msg)
    arrived = client.add(f"{PREFIX}/arrived", 1)
    deadline = time.monotonic() + step.timeout
    while arrived < step.size:
        if client.check([ERROR_KEY]):
            raise _fail(step, f"another task stopped the rendezvous: {client.get(ERROR_KEY).decode()}")
        if time.monotonic() > deadline:
            missing = [r for r in range(step.size) if not client.check([f"{PREFIX}/task/{r}"])]
            shown = ", ".join(map(str, missing[:16])) + (", ..." if len(missing) > 16 else "")
            raise _fail(step, f"{len(missing)} of the step's {step.size} tasks (ranks {shown}) did not reach the "
                              f"rendezvous at {_where(step)} within {step.timeout:g}s ({ENV_TIMEOUT})")
        time.sleep(POLL)
        arrived = client.add(f"{PREFIX}/arrived", 0)


def _export(step: SlurmStep, env) -> None:
    """Step 4 of the module docstring."""
    env.update({
        "RANK": str(step.rank), "WORLD_SIZE": str(step.size), "LOCAL_RANK": str(step.local_rank),
        "LOCAL_WORLD_SIZE": str(step.local_size), "GROUP_RANK": str(step.node_index),
        "GROUP_WORLD_SIZE": str(len(step.nodes)), "MASTER_ADDR": step.addr, "MASTER_PORT": str(step.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        # srun passes the submitting shell's environment on: a RINGLET_HOSTNAME there would put every task
        # on one host. The task's Slurm node is its host.
        "RINGLET_HOSTNAME": step.node,
    })
    lay = Layout(step.rank, step.size, step.local_rank, step.local_size, step.cross_rank, step.cross_size,
                 step.node, True)
    env.update(layout_env(lay, env))


def _count_out() -> None:
    """At exit: count this task out; task 0 then keeps its store up until every task has (EXIT_WAIT)."""
    global _client, _server
    client, server = _client, _server
    _client = _server = None
    if client is None:
        return
    try:
        left = client.add(f"{PREFIX}/left", 1)
        deadline = time.monotonic() + min(EXIT_WAIT, _step.timeout if _step else EXIT_WAIT)
        while server is not None and left < _step.size and time.monotonic() < deadline:
            time.sleep(POLL)
            left = client.add(f"{PREFIX}/left", 0)
    except Exception:  # noqa: BLE001 - leaving must not fail a job that finished
        pass
    finally:
        client.close()
        if server is not None:
            server.close()
