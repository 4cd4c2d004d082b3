"""The engine of ``ringlet bench``: one rank's part of a sweep inside a job, and how the command
relaunches itself as a job.

Outside a job ``ringlet bench`` launches itself (``-np``, ``--transport``, ``--hosts``, ``--cluster`` as
for ``ringlet run``); inside one every rank runs :func:`sweep_in_job` and rank 0 prints the table and
writes the files. The status is 1 when any element was wrong. ``compression`` (``--compression``) adds
the compressed all-reduces of :func:`~ringlet.bench.sweep.run_compression_sweep`; their results are
approximate by design and do not count as wrong.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass

import torch

import ringlet
from ringlet.sizes import parse_size

from . import report
from . import impls
from .sweep import SweepSpec, implementations_for, run_compression_sweep, run_sweep

_LAUNCH_OPTS = {"-np", "--np", "--transport", "--hosts", "-H", "--cluster"}


def inside_job() -> bool:
    """True in a rank of a job (ringlet run, torchrun, mpiexec)."""
    return "RINGLET_RANK" in os.environ or "RANK" in os.environ or "PMI_RANK" in os.environ \
        or "OMPI_COMM_WORLD_RANK" in os.environ


def strip_launch_args(argv: list[str]) -> list[str]:
    """``argv`` without the launch options, for the ranks' own ``ringlet bench`` command line."""
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


@dataclass(frozen=True)
class SweepOptions:
    """One ``ringlet bench`` sweep as its command line gives it (sizes as text, lists comma-separated)."""

    collectives: str = "allreduce"
    algorithms: str = "all"
    compare: str = ""
    min_bytes: str = "4"
    max_bytes: str = "64M"
    factor: float = 2.0
    dtype: str = "float32"
    op: str = "sum"
    iters: int = 0
    warmup: int = 2
    json_path: str = ""
    csv_path: str = ""
    plot_path: str = ""
    link_rate: str | None = None
    progress: bool = True
    title: str = ""
    ringlet_transport: str = ""
    compression: str = ""  # comma list of compressors or "all"; "": no compressed rows
    sizes: str = ""  # comma list of sizes; replaces min_bytes..max_bytes when given
    predict: str = ""  # "": no predictions; "auto": the profile ringlet.init found; else a profile's path

    def comparisons(self) -> list[str]:
        return [c.strip() for c in self.compare.split(",") if c.strip()]


def build_spec(o: SweepOptions) -> SweepSpec:
    """The sweep of ``o``: ringlet's algorithms (``all``: every registered one but ``native``) and the
    compared implementations, over the sizes from ``min_bytes`` to ``max_bytes``."""
    if o.algorithms == "all":
        algos = [a for a in ringlet.algorithms.allreduce_names() if a != "native"]
    else:
        algos = [a.strip() for a in o.algorithms.split(",") if a.strip() != "native"]
    sizes = tuple(parse_size(s.strip()) for s in o.sizes.split(",") if s.strip()) if o.sizes.strip() \
        else _sizes(parse_size(o.min_bytes), parse_size(o.max_bytes), o.factor)
    return SweepSpec(
        sizes=sizes,
        collectives=tuple(c.strip() for c in o.collectives.split(",") if c.strip()),
        implementations=tuple(f"ringlet:{a}" for a in algos) + tuple(o.comparisons()),
        dtype=getattr(torch, o.dtype),
        op=ringlet.ReduceOp.parse(o.op),
        warmup=o.warmup,
        iters=o.iters,
        compressions=impls.compressions(o.compression) if o.compression.strip() else (),
    )


def _run_with_progress(spec: SweepSpec, show: bool) -> tuple[list, list]:
    """:func:`run_sweep`, then :func:`run_compression_sweep`, with a progress bar on this rank when ``show``."""
    if not show:
        return run_sweep(spec), run_compression_sweep(spec)
    from rich.progress import Progress

    bar = Progress(transient=True)
    bar.start()
    first = sum(len(implementations_for(c, spec.implementations)) for c in spec.collectives) * len(spec.sizes)
    task = bar.add_task("sweep", total=first + (len(spec.sizes) if spec.compressions else 0))
    try:
        rows = run_sweep(spec, progress=lambda done, _n, label: bar.update(task, completed=done, description=label))
        wire = run_compression_sweep(spec, progress=lambda done, _n, label: bar.update(
            task, completed=first + done, description=label))
        return rows, wire
    finally:
        bar.stop()


