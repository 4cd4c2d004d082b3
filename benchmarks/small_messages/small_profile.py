"""Where a small all-reduce spends its time: each piece timed alone, beside MPI_Allreduce, in one job.

    ringlet run -np 4 --transport mpi -- python benchmarks/small_messages/small_profile.py --ringlet-transport shm 4K 300

Launched by mpiexec (``--transport mpi``); ringlet itself runs on ``--ringlet-transport`` (shm, mpi or
torch). Pieces, their timing blocks interleaved (A B C A B C ...) so a slow spell of the shared
machine hits all of them alike; each number is the slowest rank's median, with this process's CPU
time per call (user + system) beside it, which tells computing from waiting:

* ``mpi``: ``MPI_Allreduce`` in place (the reference);
* ``ringlet:<algo>`` with and without the metadata check (``check=False``);
* ``round``: one bare exchange with the partner ``rank ^ 1`` through the transport (isend + irecv +
  wait), the floor of one round of any schedule;
* ``alltoall-round``: one round in which every rank sends the vector to every peer;
* ``meta``: the metadata check alone (the record all-gather ``collectives._checked`` runs);
* ``engine:<name>``: the prototypes of :mod:`ringlet.engine.small` (``small``, ``small-nocheck``,
  ``small-raw``; ``small-raw@spin30``: with the mailbox waiter spinning 30 us, yielding, before it sleeps).
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch


def _timed(runs: dict, sync, iters: int, blocks: int) -> dict[str, tuple[float, float]]:
    per = max(1, iters // blocks)
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    sys_: dict[str, list[float]] = {k: [] for k in runs}
    for run in runs.values():
        run()
        run()
    for _ in range(blocks):
        for name, run in runs.items():
            sync()
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(per):
                run()
            t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            wall[name].append((t1 - t0) / per)
            cpu[name].append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / per)
            sys_[name].append((r1.ru_stime - r0.ru_stime) / per)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k]), statistics.median(sys_[k])) for k in runs}


def _transport_pieces(tr, t: torch.Tensor, p: int, me: int) -> dict:
    """Bare transport exchanges: one partner, every peer (exact and 64 KiB receive buffers, wait_all)."""
    n = t.numel()
    rbuf = torch.empty(n)
    bufs = [torch.empty(n) for _ in range(p)]
    big = [torch.empty(n + (64 << 10) // 4) for _ in range(p)]
    tags = iter(range(10**9))

    def one_round():
        tag = next(tags) % 30000
        partner = me ^ 1
        if partner >= p:
            return
        r = tr.irecv(rbuf, partner, tag)
        s = tr.isend(t, partner, tag)
        r.wait()
        s.wait()

    def alltoall(bufs_, wait_all: bool):
        def run():
            tag = next(tags) % 30000
            hs = [tr.irecv(bufs_[q], q, tag) if bufs_ is bufs else tr.irecv_upto(bufs_[q], q, tag)
                  for q in range(p) if q != me]
            hs += [tr.isend(t, q, tag) for q in range(p) if q != me]
            if wait_all:
                tr.wait_all(hs)
            else:
                for h in hs:
                    h.wait()
        return run

    runs = {"round": one_round, "alltoall-round": alltoall(bufs, False)}
    if tr.capabilities.partial_receive:
        runs["alltoall-round big-recv"] = alltoall(big, False)
        runs["alltoall-round wait_all"] = alltoall(bufs, True)
    return runs


def _engine_pieces(names: str, rt, t: torch.Tensor) -> dict:
    import small_runners

    tr, runs = rt.transport, {}
    for name in [x for x in names.split(",") if x]:
        base, _, spin = name.partition("@spin")
        runner = small_runners.runner(base, rt, t)
        if spin:  # the shm waiter's spin before sleeping, in microseconds, for this runner only
            def runner(runner=runner, spin=float(spin) * 1e-6):
                old, tr._mailbox_spin = tr._mailbox_spin, spin
                try:
                    runner()
                finally:
                    tr._mailbox_spin = old
        runs[f"engine:{name}"] = runner
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("size", nargs="?", default="4K")
    ap.add_argument("iters", nargs="?", type=int, default=300)
    ap.add_argument("--ringlet-transport", default="shm")
    ap.add_argument("--algorithms", default="recursive_doubling")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--engine", default="", help="comma list of ringlet.engine.small prototypes to time")
    args = ap.parse_args()

    from mpi4py import MPI

    import ringlet
    from ringlet.engine import agree
    from ringlet.engine.meta import Kind, Meta
    from ringlet.benchmarking import parse_size
    from ringlet.bench.job import _start

    comm = MPI.COMM_WORLD
    rt = _start(args.ringlet_transport, [])
    tr, p, me = rt.transport, ringlet.size(), ringlet.rank()
    n = max(1, parse_size(args.size) // 4)
    t = torch.ones(n)
    arr = t.numpy()
    runs = {"mpi": lambda: comm.Allreduce(MPI.IN_PLACE, arr, MPI.SUM)}
    for a in [x for x in args.algorithms.split(",") if x]:
        runs[f"ringlet:{a}"] = lambda a=a: ringlet.allreduce_(t, algorithm=a)
        runs[f"ringlet:{a} nocheck"] = lambda a=a: ringlet.allreduce_(t, algorithm=a, check=False)
    runs.update(_transport_pieces(tr, t, p, me))
    meta = Meta.of("", Kind.ALLREDUCE, t, op=1, algorithm="recursive_doubling")
    runs["meta"] = lambda: agree.agree(rt.channel(rt.world), meta)
    runs.update(_engine_pieces(args.engine, rt, t))
    res = _timed(runs, ringlet.barrier, args.iters, args.blocks)
    worst = {k: max(comm.allgather(v[0])) for k, v in res.items()}
    cpus = {k: comm.allgather(v[1]) for k, v in res.items()}
    syss = {k: comm.allgather(v[2]) for k, v in res.items()}
    if me == 0:
        ref = worst["mpi"]
        print(f"# {p} ranks, {n * 4} B, ringlet on {tr.name}, {args.iters} calls in {args.blocks} interleaved blocks")
        print(f"{'piece':34s} {'time us':>9s} {'x mpi':>7s}  cpu us per rank (of which system)")
        for k in runs:
            cs = " ".join(f"{c * 1e6:4.0f} ({s * 1e6:3.0f})" for c, s in zip(cpus[k], syss[k]))
            print(f"{k:34s} {worst[k] * 1e6:9.1f} {worst[k] / ref:7.2f}  {cs}")
    ringlet.shutdown()


if __name__ == "__main__":
    main()
