"""``ringlet bench``: nccl-tests style measurements, with a correctness check of every result.

Outside a job it launches itself (``-np``, ``--transport``, ``--hosts``, ``--cluster`` as for
``ringlet run``); inside one (``ringlet run ... -- ringlet bench ...``) every rank runs the sweep and
rank 0 prints the table and writes the files. Exit status 1 when any element was wrong. The engine is
:mod:`ringlet.bench.job`.

    ringlet bench -np 4 --collectives allreduce --algorithms all --compare native --plot busbw.png
    ringlet bench -np 4 --compression none,fp16,int8+ef,topk:0.01+ef,powersgd:2 --sizes 1M,16M

``--compression`` measures compressed all-reduces (time, algbw, bytes sent per rank as the transport
counts them, ratio to ``none``, error vs the exact sum; :func:`ringlet.bench.sweep.run_compression_sweep`);
without an explicit ``--collectives`` it then replaces the plain sweep.

``--predict auto|PROFILE`` adds the cost model's predicted time and its relative error beside every
all-reduce algorithm's row (:mod:`ringlet.bench.predict`); ``benchmarks/cost_model/prediction_error.py``
sums them up.
"""
from __future__ import annotations

import sys

import click

from ..bench.impls import COLLECTIVES, compressions
from ..bench.job import SweepOptions, inside_job, relaunch, sweep_in_job
from ..launch import LaunchError


@click.command("bench", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-np", "--np", "np_", type=int, default=None,
              help="Ranks to launch (outside a job; default: all slots of --hosts/--cluster, else 2).")
@click.option("--transport", default="torch", show_default=True, help="torch, shm or mpi (outside a job).")
@click.option("-H", "--hosts", default=None, help="Host list NAME:SLOTS,... (outside a job).")
@click.option("--cluster", is_flag=True, help="Run on the emulated hosts of `ringlet cluster up`.")
@click.option("--ringlet-transport", default="", help="Transport of ringlet's own algorithms when it differs from "
              "the launch, e.g. --transport mpi --ringlet-transport shm: ringlet on shared memory beside MPI_Allreduce.")
@click.option("--collectives", default="allreduce", show_default=True,
              help="Comma list: allreduce, allgather, reduce_scatter, broadcast, alltoall.")
@click.option("--algorithms", default="all", show_default=True, help="All-reduce algorithms: 'all' or a comma list.")
@click.option("--compare", default="", help="Also time these in the same run: native (torch.distributed), mpi.")
@click.option("-b", "--min", "min_bytes", default="4", show_default=True, help="Smallest size (bytes; K/M/G).")
@click.option("-e", "--max", "max_bytes", default="64M", show_default=True, help="Largest size.")
@click.option("-f", "--factor", default=2.0, show_default=True, help="Size multiplier between rows.")
@click.option("--sizes", default="", help="Comma list of sizes (bytes; K/M/G), instead of --min/--max/--factor.")
@click.option("--compression", default="", help="Compressed all-reduces to measure: 'all' or a comma list "
              "(none,fp16,bf16,int8,int8+ef,topk:0.01+ef,powersgd:2,...); 'none' is always the reference row. "
              "Without --collectives, only these are measured.")
@click.option("--dtype", default="float32", show_default=True)
@click.option("--op", default="sum", show_default=True)
@click.option("-n", "--iters", default=0, help="Timed iterations (0: fewer for big sizes).")
@click.option("-w", "--warmup", default=2, show_default=True)
@click.option("--json", "json_path", default="", help="Write rows as JSON.")
@click.option("--csv", "csv_path", default="", help="Write rows as CSV.")
@click.option("--plot", "plot_path", default="", help="Draw busbw against size to this PNG.")
@click.option("--link-rate", default=None, help="Draw the link rate (e.g. 1gbit) on the plot.")
@click.option("--title", default="", help="Plot title.")
@click.option("--predict", "predict", default="", metavar="PROFILE|auto",
              help="Add the cost model's predicted time and its relative error to every all-reduce row: 'auto' "
              "uses the calibration profile matching the job (ringlet tune), else a profile's path.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def bench_cli(np_, transport, hosts, cluster, ringlet_transport, collectives, algorithms, compare, min_bytes, max_bytes,
              factor, sizes, compression, dtype, op, iters, warmup, json_path, csv_path, plot_path, link_rate, title, predict,
              progress):
    """Measure collectives nccl-tests style: time, algbw, busbw and #wrong per size and implementation."""
    if compression:
        try:
            compressions(compression)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--compression") from None
        if click.get_current_context().get_parameter_source("collectives") == click.core.ParameterSource.DEFAULT:
            collectives = ""  # --compression alone: no plain sweep
    unknown = [c.strip() for c in collectives.split(",") if c.strip() and c.strip() not in COLLECTIVES]
    if unknown:  # before launching: one clear message instead of a traceback from every rank
        raise click.BadParameter(f"unknown collective(s) {', '.join(unknown)}; choose from {', '.join(COLLECTIVES)}.",
                                 param_hint="--collectives")
    if predict and predict != "auto":
        from ..tuning.profile import Profile

        try:
            Profile.load(predict)
        except (OSError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--predict") from None
    if not inside_job():
        try:
            sys.exit(relaunch("bench", np_, transport, hosts, cluster))
        except LaunchError as exc:
            raise click.ClickException(str(exc)) from None
    opts = SweepOptions(collectives, algorithms, compare, min_bytes, max_bytes, factor, dtype, op, iters, warmup,
                        json_path, csv_path, plot_path, link_rate, progress, title, ringlet_transport,
                        compression, sizes, predict)
    sys.exit(sweep_in_job(opts))
