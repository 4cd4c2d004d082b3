"""What a Slurm step's environment says about the world: detection, validation, rendezvous address.

A process belongs to a multi-task Slurm step (``srun python train.py``) when all of these hold:

- ``SLURM_STEP_ID`` (or ``SLURM_STEPID``) is a job step's id: not one of Slurm's special steps (the batch
  script, the extern and interactive steps have ids >= ``0xFFFFFFF0``, and a batch script has none), so a
  script that merely runs inside an allocation (``sbatch``/``salloc``) is never taken for a step;
- the step has more than one task (``SLURM_STEP_NUM_TASKS``, else ``SLURM_NTASKS``);
- no other launcher described the world: torchrun / ``ringlet run`` (``RANK`` and ``WORLD_SIZE``, or
  ``TORCHELASTIC_RUN_ID``), ``ringlet run --elastic`` (``RINGLET_ELASTIC``), mpiexec or a PMI (``PMI_RANK``,
  ``PMI_SIZE``, ``PMIX_RANK``, ``OMPI_COMM_WORLD_SIZE``, ``MPI_LOCALNRANKS``). Those win.

The rendezvous is on the first node of the step's node list (``RINGLET_SLURM_ADDR`` overrides the host)
at :func:`rendezvous_port` (``RINGLET_SLURM_PORT`` overrides it). A step whose variables are missing,
inconsistent or out of range raises :class:`SlurmEnvError` naming the variable. Standard library only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .nodelist import NodeListError, expand_counts, expand_nodelist

ENV_ADDR = "RINGLET_SLURM_ADDR"
ENV_PORT = "RINGLET_SLURM_PORT"
ENV_TIMEOUT = "RINGLET_SLURM_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
# Port formula: PORT_BASE + (job_id * STEP_SLOTS + step_id % STEP_SLOTS) % PORT_SPAN, i.e. 12000-31999
# (below Linux's ephemeral range, 32768-60999): the steps of one job differ, consecutive jobs differ.
PORT_BASE, PORT_SPAN, STEP_SLOTS = 12000, 20000, 32
SPECIAL_STEPS = 0xFFFFFFF0  # Slurm's batch, extern, interactive and pending steps have ids from here on
OTHER_LAUNCHERS = ("TORCHELASTIC_RUN_ID", "RINGLET_ELASTIC", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
                   "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


class SlurmEnvError(RuntimeError):
    """A Slurm step whose environment does not describe a world ringlet can form."""


class TaskEnvError(SlurmEnvError):
    """This task's own variables are out of range while the step's are sound: ``step`` still says where
    the rendezvous is, so the task can tell the others before it stops."""

    def __init__(self, msg: str, step: "SlurmStep"):
        super().__init__(msg)
        self.step = step


def _first(env, *names: str) -> tuple[str | None, str | None]:
    for n in names:
        v = env.get(n)
        if v is not None and v.strip() != "":
            return n, v.strip()
    return None, None


def _int(env, *names: str, required: bool = True) -> int | None:
    name, text = _first(env, *names)
    if name is None:
        if required:
            raise SlurmEnvError(f"Slurm step without {' or '.join(names)} in its environment")
        return None
    try:
        return int(text)
    except ValueError:
        raise SlurmEnvError(f"{name}={text!r} is not an integer") from None


def rendezvous_port(job_id: int, step_id: int) -> int:
    """``12000 + (job_id * 32 + step_id % 32) % 20000``: a port in 12000-31999 that the tasks of one step
    agree on without talking, different for the steps of a job and for consecutive jobs."""
    return PORT_BASE + (int(job_id) * STEP_SLOTS + int(step_id) % STEP_SLOTS) % PORT_SPAN


def other_launcher(env) -> bool:
    """True when torchrun, ``ringlet run`` or an MPI launcher described the world."""
    if env.get("RANK", "").strip() and env.get("WORLD_SIZE", "").strip():
        return True
    return any(env.get(k, "").strip() for k in OTHER_LAUNCHERS)


def in_step(env=None) -> bool:
    """True in a task of a multi-task Slurm step that no other launcher describes (module docstring).
    Never raises: a malformed step id or task count counts as a step, so :func:`read_step` reports it."""
    env = os.environ if env is None else env
    if other_launcher(env):
        return False
    _, step = _first(env, "SLURM_STEP_ID", "SLURM_STEPID")
    if step is None:
        return False
    _, ntasks = _first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    try:
        if not 0 <= int(step) < SPECIAL_STEPS:
            return False
        return ntasks is None or int(ntasks) > 1
    except ValueError:
        return True


@dataclass(frozen=True)
class SlurmStep:
    """A task's place in its step and where the step meets."""

    job_id: int
    step_id: int
    rank: int
    size: int
    local_rank: int
    node_index: int
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    addr: str
    port: int
    timeout: float

    @property
    def node(self) -> str:
        return self.nodes[self.node_index]

    @property
    def local_size(self) -> int:
        return self.tasks_per_node[self.node_index]

    @property
    def cross_rank(self) -> int:
        """Horovod's: nodes before this one that have a task with this local rank."""
        return sum(1 for n in self.tasks_per_node[:self.node_index] if n > self.local_rank)

    @property
    def cross_size(self) -> int:
        return sum(1 for n in self.tasks_per_node if n > self.local_rank)

    @property
    def name(self) -> str:
        return f"{self.job_id}.{self.step_id}"

    def describe(self) -> str:
        """What every task of the step must agree on (compared at the rendezvous)."""
        return f"step {self.name}: {self.size} tasks on {','.join(self.nodes)} ({','.join(map(str, self.tasks_per_node))})"


