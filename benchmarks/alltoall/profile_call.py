"""Where one ``ringlet.alltoall`` call spends its time: the phases of a call timed on every rank.

    ringlet run -np 4 --transport torch -- python benchmarks/alltoall/profile_call.py

Each phase is a function of the call path wrapped with a timer (a phase missing from the checkout being
profiled is left out, so that the same script profiles older code): the count exchange or check
(``counts``: all of it; ``records``: the record exchange with its digest round; ``digest``: that round
alone; ``record_exchange``: the records' step alone; ``residual``: the receive counts' check round),
the choice, the schedule build, the plan compile, the executor (``execute``: the data's messages, the
plan compiles and the records' step excluded) and the whole request on the runtime's queue
(``request``). ``call`` is the caller's wall time per call. Phases are the slowest rank's, so they do
not add up exactly; a round that synchronises the ranks also absorbs their skew. Two count patterns:
``same`` (the same ragged matrix every call: cached schedules) and ``fresh`` (new ragged counts every
call, as mixture of experts sends: every schedule built anew). ``--recv`` passes ``recv_splits``.
Prints per size and pattern the slowest rank's mean milliseconds per call of each phase.
"""
from __future__ import annotations

import argparse
import functools
import json
import time
from collections import defaultdict

import torch
import torch.distributed as dist

TOTALS: dict[str, float] = defaultdict(float)
_DEPTH: dict[str, int] = defaultdict(int)


def timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        if _DEPTH[name]:  # recursion (a nested call of the same phase) counts once
            return fn(*a, **kw)
        _DEPTH[name] += 1
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            TOTALS[name] += time.perf_counter() - t
            _DEPTH[name] -= 1
    return wrapper


def instrument() -> None:
    """Wrap the phases that exist in this checkout."""
    from ringlet.algorithms import ALLTOALL, executor
    from ringlet.engine import agree, ops, requests

    for name in list(ALLTOALL):
        ALLTOALL[name] = timed("build", ALLTOALL[name])
    executor.compile_plan = timed("compile", executor.compile_plan)
    executor.execute = timed("execute", executor.execute)
    agree.records = timed("records", agree.records)
    agree.digest_agrees = timed("digest", agree.digest_agrees)
    agree.exchange = timed("record_exchange", agree.exchange)
    try:
        from ringlet.engine import a2a_counts
        a2a_counts.exchange = timed("counts", a2a_counts.exchange)
        a2a_counts.check_known = timed("counts", a2a_counts.check_known)
        a2a_counts._native_sum_is_zero = timed("residual", a2a_counts._native_sum_is_zero)
    except ImportError:
        pass
    for fn in ("pairwise_direct",):
        if hasattr(ops, fn):
            setattr(ops, fn, timed("execute", getattr(ops, fn)))
    requests.AlltoallRequest.run = timed("request", requests.AlltoallRequest.run)
    from ringlet.tuning import select
    select.Selector.alltoall = timed("choose", select.Selector.alltoall)


def ragged(p: int, n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(p):
        w = torch.randint(1, 5, (p,), generator=g)
        base = (w * n // int(w.sum())).tolist()
        base[0] += n - sum(base)
        rows.append(base)
    return rows


def profile(size: int, fresh: bool, iters: int, recv: bool) -> dict[str, float]:
    import ringlet

    rt = ringlet.collectives.runtime()
    p, me = rt.size, rt.rank
    n = max(p, size // 4)
    kw = {}
    for i in range(iters + 3):
        if i == 3:
            TOTALS.clear()
            dist.barrier()
            t0 = time.perf_counter()
        splits = ragged(p, n, 1000 + (i if fresh else 0))
        x = torch.ones(sum(splits[me]))
        if recv:
            kw = {"recv_splits": [splits[s][me] for s in range(p)]}
        ringlet.alltoall(x, splits[me], **kw)
    TOTALS["call"] = time.perf_counter() - t0
    # The executor's time without the plan compiles and without running the record exchange's schedule.
    TOTALS["execute"] -= TOTALS.get("compile", 0.0) + TOTALS.get("record_exchange", 0.0)
    out = {}
    for k in sorted(TOTALS):
        t = torch.tensor([TOTALS[k] / iters * 1e3], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out[k] = round(float(t), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1K,64K")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--recv", action="store_true", help="pass recv_splits (new API)")
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    import ringlet
    from ringlet.bench.job import _start
    from ringlet.benchmarking import parse_size

    rt = _start("torch", ["native"])
    instrument()
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        for fresh in (False, True):
            row = profile(size, fresh, args.iters, args.recv)
            if rt.rank == 0:
                print(json.dumps({"label": args.label, "bytes": size, "counts": "fresh" if fresh else "same",
                                  "recv_splits": args.recv, "ms_per_call": row}), flush=True)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
