"""``ringlet bench``: nccl-tests style measurements, with a correctness check of every result.

Outside a job it launches itself (``-np``, ``--transport``, ``--hosts``, ``--cluster`` as for
``ringlet run``); inside one (``ringlet run ... -- ringlet bench ...``) every rank runs the sweep and
rank 0 prints the table and writes the files. Exit status 1 when any element was wrong.

    ringlet bench -np 4 --collectives allreduce --algorithms all --compare native --plot busbw.png
"""
from __future__ import annotations

import os
import socket
import sys
import time

import click

_LAUNCH_OPTS = {"-np", "--np", "--transport", "--hosts", "-H", "--cluster"}


def _inside_job() -> bool:
    return "RINGLET_RANK" in os.environ or "RANK" in os.environ or "PMI_RANK" in os.environ \
        or "OMPI_COMM_WORLD_RANK" in os.environ


def _strip_launch_args(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        key = a.split("=", 1)[0]
        if key in _LAUNCH_OPTS:
            skip = "=" not in a and key != "--cluster"
            continue
        out.append(a)
    return out


def _sizes(lo: int, hi: int, factor: float) -> tuple[int, ...]:
    out, s = [], lo
    while s <= hi:
        out.append(int(s))
        s = s * factor if factor > 1 else s + 1
    return tuple(out)


def _parse_rate(text: str | None) -> float | None:
    """'1gbit' / '10gbit' / '500mbit' -> GB/s (decimal, as busbw)."""
    if not text:
        return None
    t = text.strip().lower()
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if t.endswith(suffix):
            return float(t[: -len(suffix)]) * mult / 8 / 1e9
    return float(t)


def _torch_env_beside_mpi() -> None:
    """Under mpiexec, publish torchrun's env:// variables (rank 0 picks the port, MPI tells the others), so
    that torch.distributed (the ``native`` competitor) and ringlet's torch or shm transports can start in
    the same job as ``MPI_Allreduce``."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    addr = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        host = os.environ.get("RINGLET_MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        addr = (host, port)
    host, port = comm.bcast(addr, root=0)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    os.environ.update({"MASTER_ADDR": host, "MASTER_PORT": str(port), "RANK": str(comm.Get_rank()),
                       "WORLD_SIZE": str(comm.Get_size()), "LOCAL_RANK": str(local.Get_rank()),
                       "LOCAL_WORLD_SIZE": str(local.Get_size()), "RINGLET_SHM_PORT": str(port + 1)})
    local.Free()


def _start(ringlet_transport: str, compare: list[str]):
    """``ringlet.init`` on the requested transport, with torch.distributed up too when ``native`` is compared."""
    import torch.distributed as dist

    import ringlet
    from ringlet.transport import detect

    launched = detect()
    if launched == "mpi" and (ringlet_transport not in ("", "mpi") or "native" in compare):
        _torch_env_beside_mpi()
        if "native" in compare or ringlet_transport == "torch":
            dist.init_process_group("gloo", init_method="env://")
    rt = ringlet.init(transport=ringlet_transport or None)
    if "native" in compare and not dist.is_initialized() and "WORLD_SIZE" in os.environ:
        # shm launched by the elastic agent: Gloo joins from the same env:// variables, so that
        # `--transport shm --compare native` measures both instead of silently skipping native.
        dist.init_process_group("gloo", init_method="env://")
    return rt


def sweep_in_job(collectives: str, algorithms: str, compare: str, min_bytes: str, max_bytes: str, factor: float,
                 dtype: str, op: str, iters: int, warmup: int, json_path: str, csv_path: str, plot_path: str,
                 link_rate: str | None, progress: bool, title: str, ringlet_transport: str = "") -> int:
    """Run the sweep on this rank of a job; rank 0 reports. Returns the exit status (1 if anything was wrong)."""
    import torch

    import ringlet
    from ringlet.bench import SweepSpec, report, run_sweep
    from ringlet.benchmarking import parse_size

    comp = [c.strip() for c in compare.split(",") if c.strip()]
    rt = _start(ringlet_transport, comp)
    algos = ringlet.algorithms.allreduce_names() if algorithms == "all" else [a.strip() for a in algorithms.split(",")]
    algos = [a for a in algos if a != "native"]
    spec = SweepSpec(
        sizes=_sizes(parse_size(min_bytes), parse_size(max_bytes), factor),
        collectives=tuple(c.strip() for c in collectives.split(",")),
        implementations=tuple(f"ringlet:{a}" for a in algos) + tuple(comp),
        dtype=getattr(torch, dtype),
        op=ringlet.ReduceOp.parse(op),
        warmup=warmup,
        iters=iters,
    )
    me = ringlet.rank()
    bar = None
    if progress and me == 0:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        from ringlet.bench.sweep import implementations_for

        total = sum(len(implementations_for(c, spec.implementations)) for c in spec.collectives) * len(spec.sizes)
        task = bar.add_task("sweep", total=total)

    def tick(done: int, total: int, label: str) -> None:
        if bar is not None:
            bar.update(task, completed=done, description=label)

    try:
        rows = run_sweep(spec, progress=tick)
    finally:
        if bar is not None:
            bar.stop()
    wrong = report.total_wrong(rows)
    if me == 0:
        header = (f"# ringlet bench: {ringlet.size()} ranks on {len(set(rt.hostnames))} host(s), transport "
                  f"{rt.transport.name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
                  f"# command: ringlet bench {' '.join(sys.argv[2:])}")
        print(report.table(rows, header), flush=True)
        meta = {"ranks": ringlet.size(), "hosts": len(set(rt.hostnames)), "transport": rt.transport.name,
                "argv": sys.argv, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        if json_path:
            report.write_json(json_path, rows, meta)
        if csv_path:
            report.write_csv(csv_path, rows)
        if plot_path:
            report.plot(plot_path, rows, title or f"{ringlet.size()} ranks, {rt.transport.name}", _parse_rate(link_rate))
        print(f"# total #wrong: {wrong}")
    ringlet.shutdown()
    import torch.distributed as dist

    if dist.is_initialized():  # the Gloo group made for `native` beside another transport
        dist.destroy_process_group()
    return 1 if wrong else 0


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
@click.option("--dtype", default="float32", show_default=True)
@click.option("--op", default="sum", show_default=True)
@click.option("-n", "--iters", default=0, help="Timed iterations (0: fewer for big sizes).")
@click.option("-w", "--warmup", default=2, show_default=True)
@click.option("--json", "json_path", default="", help="Write rows as JSON.")
@click.option("--csv", "csv_path", default="", help="Write rows as CSV.")
@click.option("--plot", "plot_path", default="", help="Draw busbw against size to this PNG.")
@click.option("--link-rate", default=None, help="Draw the link rate (e.g. 1gbit) on the plot.")
@click.option("--title", default="", help="Plot title.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def bench_cli(np_, transport, hosts, cluster, ringlet_transport, collectives, algorithms, compare, min_bytes, max_bytes,
              factor, dtype, op, iters, warmup, json_path, csv_path, plot_path, link_rate, title, progress):
    """Measure collectives nccl-tests style: time, algbw, busbw and #wrong per size and implementation."""
    from ..bench.impls import COLLECTIVES

    unknown = [c.strip() for c in collectives.split(",") if c.strip() not in COLLECTIVES]
    if unknown:  # before launching: one clear message instead of a traceback from every rank
        raise click.BadParameter(f"unknown collective(s) {', '.join(unknown)}; choose from {', '.join(COLLECTIVES)}.",
                                 param_hint="--collectives")
    if not _inside_job():
        from .run import run

        cmd = [sys.executable, "-m", "ringlet.cli.main", "bench"] + _strip_launch_args(sys.argv[2:])
        # Without -np: every slot of --hosts / the cluster, else 2 ranks on this host.
        np_ = np_ if np_ is not None or hosts or cluster else 2
        sys.exit(run(cmd, np_, transport=transport, hosts=hosts, cluster=cluster))
    sys.exit(sweep_in_job(collectives, algorithms, compare, min_bytes, max_bytes, factor, dtype, op, iters, warmup,
                          json_path, csv_path, plot_path, link_rate, progress, title, ringlet_transport))
