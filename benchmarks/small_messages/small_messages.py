"""Small all-reduces (4 B - 64 KiB) beside MPICH's MPI_Allreduce in the same job.

    ringlet run -np 4 --transport mpi -- python benchmarks/small_messages/small_messages.py --ringlet-transport shm --gloo
    ringlet run --cluster --transport mpi -- python benchmarks/small_messages/small_messages.py --ringlet-transport mpi --gloo

Launched by mpiexec. Per size, the timing blocks of every implementation are interleaved
(A B C A B C ...), each number is the slowest rank's median block, and the whole sweep is repeated
``--repeats`` times; ratios to ``mpi`` are taken within one repeat and reported as median (min-max).

* ``mpi``: ``MPI_Allreduce`` in place (MPICH's own algorithm choice);
* ``auto``: ``ringlet.allreduce_`` as a user calls it (metadata check on): the small-message carrier of
  :mod:`ringlet.engine.small`, the shm mailbox's one round or, on the mpi transport, recursive
  doubling with the records in band;
* ``rd``: ringlet's recursive doubling schedule through the public API (check on);
* ``small``: the same call as ``auto`` in another place of the block order (a control: the two
  differ only by where they run in the interleaving);
* ``small raw``: the same rounds alone, record prepared once (the engine's own cost: what the
  collective layer's per-call overhead adds to ``small`` is the difference);
* ``1-round p2p raw`` (p2p transports): every rank sends its vector to every peer, one round;
* ``gloo-p2p rd``: ringlet's recursive doubling over Gloo point-to-point (``--gloo``), check on.

A correctness check of every implementation (integer data, #wrong elements) follows the timed runs.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch


def _impls(args, rt, gloo_rt, comm, t):
    import ringlet
    from mpi4py import MPI

    import small_runners

    arr = t.numpy()
    out = {"mpi": lambda: comm.Allreduce(MPI.IN_PLACE, arr, MPI.SUM),
           "auto": lambda: ringlet.allreduce_(t),
           "rd": lambda: ringlet.allreduce_(t, algorithm="recursive_doubling"),
           "small": small_runners.runner("small", rt, t),
           "small raw": small_runners.runner("small-raw", rt, t)}
    if gloo_rt is not None:
        def gloo():
            with ringlet.use_runtime(gloo_rt):
                ringlet.allreduce_(t, algorithm="recursive_doubling")
        out["gloo-p2p rd"] = gloo
    return out


def _wrong(run, t, n, p, me, comm) -> int:
    from mpi4py import MPI

    t.copy_(torch.arange(n, dtype=torch.float32) % 7 + me)
    run()
    exp = (torch.arange(n, dtype=torch.float32) % 7) * p + p * (p - 1) // 2
    return comm.allreduce(int((t != exp).sum()), op=MPI.SUM)


def sweep(args, rt, gloo_rt, comm) -> list[dict]:
    from mpi4py import MPI

    from ringlet.benchmarking import parse_size, time_interleaved

    p, me = comm.Get_size(), comm.Get_rank()
    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        n = max(1, size // 4)
        t = torch.ones(n)
        runs = _impls(args, rt, gloo_rt, comm, t)
        row = {"bytes": n * 4, "us": {k: [] for k in runs}, "wrong": {}}
        for _ in range(args.repeats):
            secs = time_interleaved(runs, comm.Barrier, iters=args.iters, warmup=3, blocks=args.blocks)
            for k, v in secs.items():
                row["us"][k].append(comm.allreduce(v, op=MPI.MAX) * 1e6)
        for k, run in runs.items():
            row["wrong"][k] = _wrong(run, t, n, p, me, comm)
        rows.append(row)
        if me == 0:
            print(_line(row), flush=True)
    return rows


def _ratio(row, k) -> str:
    rs = [a / b for a, b in zip(row["us"][k], row["us"]["mpi"])]
    return f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"


def _line(row) -> str:
    from ringlet.benchmarking import fmt_size

    keys = list(row["us"])
    cells = [f"{statistics.median(row['us'][k]):.0f}" for k in keys]
    ratios = [_ratio(row, k) for k in keys if k != "mpi"]
    return f"| {fmt_size(row['bytes'])} | " + " | ".join(cells + ratios) + f" | {sum(row['wrong'].values())} |"


def report(rows, args, where: str) -> str:
    keys = list(rows[0]["us"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    head = [f"### {where}", "",
            f"`{' '.join(sys.argv)}` (ringlet on {args.ringlet_transport}; commit {commit}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.repeats} repeats x {args.iters} calls "
            f"in {args.blocks} interleaved blocks)", "",
            "Times: µs, median over repeats of the slowest rank's median block. Ratios: time / mpi's time in the "
            "same repeat, median (min-max) over repeats.", "",
            "| size | " + " | ".join(f"{k} µs" for k in keys) + " | "
            + " | ".join(f"{k} / mpi" for k in keys if k != "mpi") + " | #wrong |",
            "|---|" + "---|" * (2 * len(keys))]
    return "\n".join(head + [_line(r) for r in rows]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ringlet-transport", default="shm")
    ap.add_argument("--sizes", default="4,16,64,256,1K,4K,16K,64K")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gloo", action="store_true", help="also ringlet over Gloo point-to-point")
    ap.add_argument("--where", default="", help="title of the table")
    ap.add_argument("--out", default="", help="append the markdown table to this file (rank 0)")
    args = ap.parse_args()

    import torch.distributed as dist
    from mpi4py import MPI

    import ringlet
    from ringlet.bench.job import _torch_env_beside_mpi

    comm = MPI.COMM_WORLD
    _torch_env_beside_mpi()
    gloo_rt = None
    if args.gloo:
        from ringlet.runtime import Runtime
        from ringlet.transport.torchdist import TorchTransport

        dist.init_process_group("gloo", init_method="env://")
        gloo_rt = Runtime(TorchTransport.from_env())
    rt = ringlet.init(transport=args.ringlet_transport)
    rows = sweep(args, rt, gloo_rt, comm)
    if comm.Get_rank() == 0:
        text = report(rows, args, args.where or f"{comm.Get_size()} ranks")
        print(text)
        if args.out:
            with open(args.out, "a") as f:
                f.write(text + "\n")
    if gloo_rt is not None:
        gloo_rt.close()
    ringlet.shutdown()


if __name__ == "__main__":
    main()