def _nodes(env) -> tuple[list[str], list[int]]:
    name, text = _first(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if name is None:
        raise SlurmEnvError("Slurm step without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST in its environment")
    try:
        nodes = expand_nodelist(text)
    except NodeListError as exc:
        raise SlurmEnvError(f"{name}: {exc}") from None
    cname, ctext = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if cname is None:
        raise SlurmEnvError("Slurm step without SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE in its environment")
    try:
        counts = expand_counts(ctext)
    except NodeListError as exc:
        raise SlurmEnvError(f"{cname}: {exc}") from None
    if len(counts) != len(nodes):
        raise SlurmEnvError(f"{cname}={ctext!r} gives {len(counts)} nodes but {name}={text!r} has {len(nodes)}")
    num = _int(env, "SLURM_STEP_NUM_NODES", required=False)
    if num is not None and num != len(nodes):
        raise SlurmEnvError(f"SLURM_STEP_NUM_NODES={num} but {name}={text!r} has {len(nodes)} nodes")
    return nodes, counts


def _endpoint(env, nodes: list[str], job_id: int, step_id: int) -> tuple[str, int, float]:
    addr = (env.get(ENV_ADDR) or "").strip() or nodes[0]
    port_text = (env.get(ENV_PORT) or "").strip()
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise SlurmEnvError(f"{ENV_PORT}={port_text!r} is not a TCP port (1-65535)")
        port = int(port_text)
    else:
        port = rendezvous_port(job_id, step_id)
    timeout_text = (env.get(ENV_TIMEOUT) or "").strip()
    try:
        timeout = float(timeout_text) if timeout_text else DEFAULT_TIMEOUT
    except ValueError:
        raise SlurmEnvError(f"{ENV_TIMEOUT}={timeout_text!r} is not a number of seconds") from None
    if not timeout > 0:
        raise SlurmEnvError(f"{ENV_TIMEOUT}={timeout_text!r} must be positive")
    return addr, port, timeout


def endpoint_hint(env) -> tuple[str, int] | None:
    """Best effort for a task whose variables are wrong: where the others would meet (None when that
    cannot be known either), so that it can tell them why it will not come."""
    try:
        _, text = _first(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        nodes = expand_nodelist(text) if text else []
        job_id, step_id = _int(env, "SLURM_JOB_ID", "SLURM_JOBID"), _int(env, "SLURM_STEP_ID", "SLURM_STEPID")
        if not nodes and not (env.get(ENV_ADDR) or "").strip():
            return None
        addr, port, _ = _endpoint(env, nodes or [""], job_id, step_id)
        return addr, port
    except (SlurmEnvError, NodeListError):
        return None


def read_step(env=None) -> SlurmStep:
    """This task's :class:`SlurmStep`. Raises :class:`SlurmEnvError` when the step's variables are missing
    or disagree (task counts, node list), and :class:`TaskEnvError` when this task's own rank, node or
    local rank is out of the step's range."""
    env = os.environ if env is None else env
    job_id = _int(env, "SLURM_JOB_ID", "SLURM_JOBID")
    step_id = _int(env, "SLURM_STEP_ID", "SLURM_STEPID")
    size = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    rank = _int(env, "SLURM_PROCID")
    local_rank = _int(env, "SLURM_LOCALID")
    node_index = _int(env, "SLURM_NODEID")
    nodes, counts = _nodes(env)
    if sum(counts) != size:
        raise SlurmEnvError(f"task count mismatch: the step has {size} tasks (SLURM_STEP_NUM_TASKS/SLURM_NTASKS) "
                            f"but its nodes hold {sum(counts)} ({','.join(map(str, counts))})")
    addr, port, timeout = _endpoint(env, nodes, job_id, step_id)
    step = SlurmStep(job_id, step_id, rank, size, local_rank, node_index, tuple(nodes), tuple(counts), addr, port,
                     timeout)
    if not 0 <= rank < size:
        raise TaskEnvError(f"SLURM_PROCID={rank} is outside the step's {size} tasks", step)
    if not 0 <= node_index < len(nodes):
        raise TaskEnvError(f"SLURM_NODEID={node_index} is outside the step's {len(nodes)} nodes", step)
    if not 0 <= local_rank < counts[node_index]:
        raise TaskEnvError(f"SLURM_LOCALID={local_rank} is outside the {counts[node_index]} tasks of node "
                           f"{nodes[node_index]}", step)
    if rank == 0 and node_index != 0 and not (env.get(ENV_ADDR) or "").strip():
        raise TaskEnvError(f"task 0 runs on node {nodes[node_index]}, not on the first node {nodes[0]} where the "
                           f"others look for it; set {ENV_ADDR} to task 0's node", step)
    return step
