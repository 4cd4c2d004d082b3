"""Bring an emulated cluster up, describe it, tear it down (the logic behind ``ringlet cluster``).

``up`` builds the hosts described in :mod:`ringlet.cluster.netns` and :mod:`ringlet.cluster.cgroup`,
checks that every host reaches the first one, and writes the state file; if any step fails it
removes what it made. ``down`` removes *everything* named ``rgl-*`` (namespaces, links, cgroups,
/etc/netns entries, the state file), stopping the processes still running in the hosts first, so
it also cleans up after a crashed run or a half-made cluster.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import cgroup, linktest, netns
from . import state as st
from .state import PREFIX, ClusterError, ClusterSpec, ClusterState

Log = Callable[[str], None]


def _quiet(_msg: str) -> None:
    pass


def check_privileges() -> None:
    """Root and iproute2 are required; say so plainly."""
    if os.geteuid() != 0:
        raise ClusterError("ringlet cluster needs root: it creates network namespaces, a bridge, tc rate caps "
                           "and CPU cgroups. Run it as root, e.g. `sudo $(which ringlet) cluster up --hosts 2`.")
    missing = netns.missing_tools()
    if missing:
        raise ClusterError(f"ringlet cluster needs iproute2 (missing: {', '.join(missing)}); "
                           "install it with your package manager (Debian/Ubuntu: apt-get install iproute2).")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def leftovers() -> list[str]:
    """Everything named ``rgl-*`` that exists now (empty when the machine is clean)."""
    out = [f"netns {n}" for n in netns.list_netns()] + [f"link {n}" for n in netns.list_links()]
    out += [f"file {p}" for p in netns.list_etc()]
    ctl = cgroup.detect()
    if ctl is not None:
        out += [f"cgroup {os.path.join(ctl.root, g)}" for g in ctl.groups(PREFIX)]
    if st.STATE_PATH.exists():
        out.append(f"file {st.STATE_PATH}")
    return out


def _clear_the_way(replace: bool, log: Log) -> None:
    """Refuse a cluster that is up unless ``replace``; remove it, or the leftovers of a crashed one."""
    old = st.load()
    if old is not None and not replace and not (old.foreground and not alive(old.pid)):
        raise ClusterError(f"A cluster of {len(old.hosts)} hosts is already up (see `ringlet cluster status`); "
                           "remove it with `ringlet cluster down`, or pass --replace.")
    if old is not None or leftovers():
        log("removing the earlier cluster" if old is not None and replace else "removing leftovers of a crashed cluster")
        down(log=log)


def up(spec: ClusterSpec, *, replace: bool = False, foreground: bool = False, log: Log = _quiet) -> ClusterState:
    """Create the cluster of ``spec``; return its state (also saved to :data:`state.STATE_PATH`).

    An existing cluster is an error unless ``replace``; leftovers of a crashed run (a state file whose
    foreground owner died, or ``rgl-*`` objects without a state file) are removed first."""
    check_privileges()
    try:
        spec = spec.validate()
    except ValueError as exc:
        raise ClusterError(str(exc)) from None
    _clear_the_way(replace, log)
    net = spec.network()
    clash = netns.overlapping_routes(net)
    if clash:
        raise ClusterError(f"--subnet {spec.subnet} overlaps routes of this machine ({'; '.join(clash)}); "
                           "choose another private subnet with --subnet.")
    cpus = spec.cpus()
    ctl = None
    if cpus > 0:
        ctl = cgroup.detect()
        if ctl is None:
            raise ClusterError("No cgroup cpu controller is mounted (neither v1 `cpu` nor v2 with `cpu`); "
                               "pass --cpus-per-host 0 to run without CPU quotas.")
    hosts = st.plan_hosts(spec)
    state = ClusterState(spec, hosts, ctl.version if ctl else None, ctl.root if ctl else None, cpus,
                         foreground=foreground)
    rate = spec.rate_bits()
    try:
        netns.create_bridge()
        text = netns.hosts_file(hosts)
        for h in hosts:
            netns.create_host(h, net.prefixlen, rate, spec.cap_ingress, text, spec.burst)
            if ctl is not None:
                ctl.create(h.name, cpus)
        problems = linktest.connectivity(state)
        if problems:
            raise ClusterError("The emulated hosts cannot reach each other: " + "; ".join(problems) +
                               ". A firewall may filter bridged traffic (check `sysctl net.bridge."
                               "bridge-nf-call-iptables` and the FORWARD chain).")
        st.save(state)
    except cgroup.CgroupError as exc:
        down(log=_quiet)
        raise ClusterError(f"Cannot give the hosts a CPU quota: {exc}. Pass --cpus-per-host 0 to run without "
                           "quotas.") from None
    except OSError as exc:
        down(log=_quiet)
        raise ClusterError(f"Cannot set the cluster up: {exc}") from None
    except BaseException:
        down(log=_quiet)
        raise
    log(f"cluster up: {len(hosts)} hosts × {spec.ranks_per_host} rank(s), links {st.format_rate(rate)}"
        f"{' each way' if spec.cap_ingress else ' (upload only)'}"
        f"{f', {netns.bucket_text(rate, spec.burst)}' if spec.burst is not None else ''}, "
        + (f"{cpus:g} CPU per host (cgroup v{ctl.version})" if ctl else "no CPU quota"))
    return state


def _stop(pids: set[int], grace: float = 3.0) -> int:
    """SIGTERM the processes, then SIGKILL those still alive after ``grace`` seconds. Never this process
    or its ancestors (e.g. `down` run from a shell inside a host)."""
    keep, p = set(), os.getpid()
    while p > 1:
        keep.add(p)
        try:
            with open(f"/proc/{p}/stat") as f:
                p = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    pids = {p for p in pids if p not in keep and p > 1}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) and not _zombie(p) for p in pids):
            time.sleep(0.05)
        pids = {p for p in pids if alive(p) and not _zombie(p)}
        if not pids:
            break
    return len(pids)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def down(*, log: Log = _quiet) -> list[str]:
    """Remove every ``rgl-*`` object and the state file; return what was removed. Idempotent."""
    check_privileges()
    removed, errors = [], []
    ctl = cgroup.detect()
    groups = ctl.groups(PREFIX) if ctl is not None else []
    spaces = netns.list_netns()
    pids = {p for ns in spaces for p in netns.netns_pids(ns)}
    pids |= {p for g in groups for p in ctl.pids(g)} if ctl is not None else set()
    if pids:
        log(f"stopping {len(pids)} process(es) still running in the emulated hosts")
        _stop(pids)
    # Links first: deleting a veth end takes its peer with it at once, whereas the links of a deleted
    # namespace go away asynchronously (and would still be listed for a moment).
    for link in netns.list_links():
        netns.delete_link(link)
        removed.append(f"link {link}")
    for ns in spaces:
        try:
            netns.delete_netns(ns)
            removed.append(f"netns {ns}")
        except ClusterError as exc:
            errors.append(str(exc))
    for g in groups:
        deadline = time.monotonic() + 3.0  # a process just killed leaves its group a moment later
        while True:
            try:
                ctl.remove(g)
                removed.append(f"cgroup {g}")
                break
            except cgroup.CgroupError as exc:
                if time.monotonic() > deadline:
                    errors.append(str(exc))
                    break
                time.sleep(0.1)
    for p in netns.list_etc():
        netns.remove_etc(p)
        removed.append(f"file {p}")
    if st.remove():
        removed.append(f"file {st.STATE_PATH}")
    deadline = time.monotonic() + 5.0
    while (left := netns.list_netns() + netns.list_links()) and time.monotonic() < deadline:
        time.sleep(0.1)
    if errors or left:
        raise ClusterError("ringlet cluster down left things behind: " + "; ".join(errors + left))
    for r in removed:
        log(f"removed {r}")
    return removed


@dataclass(frozen=True)
class HostStatus:
    name: str
    addr: str
    upload: str | None
    download: str | None
    cpus: float | None
    processes: int
    present: bool


def set_link(state: ClusterState, rate: str, hosts: list[str] | None = None) -> ClusterState:
    """Change the link rate of ``hosts`` (all when None) while the cluster runs, and record it. Jobs keep
    running: this is how a test changes the network under a training run."""
    bits = st.parse_rate(rate)
    chosen = state.hosts if not hosts else tuple(state.host(h) for h in hosts)
    for h in chosen:
        netns.set_rate(h, bits, state.spec.cap_ingress, state.spec.burst)
    if len(chosen) == len(state.hosts):
        state = dataclasses.replace(state, spec=dataclasses.replace(state.spec, link=rate))
        st.save(state)
    return state


def set_cpus(state: ClusterState, cpus: float, hosts: list[str] | None = None, *,
             save: Callable[[ClusterState], None] = st.save) -> ClusterState:
    """Change the CPU quota of ``hosts`` (all when None) while the cluster runs (a straggler host: one
    host at 0.2 CPU while the others keep 0.5), and record it when every host changed. ``ClusterError``
    for a cluster without quotas, a quota below the kernel's minimum or an unknown host."""
    if state.cgroup_version is None or state.cgroup_dir is None:
        raise ClusterError("This cluster has no CPU quotas (it was brought up with --cpus-per-host 0).")
    if not cpus > 0:
        raise ClusterError(f"A CPU quota must be positive, not {cpus!r}.")
    ctl = cgroup.CpuController(state.cgroup_version, state.cgroup_dir)
    chosen = state.hosts if not hosts else tuple(state.host(h) for h in hosts)
    try:
        for h in chosen:
            ctl.create(h.name, cpus)
    except (cgroup.CgroupError, OSError) as exc:
        raise ClusterError(f"Cannot set the CPU quota: {exc}") from None
    if len(chosen) == len(state.hosts):
        state = dataclasses.replace(state, cpus=cpus)
        save(state)
    return state


def status(state: ClusterState) -> list[HostStatus]:
    """What the kernel says about each host now (rates and quotas read back, processes counted)."""
    ctl = cgroup.CpuController(state.cgroup_version, state.cgroup_dir) if state.cgroup_dir else None
    spaces = set(netns.list_netns())
    out = []
    for h in state.hosts:
        present = h.netns in spaces
        out.append(HostStatus(
            h.name, h.addr,
            netns.qdisc_rate(st.HOST_IFNAME, h.netns) if present else None,
            netns.qdisc_rate(h.veth) if present else None,
            ctl.quota(h.name) if ctl else None,
            len(netns.netns_pids(h.netns)) if present else 0,
            present,
        ))
    return out
