"""``ringlet run`` inside a Slurm allocation (``salloc``, an ``sbatch`` script): its host list and remote shell.

When ``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST`` are set, no job step is running (no ``SLURM_STEP_ID`` of a
real step: ``ringlet run`` was not itself started by ``srun``) and the allocation has several nodes,
``ringlet run`` without ``--hosts`` places one node launcher per allocated node:

- ``--hosts`` from the allocation: every node with the job's tasks per node (``SLURM_TASKS_PER_NODE``,
  one per node when it is not set), or with ``-np N`` spread over the nodes as evenly as possible (the
  first ``N mod nodes`` nodes get one more; nodes left with none are not used);
- the remote shell :data:`RSH_SCRIPT`, which runs each node launcher as a one-task step on its node
  (``srun --nodes=1 --ntasks=1 --nodelist=NODE --overlap --whole``), without the submitting shell's
  ``RINGLET_HOSTNAME``/``HOROVOD_HOSTNAME`` (each node's launcher names its own host).

An explicit ``--hosts`` or ``--rsh`` wins. The job's secret reaches the node launchers through ``srun``'s
standard input, as it does through ssh's.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from .nodelist import NodeListError, expand_counts, expand_nodelist
from .step import SPECIAL_STEPS

RSH_SCRIPT = str(Path(__file__).with_name("_srun_rsh.py"))


def in_allocation(env=None) -> bool:
    """True inside an allocation and outside any of its job steps."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID", "").strip() or not env.get("SLURM_JOB_NODELIST", "").strip():
        return False
    step = (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "").strip()
    return not (step.isdigit() and int(step) < SPECIAL_STEPS)


def spread(np: int, nodes: int) -> list[int]:
    """``np`` ranks over ``nodes`` nodes, as evenly as possible, the first nodes taking the remainder."""
    base, extra = divmod(np, nodes)
    return [base + (1 if i < extra else 0) for i in range(nodes)]


def allocation_hosts(np: int | None, env=None) -> list[tuple[str, int]] | None:
    """The host list of a ``ringlet run`` inside the allocation (module docstring), or None outside one or
    when it has a single node. Raises ``ValueError`` when the allocation's variables do not parse."""
    env = os.environ if env is None else env
    if not in_allocation(env):
        return None
    try:
        nodes = expand_nodelist(env["SLURM_JOB_NODELIST"])
        text = env.get("SLURM_TASKS_PER_NODE", "").strip()
        counts = expand_counts(text) if text else [1] * len(nodes)
    except NodeListError as exc:
        raise ValueError(f"Slurm allocation {env['SLURM_JOB_ID']}: {exc}") from None
    if len(counts) != len(nodes):
        raise ValueError(f"Slurm allocation {env['SLURM_JOB_ID']}: SLURM_TASKS_PER_NODE={text!r} gives "
                         f"{len(counts)} nodes but SLURM_JOB_NODELIST has {len(nodes)}")
    if len(nodes) < 2:
        return None
    if np is not None:
        counts = spread(np, len(nodes))
    return [(n, c) for n, c in zip(nodes, counts) if c > 0]


def srun_rsh() -> str:
    """The ``--rsh`` command that starts a node launcher through ``srun`` (module docstring)."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(RSH_SCRIPT)}"
