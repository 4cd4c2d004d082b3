"""``ringlet cluster``: emulate several equal hosts on this machine (network namespaces, capped links,
CPU quotas). Needs root.

::

    ringlet cluster up --hosts 4 --ranks-per-host 2 --link 1gbit --cpus-per-host 0.5
    ringlet run --cluster -- python train.py       # one rendezvous across the emulated hosts
    ringlet cluster exec h1 -- python -c 'import socket; print(socket.gethostname())'
    ringlet cluster status
    ringlet cluster link 10gbit                    # re-shape every host's link while jobs run
    ringlet cluster link 100mbit --host h3         # ... or one host's
    ringlet cluster cpus 0.2 --host h3             # one host's CPU quota (a compute straggler)
    ringlet cluster linktest h0:h1                 # a few seconds of TCP through a capped link
    ringlet cluster down                           # removes everything named rgl-*, also after a crash

    ringlet cluster up --hosts 2 -- ringlet run --cluster -- python train.py   # up, run, down

The logic lives in :mod:`ringlet.cluster`; these are thin wrappers.
"""
from __future__ import annotations

import json
import sys

import click

from ..sizes import parse_size
from ..cluster import _rsh, linktest, manager, netns
from ..cluster.foreground import up_and_run
from ..cluster import state as st
from ..cluster.state import INTRA_CHOICES, ClusterError, ClusterSpec


def _echo(msg: str) -> None:
    click.echo(f"ringlet cluster: {msg}", err=True)


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


@click.group("cluster", context_settings={"help_option_names": ["-h", "--help"]})
def cluster_cli() -> None:
    """Emulate several equal hosts on this machine (needs root): network namespaces joined by a bridge,
    links capped with tc tbf, a CPU quota per host. Then `ringlet run --cluster -- CMD`."""


