"""Ragged all-to-all: every ringlet schedule against Gloo's own all_to_all_single and MPI_Alltoallv.

    ringlet run -np 4 --transport torch -- python benchmarks/alltoall/alltoall_bench.py
    ringlet run -np 4 --transport mpi -- python benchmarks/alltoall/alltoall_bench.py   # adds MPI_Alltoallv

ringlet runs over Gloo point-to-point (the torch transport) in both; under mpiexec (``--transport mpi``)
torch.distributed joins beside MPI (``ringlet.bench.job._start``) and mpi4py's ``Alltoallv`` runs in
the same job. Sizes are bytes each rank sends; the splits are ragged (rank ``s`` sends to ``d`` in
proportion to ``1 + (s + 2d) mod 4``, zero blocks included when ``--zeros``), the same matrix for
every implementation, which every rank computes alike.

Per size the timing blocks of every implementation are interleaved (A B C A B C ...); each number is the
slowest rank's median block. Every implementation's output is then compared with the expected one
(integer data); ``#wrong`` counts wrong elements over all ranks. ``auto`` is ``ringlet.alltoall`` as a
user calls it; the table names what it chose. ``recv`` passes the receive counts too (``recv_splits``:
no count exchange, the counts checked in the one metadata round of a checked call), ``recv_unchecked``
also with ``check=False`` (nothing before the data). ``engine`` is the pairwise exchange alone (the
engine's ``alltoall_rows`` on the runtime's queue, every split known, no check): the difference to
``pairwise`` is what the count exchange and the check cost.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

ALGORITHMS = ("pairwise", "hierarchical", "bruck", "auto")
RECV_ARMS = ("recv", "recv_unchecked")  # ringlet.alltoall with recv_splits: checked (the default), unchecked


def split_matrix(p: int, nbytes: int, itemsize: int, zeros: bool) -> list[list[int]]:
    """Rows each rank sends to each rank (one element per row), about ``nbytes`` per rank in all."""
    n = max(p, nbytes // itemsize)
    rows = []
    for s in range(p):
        w = [0 if zeros and (s + d) % 5 == 4 else 1 + (s + 2 * d) % 4 for d in range(p)]
        base = [n * x // sum(w) for x in w]
        base[max(range(p), key=lambda d: w[d])] += n - sum(base)
        rows.append(base)
    return rows


def data(splits: list[list[int]], s: int) -> torch.Tensor:
    """Rank ``s``'s input: block ``d`` holds ``1000·s + d`` plus its position mod 7 (exact in float32)."""
    blocks = [(torch.arange(c) % 7 + 1000 * s + d).float() for d, c in enumerate(splits[s])]
    return torch.cat(blocks) if blocks else torch.zeros(0)


def expected(splits: list[list[int]], d: int) -> torch.Tensor:
    return torch.cat([(torch.arange(splits[s][d]) % 7 + 1000 * s + d).float() for s in range(len(splits))])


def implementations(splits, me, comm):
    import ringlet

    p = len(splits)
    send = data(splits, me)
    recv_counts = [splits[s][me] for s in range(p)]
    out = torch.empty(sum(recv_counts))
    result = {}

    def ringlet_run(algo):
        def run():
            result[algo] = ringlet.alltoall(send, splits[me], algorithm=algo)[0]
        return run

    runs = {algo: ringlet_run(algo) for algo in ALGORITHMS}

    def ringlet_recv(check):
        def run():
            result["recv" if check else "recv_unchecked"] = ringlet.alltoall(send, splits[me], recv_splits=recv_counts,
                                                                             check=check)[0]
        return run
    runs["recv"], runs["recv_unchecked"] = ringlet_recv(True), ringlet_recv(False)
    rt = ringlet.collectives.runtime()

    def engine():
        from ringlet.engine import ops

        def job():
            return ops.alltoall_rows(rt.channel(rt.world), send, splits, algorithm="pairwise")[0]
        result["engine"] = rt.submit(job, sync=True).wait()
    runs["engine"] = engine

    def gloo():
        dist.all_to_all_single(out, send, recv_counts, splits[me])
        result["gloo"] = out
    runs["gloo"] = gloo
    if comm is not None:
        from mpi4py import MPI

        sc, rc = splits[me], recv_counts
        sd = [sum(sc[:d]) for d in range(p)]
        rd = [sum(rc[:s]) for s in range(p)]
        mout = torch.empty(sum(rc))

        def mpi():
            comm.Alltoallv([send.numpy(), sc, sd, MPI.FLOAT], [mout.numpy(), rc, rd, MPI.FLOAT])
            result["mpi"] = mout
        runs["mpi"] = mpi
    return runs, result


