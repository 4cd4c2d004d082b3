"""``ringlet run``: start N ranks of a command over a transport (shm, torch/Gloo or MPI).

::

    ringlet run -np 4 -- python train.py --epochs 3             # one host: shm
    ringlet run -np 4 --transport mpi -- python train.py
    ringlet run --hosts node1:4,node2:4 -- python train.py      # 8 ranks, torch, one launcher per host

The command parses arguments and prints; the engine is :mod:`ringlet.launch`, whose :func:`run`
Python code may call directly (re-exported here as ``ringlet.cli.run.run``).
"""
from __future__ import annotations

import os
import sys

import click

from ..launch import TRANSPORTS, LaunchError, run
from ..security.secret import SECRET_ENV

_TRANSPORT_HELP = ("How ranks talk: shm (shared memory, one host), torch (Gloo; NCCL for CUDA tensors), mpi "
                   "(mpiexec + mpi4py). Default: shm on a single host without GPUs, else torch (also for "
                   "--elastic). With shm or torch, ringlet.init() also sets up torch.distributed's default "
                   "(Gloo) group for scripts that use it directly.")


@click.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-np", "--np", "np", type=int, default=None, help="Number of ranks (default: all --hosts slots).")
@click.option("-H", "--hosts", default=None, help="Host list NAME:SLOTS,... (default: this machine only).")
@click.option("--transport", type=click.Choice(TRANSPORTS), default=None, help=_TRANSPORT_HELP)
@click.option("--rsh", default=None,
              help="Remote shell used for hosts other than this one (default: ssh; srun inside a Slurm allocation).")
@click.option("--port", type=int, default=None, help="Rendezvous port of a multi-host job (torch/shm).")
@click.option("--master-addr", default=None,
              help="Address the other hosts reach the first host at (default: the first host's name); "
                   "the job's store listens there only (on 127.0.0.1 for a single-host job).")
@click.option("--cluster", is_flag=True,
              help="Run on the emulated hosts of `ringlet cluster up` (one node launcher per host).")
@click.option("--elastic", is_flag=True,
              help="Keep going when workers die (hvd.elastic scripts): see --min-np, --max-np, --restarts.")
@click.option("--min-np", type=int, default=None, help="--elastic: fewest ranks the job continues with (default -np).")
@click.option("--max-np", type=int, default=None, help="--elastic: most ranks at a time (default -np).")
@click.option("--restarts", type=int, default=0, show_default=True,
              help="--elastic: replacement workers started for workers that die.")
@click.option("--elastic-timeout", type=float, default=600.0, show_default=True,
              help="--elastic: seconds a new membership may take to assemble before absent workers are stopped.")
@click.option("--metrics-port", type=int, default=None,
              help="Serve Prometheus metrics (docs/metrics.md): the launcher on each host serves its ranks' "
                   "metrics on this port, each sample labelled with its rank.")
@click.option("--metrics-per-rank", is_flag=True,
              help="With --metrics-port P: every rank serves its own metrics on P + its local rank instead.")
@click.option("--node-rank", type=int, default=None, hidden=True)
@click.option("--rdzv-endpoint", default=None, hidden=True)
@click.option("--run-id", default=None, hidden=True)
@click.option("--secret-from-stdin", is_flag=True, hidden=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run_cli(np, hosts, transport, rsh, port, master_addr, cluster, elastic, min_np, max_np, restarts, elastic_timeout,
            metrics_port, metrics_per_rank, node_rank, rdzv_endpoint, run_id, secret_from_stdin, command):
    """Run COMMAND as NP ranks: ringlet run -np 4 [--transport shm|torch|mpi] -- python train.py ARGS...

    Every rank gets RINGLET_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE and the HOROVOD_*
    names; when a rank fails, the job stops and ringlet run exits with that rank's status."""
    if secret_from_stdin:  # a node launcher of a multi-host job (see ringlet.launch.agent)
        os.environ[SECRET_ENV] = sys.stdin.readline().strip()
    start = run
    if cluster:  # the emulated hosts of `ringlet cluster up`: the cluster tool fills in the host options
        from ..cluster import run_job as start
    try:
        status = start(command, np, transport=transport, hosts=hosts, rsh=(rsh or "ssh") if cluster else rsh,
                       port=port, master_addr=master_addr,
                       node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, run_id=run_id,
                       elastic=elastic, min_np=min_np, max_np=max_np, restarts=restarts,
                       elastic_timeout=elastic_timeout, metrics_port=metrics_port,
                       metrics_per_rank=metrics_per_rank)
    except LaunchError as exc:
        err = click.ClickException(str(exc))
        err.exit_code = exc.exit_code
        raise err from None
    sys.exit(status)


__all__ = ["run", "run_cli"]
