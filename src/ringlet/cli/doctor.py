"""``ringlet doctor``: a health check of the job's hosts, run as a job over the job's transport.

::

    ringlet doctor -np 3                          # one host: every rank is measured
    ringlet doctor --hosts node1:4,node2:4        # one rank per host
    ringlet doctor --cluster --json doctor.json   # the emulated hosts of `ringlet cluster up`

It is ``ringlet run <the same placement options> -- python -m ringlet.doctor.job ARGS``: the ranks are
placed by ringlet's launcher exactly as for ``ringlet run``; rank 0 prints a table (per host: compute
GFLOP/s on one thread and on all, free memory, cgroup limit, interface, MTU, clock offset from rank 0's
host; per host pair: latency and bandwidth each way) and ``verdict:`` lines naming the outliers
(:func:`ringlet.doctor.verdict.verdict`). The measurement is :mod:`ringlet.doctor.job`.
"""
from __future__ import annotations

import sys

import click

from ..launch import TRANSPORTS, LaunchError, run


@click.command("doctor", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-np", "--np", "np_", type=int, default=None, help="Ranks (default: every slot of --hosts/--cluster, "
              "else 2 on this host).")
@click.option("-H", "--hosts", default=None, help="Host list NAME:SLOTS,... (default: this machine only).")
@click.option("--cluster", is_flag=True, help="Run on the emulated hosts of `ringlet cluster up`.")
@click.option("--transport", type=click.Choice(TRANSPORTS), default=None,
              help="The job's transport (default: as `ringlet run`).")
@click.option("--rsh", default=None,
              help="Remote shell for hosts other than this one (default: ssh; srun inside a Slurm allocation).")
@click.option("--every-rank", is_flag=True, help="Measure every rank, not one per host (always so on one host).")
@click.option("--quick", is_flag=True, help="Small transfers and short compute runs (a smoke test, not a measure).")
@click.option("--clock-threshold-ms", type=float, default=10.0, show_default=True,
              help="A clock offset beyond this (and its uncertainty) is an outlier.")
@click.option("--json", "json_path", default="", help="Write the table and the verdict as JSON (rank 0).")
def doctor_cli(np_, hosts, cluster, transport, rsh, every_rank, quick, clock_threshold_ms, json_path):
    """Measure every host pair's latency and bandwidth, each host's compute, clock offset, free memory and
    MTU; print a table and a verdict naming the outliers."""
    if np_ is not None and np_ < 1:
        raise click.BadParameter("must be at least 1", param_hint="-np")
    if clock_threshold_ms <= 0:
        raise click.BadParameter("must be positive", param_hint="--clock-threshold-ms")
    cmd = [sys.executable, "-m", "ringlet.doctor.job", "--clock-threshold-ms", str(clock_threshold_ms)]
    cmd += (["--every-rank"] if every_rank else []) + (["--quick"] if quick else [])
    cmd += ["--json", json_path] if json_path else []
    np_ = np_ if np_ is not None or hosts or cluster else 2
    try:
        if cluster:
            from ..cluster import run_job

            status = run_job(cmd, np_, transport=transport, hosts=hosts, rsh=rsh or "ssh")
        else:
            status = run(cmd, np_, transport=transport, hosts=hosts, rsh=rsh)
    except LaunchError as exc:
        err = click.ClickException(str(exc))
        err.exit_code = exc.exit_code
        raise err from None
    sys.exit(status)