def _max_all(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def measure(args, nbytes: int, comm) -> dict:
    import ringlet
    from ringlet.benchmarking import iterations_for, time_interleaved

    rt = ringlet.collectives.runtime()
    p, me = rt.size, rt.rank
    splits = split_matrix(p, nbytes, 4, args.zeros)
    runs, result = implementations(splits, me, comm)
    iters = args.iters or iterations_for(nbytes * p, budget_bytes=args.budget, lo=3, hi=100)
    secs = time_interleaved(runs, dist.barrier, iters=iters, warmup=2, blocks=args.blocks)
    counts = tuple(tuple(row) for row in splits)
    chosen = rt.selector.alltoall("auto", counts, 4, tuple(rt.world.host_of))
    want = expected(splits, me)
    wrong = {}
    for name, run in runs.items():
        run()
        got = result[name]
        bad = got.numel() != want.numel() or not torch.equal(got, want)
        t = torch.tensor([int((got != want).sum()) if not bad or got.numel() == want.numel() else want.numel()])
        dist.all_reduce(t)
        wrong[name] = int(t)
    return {"bytes": nbytes, "iters": iters, "ms": {k: _max_all(v) * 1e3 for k, v in secs.items()},
            "auto_chose": chosen, "wrong": wrong}


def table(rows: list[dict], header: str) -> str:
    from ringlet.benchmarking import fmt_size

    names = list(rows[0]["ms"])
    lines = [header, "", "| size per rank | " + " | ".join(f"{n} ms" for n in names)
             + " | auto chose | auto / gloo | best ringlet / gloo |"
             + (" best ringlet / mpi |" if "mpi" in names else "") + " #wrong |",
             "|---|" + "---|" * (len(names) + 4 + ("mpi" in names))]
    for r in rows:
        ms = r["ms"]
        best = min(ms[a] for a in ALGORITHMS + RECV_ARMS if a in ms)
        cells = [f"{ms[n]:.3f}" for n in names] + [r["auto_chose"], f"{ms['auto'] / ms['gloo']:.2f}",
                                                   f"{best / ms['gloo']:.2f}"]
        if "mpi" in ms:
            cells.append(f"{best / ms['mpi']:.2f}")
        cells.append(str(sum(r["wrong"].values())))
        lines.append(f"| {fmt_size(r['bytes'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1K,16K,256K,1M,4M,16M", help="bytes each rank sends, comma list")
    ap.add_argument("--iters", type=int, default=0, help="calls per implementation (0: by size)")
    ap.add_argument("--budget", type=int, default=1 << 29, help="bytes per implementation and size when --iters 0")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--zeros", action="store_true", help="some blocks empty")
    ap.add_argument("--where", default="", help="title of the table")
    ap.add_argument("--out", default="", help="write the rows as JSON here (rank 0)")
    args = ap.parse_args()

    import ringlet
    from ringlet.bench.job import _start
    from ringlet.benchmarking import parse_size
    from ringlet.transport import detect

    comm = None
    if detect() == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    rt = _start("torch", ["native"])
    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        rows.append(measure(args, size, comm))
        if rt.rank == 0:
            print(json.dumps(rows[-1]), flush=True)
    if rt.rank == 0:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        hosts = len(set(rt.world.host_of))
        header = (f"### {args.where or f'{rt.size} ranks on {hosts} host(s)'}\n\n`{' '.join(sys.argv)}` (commit "
                  f"{commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, ringlet over Gloo p2p, "
                  f"float32, ragged splits{', zero blocks' if args.zeros else ''}). Times: ms, the slowest "
                  "rank's median block.")
        text = table(rows, header)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"argv": sys.argv, "commit": commit, "ranks": rt.size, "hosts": hosts,
                           "host_of": list(rt.world.host_of), "env_tune": os.environ.get("RINGLET_TUNE", ""),
                           "rows": rows, "table": text}, f, indent=1)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
