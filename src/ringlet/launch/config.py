"""What a launch is made of: its options (:class:`RunConfig`), its error, the per-rank shim's path."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

TRANSPORTS = ("torch", "shm", "mpi")
# Started by path, not with -m: importing the ringlet package would import torch (seconds per rank).
SHIM = (str(Path(__file__).with_name("shim.py")), "--")


@dataclass(frozen=True)
class RunConfig:
    """Everything a launch needs once its options are checked; :func:`ringlet.launch.run` builds one."""

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
    # The port of the host's metrics endpoint that the agent serves (ringlet.metrics.host); None: none.
    metrics_port: int | None = None


class LaunchError(Exception):
    """Bad launch options or a missing launcher dependency; ``ringlet run`` exits with :attr:`exit_code`."""

    exit_code = 2


def say(msg: str) -> None:
    """A launcher message on stderr, prefixed as every ``ringlet run`` message is."""
    print(f"ringlet run: {msg}", file=sys.stderr, flush=True)