@cluster_cli.command("up", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--hosts", "nhosts", type=int, required=True, help="Number of emulated hosts.")
@click.option("--ranks-per-host", type=int, default=1, show_default=True,
              help="Slots per host used by `ringlet run --cluster`.")
@click.option("--link", default="1gbit", show_default=True,
              help="Rate of each host's link, in tc units (100mbit, 1gbit, 10gbit...).")
@click.option("--cpus-per-host", type=float, default=None,
              help="CPU quota per host, in CPUs (0.5 = half a core). Default: an equal share of this machine; "
                   "0: no quota.")
@click.option("--intra", type=click.Choice(INTRA_CHOICES), default="shm", show_default=True,
              help="Path between ranks of one host, exported as RINGLET_CLUSTER_INTRA (the torch transport "
                   "always uses the host's loopback).")
@click.option("--subnet", default=st.DEFAULT_SUBNET, show_default=True, help="Private IPv4 subnet of the hosts.")
@click.option("--upload-only", is_flag=True, help="Cap only what each host sends (default: both directions).")
@click.option("--burst", default=None, help="Token bucket of each cap: bytes (e.g. 96K, at least 96K) or 'port', "
                                            "the smallest that holds the rate (200 us of traffic, at least 96K), "
                                            "as a switch port behaves. Default: 2 ms of traffic, at least 96K. A "
                                            "bucket passes that much at veth speed after an idle pause.")
@click.option("--replace", is_flag=True, help="Tear down a cluster that is already up first.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def up_cli(nhosts, ranks_per_host, link, cpus_per_host, intra, subnet, upload_only, burst, replace, command):
    """Create the emulated hosts rgl-h0..rgl-h{N-1}. With `-- COMMAND`, run COMMAND (on this machine,
    e.g. `ringlet run --cluster -- ...`) and tear the cluster down when it ends or on Ctrl-C."""
    try:
        nbytes = None if burst is None else st.PORT if burst == st.PORT else parse_size(burst)
    except ValueError:
        raise _fail(ClusterError(f"Bad --burst {burst!r}: give bytes, e.g. 98304 or 96K, or 'port'.")) from None
    spec = ClusterSpec(nhosts, ranks_per_host, link, cpus_per_host, intra, subnet, not upload_only, nbytes)
    if command:
        try:
            sys.exit(up_and_run(spec, command, replace=replace, log=_echo))
        except ClusterError as exc:
            raise _fail(exc) from None
    try:
        manager.up(spec, replace=replace, log=_echo)
    except ClusterError as exc:
        raise _fail(exc) from None
    _print_status(st.require())


@cluster_cli.command("down")
def down_cli():
    """Remove the cluster: stop its processes, delete every rgl-* namespace, link and cgroup."""
    try:
        removed = manager.down(log=_echo)
    except ClusterError as exc:
        raise _fail(exc) from None
    _echo("nothing to remove" if not removed else f"removed {len(removed)} object(s)")


@cluster_cli.command("exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("host")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def exec_cli(host, command):
    """Run COMMAND inside emulated HOST (h0, rgl-h0 or 0): its network, CPU quota and hostname.
    Without a command, start a shell there."""
    try:
        manager.check_privileges()
        st.require().host(host)
    except ClusterError as exc:
        raise _fail(exc) from None
    if command and command[0] == "--":  # after HOST, click passes a separating -- through
        command = command[1:]
    _rsh.main(["--state", str(st.STATE_PATH), "--argv", host, *command])  # replaces this process


def _print_status(state) -> None:
    spec = state.spec
    click.echo(f"{len(state.hosts)} hosts × {spec.ranks_per_host} rank(s); link {spec.link}"
               f"{' each way' if spec.cap_ingress else ' upload only'}"
               f"{f' ({netns.bucket_text(st.parse_rate(spec.link), spec.burst)})' if spec.burst is not None else ''}"
               "; CPU per host: "
               + (f"{state.cpus:g} (cgroup v{state.cgroup_version})" if state.cgroup_version else "no quota")
               + f"; intra-host: {spec.intra}; subnet {spec.subnet}")
    click.echo(f"{'host':<10}{'address':<16}{'upload':<10}{'download':<10}{'cpus':<7}processes")
    if state.foreground and not manager.alive(state.pid):
        click.echo(f"the `ringlet cluster up -- ...` process (pid {state.pid}) that owned this cluster is gone: "
                   "remove the leftovers with `ringlet cluster down`")
    for h in manager.status(state):
        if not h.present:
            click.echo(f"{h.name:<10}{h.addr:<16}MISSING (run `ringlet cluster down`)")
            continue
        cpus = f"{h.cpus:g}" if h.cpus is not None else "-"
        click.echo(f"{h.name:<10}{h.addr:<16}{h.upload or '-':<10}{h.download or '-':<10}{cpus:<7}{h.processes}")


@cluster_cli.command("link")
@click.argument("rate")
@click.option("--host", "hosts", multiple=True, help="Only this host (repeatable); default: every host.")
def link_cli(rate, hosts):
    """Change the link RATE (tc units: 1gbit, 10gbit...) of a running cluster; jobs keep running."""
    try:
        manager.check_privileges()
        state = manager.set_link(st.require(), rate, list(hosts) or None)
    except (ClusterError, ValueError) as exc:
        raise _fail(exc) from None
    _echo(f"link rate now {rate} on " + (", ".join(hosts) if hosts else f"all {len(state.hosts)} hosts"))


@cluster_cli.command("cpus")
@click.argument("cpus", type=float)
@click.option("--host", "hosts", multiple=True, help="Only this host (repeatable); default: every host.")
def cpus_cli(cpus, hosts):
    """Change the CPU quota (in CPUs, e.g. 0.2) of a running cluster's hosts; jobs keep running."""
    try:
        manager.check_privileges()
        state = manager.set_cpus(st.require(), cpus, list(hosts) or None)
    except ClusterError as exc:
        raise _fail(exc) from None
    _echo(f"CPU quota now {cpus:g} on " + (", ".join(hosts) if hosts else f"all {len(state.hosts)} hosts"))


@cluster_cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the state file.")
def status_cli(as_json):
    """Show the hosts, their addresses, link caps and CPU quotas as the kernel reports them."""
    try:
        manager.check_privileges()
        state = st.load()
    except ClusterError as exc:
        raise _fail(exc) from None
    if state is None:
        left = manager.leftovers()
        if left:
            raise click.ClickException("no cluster is up, but these leftovers exist: " + ", ".join(left)
                                       + "; remove them with `ringlet cluster down`.")
        click.echo("no cluster is up")
        return
    if as_json:
        click.echo(state.to_json())
    else:
        _print_status(state)


@cluster_cli.command("linktest")
@click.argument("flows", nargs=-1)
@click.option("--seconds", type=float, default=2.0, show_default=True, help="Duration of the test.")
@click.option("--json", "as_json", is_flag=True)
def linktest_cli(flows, seconds, as_json):
    """Measure TCP throughput through the capped links: FLOWS are SRC:DST host pairs run at the same time
    (default h0:h1). E.g. `h1:h0 h2:h0` shows what a host receives from two senders."""
    try:
        manager.check_privileges()
        state = st.require()
        results = linktest.measure(state, linktest.parse_flows(flows or ("h0:h1",)), seconds)
    except ClusterError as exc:
        raise _fail(exc) from None
    link_mb = st.parse_rate(state.spec.link) / 8 / 1e6
    if as_json:
        click.echo(json.dumps([{"src": r.src, "dst": r.dst, "bytes": r.nbytes, "seconds": r.seconds,
                                "MB_per_s": r.mbytes_per_s, "link_MB_per_s": link_mb} for r in results]))
        return
    for r in results:
        click.echo(f"{r.src} -> {r.dst}: {r.mbytes_per_s:.1f} MB/s of TCP payload over {r.seconds:.2f} s "
                   f"(link {state.spec.link} = {link_mb:.1f} MB/s raw)")