def _prediction_model(o: SweepOptions, rt):
    """``(network, topology, source)`` for ``--predict``, or ``None`` (with the reason printed) when there
    is no profile to predict with. ``auto``: the profile ``ringlet.init`` attached; a path: that profile,
    on this job's topology (a warning when it was made for another fingerprint)."""
    from ringlet.tuning.network import Topology
    from ringlet.tuning.profile import Fingerprint, Profile

    if o.predict == "auto":
        if rt.network_model is None:
            print("# --predict auto: no calibration profile matches this job (run `ringlet tune` with the same "
                  "-np, hosts and transport, or give a profile's path)", flush=True)
            return None
        network, topology = rt.network_model
        return network, topology, "the cached profile of this job"
    prof = Profile.load(o.predict)
    fp = Fingerprint.of(rt.world.host_of, rt.transport.name)
    if prof.fingerprint != fp:
        print(f"# --predict: {o.predict} was made for {prof.fingerprint.describe()}; this job is {fp.describe()}",
              flush=True)
    return prof.network, Topology(tuple(rt.world.host_of)), o.predict


def _predict(o: SweepOptions, rows: list, rt) -> None:
    """Rank 0: the cost model's prediction beside every ``ringlet:<algorithm>`` all-reduce row."""
    from . import predict

    model = _prediction_model(o, rt)
    fn = predict.default_predictor()
    if fn is None:
        print("# --predict: the cost model (ringlet.tuning.cost) is not available", flush=True)
    if model is None or fn is None:
        return
    network, topology, source = model
    itemsize = torch.empty(0, dtype=getattr(torch, o.dtype)).element_size()
    segment = predict.executor_segment(rt.options.segment_bytes, tuple(rt.world.host_of), itemsize,
                                       rt.transport.capabilities.max_segment_bytes, rt.selector.model)
    if predict.add_predictions(rows, predict.PredictionSetup(network, topology, itemsize, fn, segment,
                                                                  rt.options.check)):
        print(f"# predictions from {source}\n{predict.table(rows)}", flush=True)


def _write_reports(o: SweepOptions, rows: list, wire: list, rt, wrong: int) -> None:
    """Rank 0: the tables on stdout, then the JSON/CSV/plot files asked for (CSV and plot: the collective
    rows; JSON: both)."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    hosts = len(set(rt.hostnames))
    header = (f"# ringlet bench: {ringlet.size()} ranks on {hosts} host(s), transport {rt.transport.name}, {when}\n"
              f"# command: ringlet bench {' '.join(sys.argv[2:])}")
    print(header, flush=True)
    if rows:
        print(report.table(rows), flush=True)
    if o.predict and rows:
        _predict(o, rows, rt)
    if wire:
        print(report.compression_table(wire, build_spec(o).compression_algorithm), flush=True)
    meta = {"ranks": ringlet.size(), "hosts": hosts, "transport": rt.transport.name, "argv": sys.argv, "date": when}
    if o.json_path:
        report.write_json(o.json_path, rows, meta, wire)
    if o.csv_path:
        report.write_csv(o.csv_path, rows)
    if o.plot_path:
        report.plot(o.plot_path, rows, o.title or f"{ringlet.size()} ranks, {rt.transport.name}",
                    _parse_rate(o.link_rate))
    print(f"# total #wrong: {wrong}")


def sweep_in_job(o: SweepOptions) -> int:
    """Run the sweep on this rank of a job; rank 0 reports. Returns the exit status (1 if anything was wrong)."""
    import torch.distributed as dist

    rt = _start(o.ringlet_transport, o.comparisons())
    spec = build_spec(o)
    rows, wire = _run_with_progress(spec, o.progress and ringlet.rank() == 0)
    wrong = report.total_wrong(rows)
    if ringlet.rank() == 0:
        _write_reports(o, rows, wire, rt, wrong)
    ringlet.shutdown()
    if dist.is_initialized():  # the Gloo group made for `native` beside another transport
        dist.destroy_process_group()
    return 1 if wrong else 0


def relaunch(command: str, np_: int | None, transport: str | None, hosts: str | None, cluster: bool) -> int:
    """Outside a job, run ``ringlet COMMAND`` (this process's arguments without the launch options) as a
    job: ``np_`` ranks (default: every slot of ``hosts`` or the cluster, else 2 on this host). Returns
    the job's exit status; ``LaunchError`` when it cannot start."""
    from ..launch import run

    cmd = [sys.executable, "-m", "ringlet.cli.main", command] + strip_launch_args(sys.argv[2:])
    np_ = np_ if np_ is not None or hosts or cluster else 2
    if cluster:
        from ..cluster import run_job

        return run_job(cmd, np_, transport=transport, hosts=hosts)
    return run(cmd, np_, transport=transport, hosts=hosts)
