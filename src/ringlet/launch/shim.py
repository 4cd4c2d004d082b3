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
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@dataclass(frozen=True)
class Layout:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    from_hosts: bool = False  # hostname comes from an explicit --hosts entry


def parse_hosts(spec: str) -> list[tuple[str, int]]:
    """``"h1:4,h2:2"`` → ``[("h1", 4), ("h2", 2)]``; a bare name has one slot."""
    out: list[tuple[str, int]] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, slots = item.rpartition(":")
        if not sep:
            name, slots = item, "1"
        if not name:
            raise ValueError(f"Bad host entry {item!r}: expected NAME:SLOTS.")
        try:
            n = int(slots)
        except ValueError:
            raise ValueError(f"Bad host entry {item!r}: slots must be an integer.") from None
        if n < 1:
            raise ValueError(f"Bad host entry {item!r}: slots must be at least 1.")
        out.append((name, n))
    if not out:
        raise ValueError(f"No hosts in {spec!r}.")
    return out


def layout_from_hosts(rank: int, size: int, hosts: list[tuple[str, int]]) -> Layout:
    """Rank layout when ranks fill ``hosts`` in order (block placement, as elastic and Hydra do)."""
    total = sum(n for _, n in hosts)
    if total != size:
        raise ValueError(f"The host list has {total} slots but the job has {size} ranks.")
    start = 0
    for h, (name, n) in enumerate(hosts):
        if rank < start + n:
            lr = rank - start
            cross_rank = sum(1 for _, m in hosts[:h] if m > lr)
            cross_size = sum(1 for _, m in hosts if m > lr)
            return Layout(rank, size, lr, n, cross_rank, cross_size, name, True)
        start += n
    raise ValueError(f"Rank {rank} is outside the host list ({total} slots).")


def _int(env, *names: str) -> int | None:
    for n in names:
        v = env.get(n)
        if v not in (None, ""):
            return int(v)
    return None


def derive_layout(env=None) -> Layout:
    """The layout of this process from its launcher's environment (see the module docstring)."""
    env = os.environ if env is None else env
    host = socket.gethostname()
    if _int(env, "RANK") is not None and _int(env, "WORLD_SIZE") is not None:  # torchrun / elastic
        rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK") or 0
        local_size = _int(env, "LOCAL_WORLD_SIZE") or size
        cross_rank = _int(env, "GROUP_RANK")
        cross_size = _int(env, "GROUP_WORLD_SIZE")
        if cross_rank is None or cross_size is None:
            cross_rank, cross_size = rank // local_size, max(1, size // local_size)
    elif _int(env, "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK") is not None:  # mpiexec
        rank = _int(env, "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
        size = _int(env, "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
        if size is None:
            raise RuntimeError("Cannot find the MPI world size in the environment (PMI_SIZE/OMPI_COMM_WORLD_SIZE).")
        local_rank = _int(env, "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK")
        local_size = _int(env, "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
        if local_rank is None or local_size is None:
            local_rank, local_size = rank, size
        # Homogeneous block placement; --hosts gives the exact layout below.
        cross_rank, cross_size = rank // local_size, max(1, size // local_size)
        host = env.get("PMI_HOSTNAME") or host
    else:
        rank, size, local_rank, local_size, cross_rank, cross_size = 0, 1, 0, 1, 0, 1
    hosts = env.get("RINGLET_RUN_HOSTS")
    if hosts:
        return layout_from_hosts(rank, size, parse_hosts(hosts))
    return Layout(rank, size, local_rank, local_size, cross_rank, cross_size, host)


def layout_env(lay: Layout, env=None) -> dict[str, str]:
    """The variables the shim exports for ``lay`` (Horovod compatibility included)."""
    env = os.environ if env is None else env
    out = {}
    for prefix in ("RINGLET", "HOROVOD"):
        out[f"{prefix}_RANK"] = str(lay.rank)
        out[f"{prefix}_SIZE"] = str(lay.size)
        out[f"{prefix}_LOCAL_RANK"] = str(lay.local_rank)
        out[f"{prefix}_LOCAL_SIZE"] = str(lay.local_size)
        out[f"{prefix}_CROSS_RANK"] = str(lay.cross_rank)
        out[f"{prefix}_CROSS_SIZE"] = str(lay.cross_size)
    out["HOROVOD_HOSTNAME"] = lay.hostname
    if lay.from_hosts and not env.get("RINGLET_HOSTNAME"):
        # ringlet groups ranks into hosts by this name: --hosts entries are hosts even on one machine.
        out["RINGLET_HOSTNAME"] = lay.hostname
    return out


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
