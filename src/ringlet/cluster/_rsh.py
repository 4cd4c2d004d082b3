"""Enter an emulated host and run a command there: the "remote shell" of ``ringlet run --cluster``.

::

    python .../ringlet/cluster/_rsh.py [--state FILE] HOST 'shell command'    # as ssh does
    python .../ringlet/cluster/_rsh.py [--state FILE] --argv HOST prog args   # exact argv (cluster exec)

Entering host ``rgl-hN`` means, in this order:

1. join the host's CPU cgroup (before ``ip netns exec``, which remounts /sys and hides the cgroup
   file system); every process started from here on inherits the quota;
2. a UTS namespace of its own whose hostname is the host name (``socket.gethostname()`` differs
   per emulated host, as on real machines; /etc/netns/NAME/hosts maps the names to addresses);
3. ``RINGLET_HOSTNAME``/``GLOO_SOCKET_IFNAME``/``TP_SOCKET_IFNAME`` so that ringlet groups ranks by
   emulated host and Gloo binds the host's link, not 127.0.0.1;
4. ``exec ip netns exec NS ...``.

Started by path with only the standard library (it reads the state JSON itself): it runs once per
host launcher and must not import torch.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys

CLONE_NEWUTS = 0x04000000
STATE_PATH = "/run/ringlet/cluster.json" if os.path.isdir("/run") else "/tmp/ringlet/cluster.json"
HOST_IFNAME = "eth0"


def _fail(msg: str) -> None:
    print(f"ringlet cluster: {msg}", file=sys.stderr)
    sys.exit(255)  # what ssh returns when it cannot reach the host


def find_host(state: dict, name: str) -> dict:
    for h in state["hosts"]:
        if name in (h["name"], h["name"][4:], str(h["index"]), h["addr"]):
            return h
    _fail(f"no host {name!r} in the cluster; hosts: {', '.join(h['name'] for h in state['hosts'])}")
    raise AssertionError


def host_env(state: dict, host: dict) -> dict[str, str]:
    """Variables every process of an emulated host sees."""
    return {
        "RINGLET_HOSTNAME": host["name"],
        "RINGLET_CLUSTER_HOST": host["name"],
        "RINGLET_CLUSTER_INTRA": state["spec"].get("intra", "shm"),
        "GLOO_SOCKET_IFNAME": HOST_IFNAME,
        "TP_SOCKET_IFNAME": HOST_IFNAME,
    }


def enter(state: dict, host: dict) -> None:
    """Steps 1-3 of the module docstring, applied to this process."""
    if state.get("cgroup_dir"):
        procs = os.path.join(state["cgroup_dir"], host["name"], "cgroup.procs")
        fd = os.environ.get("RINGLET_CLUSTER_CGROUP_FD")
        if not os.path.exists(procs) and fd:
            # Called from inside another emulated host (mpiexec on rgl-h0 starting its proxies): `ip netns exec`
            # hid the cgroup file system there; the directory descriptor inherited from the outer entry still works.
            procs = f"/proc/self/fd/{fd}/{host['name']}/cgroup.procs"
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            _fail(f"cannot join the CPU cgroup of {host['name']} ({procs}): {exc.strerror or exc}; "
                  "is the cluster still up? (`ringlet cluster status`)")
        if "RINGLET_CLUSTER_CGROUP_FD" not in os.environ and os.path.isdir(state["cgroup_dir"]):
            keep = os.open(state["cgroup_dir"], os.O_RDONLY | os.O_DIRECTORY)
            os.set_inheritable(keep, True)
            os.environ["RINGLET_CLUSTER_CGROUP_FD"] = str(keep)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUTS) == 0:
        socket.sethostname(host["name"])
    # else: keep the shared hostname; RINGLET_HOSTNAME still tells ringlet which host this is.
    os.environ.update(host_env(state, host))


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    path, exact = os.environ.get("RINGLET_CLUSTER_STATE", STATE_PATH), False
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt == "--state" and args:
            path = args.pop(0)
        elif opt == "--argv":
            exact = True
        elif opt == "--":
            break
        # other options (ssh's -x, -tt ...) mean nothing here
    if not args:
        _fail("usage: _rsh.py [--state FILE] [--argv] HOST [COMMAND...]")
    name, cmd = args[0], args[1:]
    if os.geteuid() != 0:
        _fail("entering an emulated host needs root (network namespaces and cgroups).")
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        _fail(f"no emulated cluster is up ({path} is missing); start one with `ringlet cluster up --hosts N`.")
    host = find_host(state, name)
    if not os.path.exists(f"/run/netns/{host['name']}") and not os.path.exists(f"/var/run/netns/{host['name']}"):
        _fail(f"the network namespace of {host['name']} is gone; run `ringlet cluster down` and `up` again.")
    enter(state, host)
    if not cmd:
        cmd = [os.environ.get("SHELL") or "/bin/sh", "-i"]
    elif not exact:
        cmd = ["/bin/sh", "-c", " ".join(cmd)]  # as ssh: the words form one shell command
        # As a remote shell, die with the launcher that started us: SIGTERM survives the execs below, so
        # the node launcher this becomes stops its ranks if `ringlet run` is killed outright.
        parent = os.getppid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            sys.exit(255)
    try:
        os.execvp("ip", ["ip", "netns", "exec", host["name"], *cmd])
    except OSError as exc:
        _fail(f"cannot run `ip netns exec`: {exc}")


if __name__ == "__main__":
    main()
