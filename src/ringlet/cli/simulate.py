"""``ringlet simulate``: replay collectives on a modelled network of any size (:mod:`ringlet.sim`).

    ringlet simulate --ranks 1024 --hosts-of 8 --link 100gbit --latency 2us --algorithms all --sizes 1K:1G
    ringlet simulate --from-profile profile.json --sizes 4:256M --plot busbw.png

Prints time, algbw, busbw (nccl-tests conventions), steps, segment and source (``replay`` or ``model``)
per size and algorithm. Rows that would not replay within ``--budget`` seconds come from the cost model.
"""
from __future__ import annotations

import click

from ..sim import SweepOptions, collective, policy, run_sweep, size_range
from ..sim.report import describe, plot, table, write_json
from ..tuning.network import Network, Topology
from ..tuning.profile import Profile

ITEMSIZE = 4  # float32, as nccl-tests' default; sizes are rounded down to whole elements
_NETWORK_FLAGS = ("link", "latency", "intra_link", "intra_latency", "gamma")


def _network(kw: dict) -> Network:
    gamma = 0.0 if kw["gamma"] is None else 1.0 / (kw["gamma"] * 1e9)
    if kw["link"] is None or kw["latency"] is None:
        raise click.UsageError("give --link and --latency (or --from-profile)")
    return Network.of(link=kw["link"], latency=kw["latency"], intra_link=kw["intra_link"],
                      intra_latency=kw["intra_latency"], gamma=gamma)


def _setup(kw: dict) -> tuple[Topology, Network]:
    """Topology and network from the flags, or from a calibration profile."""
    if kw["from_profile"]:
        given = [f"--{f.replace('_', '-')}" for f in _NETWORK_FLAGS if kw[f] is not None]
        if given:
            raise click.UsageError(f"--from-profile supplies the network; drop {', '.join(given)}")
        prof = Profile.load(kw["from_profile"])
        if kw["ranks"] is None and kw["hosts_of"] is None:
            return Topology(prof.fingerprint.host_of()), prof.network
        ranks = kw["ranks"] or prof.fingerprint.ranks
        return Topology.uniform(ranks, kw["hosts_of"] or max(prof.fingerprint.layout)), prof.network
    if kw["ranks"] is None:
        raise click.UsageError("give --ranks (or --from-profile)")
    return Topology.uniform(kw["ranks"], kw["hosts_of"] or 1), _network(kw)


@click.command("simulate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--ranks", type=click.IntRange(min=1), default=None, help="Number of ranks.")
@click.option("--hosts-of", type=click.IntRange(min=1), default=None,
              help="Ranks per host (consecutive ranks share a host; default 1).")
@click.option("--link", default=None, help="Inter-host link rate, e.g. 100gbit, 400mbit.")
@click.option("--latency", default=None, help="Inter-host per-message latency α, e.g. 2us.")
@click.option("--intra-link", default=None, help="Intra-host rate (default 4x --link).")
@click.option("--intra-latency", default=None, help="Intra-host latency (default --latency / 4).")
@click.option("--gamma", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Reduction speed in GB/s (default: reductions are free).")
@click.option("--collective", default="allreduce", show_default=True,
              help="allreduce, allgather, reduce_scatter, broadcast, reduce or alltoall.")
@click.option("--algorithms", default="all", show_default=True, help="'all' or a comma list.")
@click.option("--sizes", default="1K:1G", show_default=True, help="Range A:B, sizes, or a comma list (K/M/G = 1024^n).")
@click.option("--factor", default=2.0, show_default=True, help="Multiplier between sizes of a range.")
@click.option("--segment", default="none", show_default=True, help="Pipelining segment: bytes, 'auto' or 'none'.")
@click.option("--budget", default=60.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds for the whole sweep; rows beyond come from the cost model.")
@click.option("--from-profile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Calibration profile (JSON) to take the network and layout from.")
@click.option("--plot", "plot_path", default=None, help="Draw busbw against size to this PNG.")
@click.option("--json", "json_path", default=None, help="Write the rows as JSON.")
def simulate_cli(**kw) -> None:
    """Simulate collectives in virtual time: time, algbw, busbw and steps per size and algorithm."""
    try:
        topology, network = _setup(kw)
        coll = collective(kw["collective"])
        sizes = tuple(dict.fromkeys(n - n % ITEMSIZE for n in size_range(kw["sizes"], kw["factor"])))
        opts = SweepOptions(topology, network, coll.names(kw["algorithms"]), sizes, coll.name,
                            policy(kw["segment"]), kw["budget"], ITEMSIZE)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    result = run_sweep(opts)
    click.echo(f"# {coll.name}: {describe(topology, network)}")
    click.echo(table(result.rows))
    for line in result.notices:
        click.echo(line, err=True)
    click.echo(f"# {len(result.rows)} rows in {result.seconds:.1f} s")
    if kw["json_path"]:
        write_json(kw["json_path"], result.rows, topology, network, result.notices, result.seconds)
    if kw["plot_path"]:
        plot(kw["plot_path"], result.rows, f"{coll.name}, {describe(topology, network).split(';')[0]}")
