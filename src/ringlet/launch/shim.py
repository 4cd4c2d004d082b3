"""Per-rank wrapper started by ``ringlet run``: ``python .../ringlet/launch/shim.py -- cmd args...``
(``python -m ringlet.launch.shim`` works too but imports torch through the package: seconds per rank).

It derives the rank layout from the launcher's environment (torchrun/elastic: ``RANK``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``...; MPICH Hydra: ``PMI_RANK``, ``PMI_SIZE``,
``MPI_LOCALRANKID``...; Open MPI: ``OMPI_COMM_WORLD_*``), exports ``RINGLET_RANK/SIZE/LOCAL_RANK/
LOCAL_SIZE/CROSS_RANK/CROSS_SIZE`` and the Horovod names (``HOROVOD_RANK`` ... ``HOROVOD_HOSTNAME``),
then runs the command as its child. Staying the parent (instead of ``exec``) lets it

- forward SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 to the command,
- record when and how the command failed (``RINGLET_RUN_DIR/exit-<rank>.json``) so the launcher can
  name the rank that failed *first* and return *its* exit status,
- exit with the command's status (re-raising the signal that killed it).

With ``RINGLET_RUN_HOSTS=h1:4,h2:2`` (set by ``ringlet run --hosts``) the layout follows the host list:
ranks fill hosts in order, ``local_rank`` counts within a host and ``cross_rank`` counts the hosts
before this one that have a rank with the same ``local_rank`` (Horovod's definitions). The host
entry's name becomes ``HOROVOD_HOSTNAME``/``RINGLET_HOSTNAME``, so several entries on one machine act
as separate hosts. Imports nothing heavy: it starts once per rank.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

if __package__:
    from ..layout import Layout, derive_layout, layout_env, layout_from_hosts, parse_hosts
else:  # run as a script (``ringlet run``): load the layout module by its path, not through the package (torch)
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "ringlet_layout", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "layout.py"))
    _layout = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _layout  # dataclasses look their module up
    _spec.loader.exec_module(_layout)
    Layout, derive_layout, layout_env = _layout.Layout, _layout.derive_layout, _layout.layout_env
    layout_from_hosts, parse_hosts = _layout.layout_from_hosts, _layout.parse_hosts

__all__ = ["Layout", "derive_layout", "layout_env", "layout_from_hosts", "main", "parse_hosts"]


def _child_setup():
    """In the child before exec: its own process group (signals reach it only through the shim, never
    twice), and SIGKILL if the shim itself is killed (no orphaned ranks)."""
    os.setpgid(0, 0)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort (non-Linux)
        pass


def _record_failure(lay: Layout, status: int, argv: list[str]) -> None:
    run_dir = os.environ.get("RINGLET_RUN_DIR")
    if not run_dir or not os.path.isdir(run_dir):
        return
    rec = {"rank": lay.rank, "status": status, "time": time.time(), "host": lay.hostname, "pid": os.getpid(),
           "argv": argv}
    tmp = os.path.join(run_dir, f".exit-{lay.rank}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, os.path.join(run_dir, f"exit-{lay.rank}.json"))
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("usage: python -m ringlet.launch.shim -- command [args...]", file=sys.stderr)
        return 2
    lay = derive_layout()
    env = dict(os.environ)
    env.update(layout_env(lay))
    try:
        # close_fds=False: MPI process managers hand the rank an inherited socket (PMI_FD).
        child = subprocess.Popen(argv, env=env, close_fds=False, preexec_fn=_child_setup)
    except OSError as exc:
        print(f"ringlet run: rank {lay.rank}: cannot start {argv[0]!r}: {exc}", file=sys.stderr)
        _record_failure(lay, 127, argv)
        return 127

    def forward(signum, _frame):
        # To the command's whole process group (it leads one), as a terminal would: a shell-script
        # command passes the signal on to the program it started.
        try:
            os.killpg(child.pid, signum)
            if signum in _STOPPING:  # a stopped command (SIGSTOP) must wake up to receive it
                os.killpg(child.pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    for s in FORWARDED:
        signal.signal(s, forward)
    parent = os.getppid()
    while True:
        try:
            rc = child.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            # The launcher died without stopping us (e.g. SIGKILL): stop the command, leave no orphans.
            if os.getppid() != parent:
                forward(signal.SIGTERM, None)
                parent = os.getppid()
        except InterruptedError:
            continue
    if rc != 0:
        status = rc if rc > 0 else 128 - rc
        _record_failure(lay, status, argv)
    if rc < 0:
        # Die of the same signal so that our parent sees what the command saw.
        for s in FORWARDED:
            signal.signal(s, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        time.sleep(1.0)
        return 128 - rc
    return rc


if __name__ == "__main__":
    sys.exit(main())
