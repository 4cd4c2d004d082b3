"""``ringlet cluster up -- COMMAND``: bring the cluster up, run COMMAND on this machine, tear it down.

The cluster goes down when COMMAND ends, fails to start or is interrupted (SIGINT/SIGTERM/SIGHUP are
passed on to COMMAND's process group once, and COMMAND's status is returned).
"""
from __future__ import annotations

import os
import signal
import subprocess

from . import manager
from .state import ClusterError, ClusterSpec


def run_foreground(command, log) -> int:
    """Run ``command`` in its own process group, forwarding SIGINT/SIGTERM/SIGHUP to it once."""
    child: subprocess.Popen | None = None
    early: list[int] = []

    def forward(signum, _frame):
        if child is None:  # arrived while the child was being started: deliver it once it exists
            early.append(signum)
            return
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    # Handlers first: a Ctrl-C between the start of the child and their installation would otherwise
    # stop only us and leave the child (in its own process group) running.
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            child = subprocess.Popen(command, preexec_fn=lambda: os.setpgid(0, 0))
        except OSError as exc:
            log(f"cannot start {command[0]!r}: {exc}")
            return 127
        for signum in early[:1]:
            forward(signum, None)
        while True:
            try:
                rc = child.wait()
                break
            except InterruptedError:
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return rc if rc >= 0 else 128 - rc


def up_and_run(spec: ClusterSpec, command, *, replace: bool = False, log=print) -> int:
    """Bring up ``spec`` (foreground: owned by this process), run ``command``, take the cluster down;
    return the command's status (1 if only the teardown failed). ``ClusterError`` when ``up`` fails."""
    manager.up(spec, replace=replace, foreground=True, log=log)
    rc = 1
    try:
        rc = run_foreground(tuple(command), log)
    finally:
        try:
            manager.down()
            log("cluster down")
        except ClusterError as exc:
            log(str(exc))
            rc = rc or 1
    return rc
