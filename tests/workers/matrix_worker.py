"""One rank of the collective matrix, run inside a real job:

    ringlet run -np N --transport T -- python tests/workers/matrix_worker.py OUT.json

Every rank runs the same cases in the same order, computes the expected result itself with
:mod:`ringlet.algorithms.reference` (all inputs are integer-valued and derived from a seed, so every
rank can generate every other rank's input) and writes ``OUT.json.rank<r>`` with its counts and the
failing/skipped cases. The pytest side asserts that no rank failed anything.

Each concern is covered once. Schedules: every all-reduce algorithm x counts 0, 1, 2, 7, 1023 and
2^20+3 with one dtype and op. Reductions and the transport's handling of every element size: every
dtype x every op through one scheduled algorithm and through the transport's native all-reduce
(``native`` may be unavailable for a dtype/transport: skipped). Then broadcast from every root (every
dtype from one), reduce to every root (every op and dtype at one), ragged allgather, reduce_scatter,
alltoall with splits, barrier, sub-group collectives and asynchronous handles.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
import zlib

import torch

import ringlet
from ringlet.algorithms import NATIVE, allreduce_names, reference
from ringlet.types import SUPPORTED_DTYPES, ReduceOp

from envcheck import env_checks  # noqa: E402 - sibling module; workers run as scripts

# Count 0 returns before any schedule or backend call, so it runs per algorithm once, not per dtype x op.
SMALL_COUNTS = (1, 2, 7, 1023)
BIG_COUNT = (1 << 20) + 3
REDUCTION_ALGOS = ("ring", NATIVE)  # every dtype x op: one scheduled algorithm and the transport's own
OPS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)
MAX_ERRORS = 5  # exceptions (not wrong values) after which ranks are likely out of step: stop early


class Skip(Exception):
    pass


class Abort(Exception):
    pass


def data(key: str, rank: int, shape, dtype: torch.dtype, op: ReduceOp = ReduceOp.SUM) -> torch.Tensor:
    """Integer-valued input of ``rank`` for case ``key``; small enough that every reduction is exact
    in every dtype for up to 4 ranks (sums within +-12, products within 81)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}|{rank}".encode()))
    n = 1
    for s in shape:
        n *= s
    unsigned = dtype == torch.uint8
    if op == ReduceOp.PRODUCT:
        choices = torch.tensor([1, 2, 3] if unsigned else [-2, -1, 1, 2])
        vals = choices[torch.randint(0, len(choices), (n,), generator=g)]
    elif op in (ReduceOp.MIN, ReduceOp.MAX):
        vals = torch.randint(0, 101, (n,), generator=g) if unsigned else torch.randint(-50, 51, (n,), generator=g)
    else:
        vals = torch.randint(0, 6, (n,), generator=g) if unsigned else torch.randint(-3, 4, (n,), generator=g)
    return vals.to(dtype).reshape(shape)


def describe_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}"
    ne = (got.reshape(-1) != want.reshape(-1)).nonzero()
    i = int(ne[0]) if len(ne) else -1
    return (f"{len(ne)} of {want.numel()} elements differ; first at flat index {i}: "
            f"got {got.reshape(-1)[i].item()}, want {want.reshape(-1)[i].item()}")


def check_equal(got: torch.Tensor, want: torch.Tensor, what: str = "result") -> None:
    if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
        raise AssertionError(f"{what}: {describe_diff(got, want)}")


class Runner:
    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.passed = 0
        self.failed: list[dict] = []
        self.skipped: list[dict] = []
        self.errors = 0
        self.sections: dict[str, float] = {}

    def case(self, name: str, fn) -> None:
        try:
            fn()
            self.passed += 1
        except Skip as exc:
            self.skipped.append({"case": name, "why": str(exc)})
        except AssertionError as exc:
            self.failed.append({"case": name, "error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none hides the others
            self.failed.append({"case": name, "error": f"{type(exc).__name__}: {exc}",
                                "traceback": traceback.format_exc(limit=6)})
            self.errors += 1
            if self.errors >= MAX_ERRORS:
                raise Abort(f"{self.errors} cases raised; ranks are probably out of step") from exc

    def section(self, name: str, fn) -> None:
        t0 = time.perf_counter()
        fn(self)
        self.sections[name] = round(time.perf_counter() - t0, 2)


# ---- all-reduce ------------------------------------------------------------------------------------
def allreduce_case(run: Runner, algo: str, dtype, op: ReduceOp, shape, *, inplace=False, pre=1.0, post=1.0):
    p, r = run.size, run.rank
    key = f"ar|{algo}|{dtype}|{op.name}|{shape}|{pre}|{post}"
    ins = [data(key, q, shape, dtype, op) for q in range(p)]
    want = reference.allreduce(ins, op, pre, post)[r]
    mine = ins[r].clone()
    try:
        if inplace:
            out = ringlet.allreduce_(mine, op=op, algorithm=algo, prescale_factor=pre, postscale_factor=post)
            if out.data_ptr() != mine.data_ptr():
                raise AssertionError("allreduce_ did not return its input tensor")
        else:
            out = ringlet.allreduce(mine, op=op, algorithm=algo, prescale_factor=pre, postscale_factor=post)
            check_equal(mine, ins[r], "input modified by allreduce")
    except ValueError as exc:
        if algo == NATIVE and "not available" in str(exc):
            raise Skip(str(exc)) from None
        raise
    check_equal(out, want)


def section_allreduce(run: Runner) -> None:
    for algo in allreduce_names():
        for n in SMALL_COUNTS:
            run.case(f"allreduce {algo} float32 SUM n={n}",
                     lambda: allreduce_case(run, algo, torch.float32, ReduceOp.SUM, (n,)))
        for dtype in (torch.float32, torch.int8):
            run.case(f"allreduce {algo} {dtype} SUM n=0", lambda: allreduce_case(run, algo, dtype, ReduceOp.SUM, (0,)))
        run.case(f"allreduce {algo} float32 SUM shape=(3,5,7)",
                 lambda: allreduce_case(run, algo, torch.float32, ReduceOp.SUM, (3, 5, 7)))
        run.case(f"allreduce_ (in place) {algo} int32 MAX n=1023",
                 lambda: allreduce_case(run, algo, torch.int32, ReduceOp.MAX, (1023,), inplace=True))
        run.case(f"allreduce {algo} float64 AVG prescale=2 postscale=0.5 n=7",
                 lambda: allreduce_case(run, algo, torch.float64, ReduceOp.AVG, (7,), pre=2.0, post=0.5))


def section_allreduce_dtypes(run: Runner) -> None:
    for algo in REDUCTION_ALGOS:
        for dtype in SUPPORTED_DTYPES:
            for op in OPS:
                for n in (7, 1023):
                    run.case(f"allreduce {algo} {dtype} {op.name} n={n}",
                             lambda: allreduce_case(run, algo, dtype, op, (n,)))


def section_allreduce_big(run: Runner) -> None:
    for algo in allreduce_names():
        run.case(f"allreduce {algo} float32 SUM n={BIG_COUNT}",
                 lambda: allreduce_case(run, algo, torch.float32, ReduceOp.SUM, (BIG_COUNT,)))
    run.case(f"allreduce ring int64 SUM n={BIG_COUNT}",
             lambda: allreduce_case(run, "ring", torch.int64, ReduceOp.SUM, (BIG_COUNT,)))


# ---- broadcast and reduce ----------------------------------------------------------------------------
def broadcast_case(run: Runner, root: int, dtype, shape, inplace=False):
    p, r = run.size, run.rank
    key = f"bc|{root}|{dtype}|{shape}"
    ins = [data(key, q, shape, dtype) for q in range(p)]
    mine = ins[r].clone()
    if inplace:
        out = ringlet.broadcast_(mine, root)
        check_equal(mine, ins[root], "in-place broadcast target")
    else:
        out = ringlet.broadcast(mine, root)
        check_equal(mine, ins[r], "input modified by broadcast")
    check_equal(out, reference.broadcast(ins, root)[r])


def section_broadcast(run: Runner) -> None:
    for dtype in SUPPORTED_DTYPES:
        run.case(f"broadcast root={run.size - 1} {dtype} n=7", lambda: broadcast_case(run, run.size - 1, dtype, (7,)))
    for root in range(run.size):
        for n in (0, 1, 1023):
            run.case(f"broadcast root={root} float32 n={n}", lambda: broadcast_case(run, root, torch.float32, (n,)))
        run.case(f"broadcast_ (in place) root={root} int64 shape=(4,9)",
                 lambda: broadcast_case(run, root, torch.int64, (4, 9), inplace=True))
    run.case(f"broadcast root={run.size - 1} float32 n={BIG_COUNT}",
             lambda: broadcast_case(run, run.size - 1, torch.float32, (BIG_COUNT,)))


def reduce_case(run: Runner, root: int, dtype, op: ReduceOp, shape):
    p, r = run.size, run.rank
    key = f"rd|{root}|{dtype}|{op.name}|{shape}"
    ins = [data(key, q, shape, dtype, op) for q in range(p)]
    out = ringlet.reduce(ins[r].clone(), root, op=op)
    if r == root:
        check_equal(out, reference.allreduce(ins, op)[r])
    else:
        check_equal(out, ins[r], "non-root reduce output")


def section_reduce(run: Runner) -> None:
    for root in range(run.size):
        for n in (1, 1023):
            run.case(f"reduce root={root} float32 SUM n={n}", lambda: reduce_case(run, root, torch.float32, ReduceOp.SUM, (n,)))
    for op in OPS:
        for dtype in (torch.float32, torch.int32):
            run.case(f"reduce root={run.size - 1} {dtype} {op.name} n=1023",
                     lambda: reduce_case(run, run.size - 1, dtype, op, (1023,)))
    for dtype in SUPPORTED_DTYPES:
        run.case(f"reduce root=0 {dtype} SUM n=7", lambda: reduce_case(run, 0, dtype, ReduceOp.SUM, (7,)))


# ---- allgather, reduce_scatter, alltoall ------------------------------------------------------------
def allgather_case(run: Runner, dtype, shapes):
    p, r = run.size, run.rank
    key = f"ag|{dtype}|{shapes}"
    ins = [data(key, q, shapes[q], dtype) for q in range(p)]
    out = ringlet.allgather(ins[r].clone())
    if ins[r].dim() == 0:
        want = torch.stack(ins)
    else:
        want = reference.allgather(ins)[r]
    check_equal(out, want)


def section_allgather(run: Runner) -> None:
    p = run.size
    ragged = [([2, 0, 3, 1][q % 4], 3) for q in range(p)]
    for dtype in SUPPORTED_DTYPES:
        run.case(f"allgather ragged rows={[s[0] for s in ragged]} x 3 {dtype}",
                 lambda: allgather_case(run, dtype, ragged))
    run.case("allgather 1-D ragged float32 (big)",
             lambda: allgather_case(run, torch.float32, [((q + 1) * 50_000,) for q in range(p)]))
    run.case("allgather 0-d int64", lambda: allgather_case(run, torch.int64, [() for _ in range(p)]))
    run.case("allgather all empty float32", lambda: allgather_case(run, torch.float32, [(0, 4) for _ in range(p)]))


def reduce_scatter_case(run: Runner, dtype, op: ReduceOp, shape):
    p, r = run.size, run.rank
    key = f"rs|{dtype}|{op.name}|{shape}"
    ins = [data(key, q, shape, dtype, op) for q in range(p)]
    out = ringlet.reduce_scatter(ins[r].clone(), op=op)
    check_equal(out, reference.reduce_scatter(ins, op)[r])


def section_reduce_scatter(run: Runner) -> None:
    p = run.size
    for rows in (1, p, 2 * p + 1, 1023):
        run.case(f"reduce_scatter rows={rows} x 3 float32 SUM",
                 lambda: reduce_scatter_case(run, torch.float32, ReduceOp.SUM, (rows, 3)))
    for op in OPS:
        for dtype in (torch.int64, torch.bfloat16):
            run.case(f"reduce_scatter rows={2 * p + 1} x 3 {dtype} {op.name}",
                     lambda: reduce_scatter_case(run, dtype, op, (2 * p + 1, 3)))
    run.case("reduce_scatter 1-D float32 n=2^20+3",
             lambda: reduce_scatter_case(run, torch.float32, ReduceOp.SUM, (BIG_COUNT,)))


def alltoall_case(run: Runner, dtype, splits):
    p, r = run.size, run.rank
    key = f"a2a|{dtype}|{splits}"
    if splits is None:
        ins = [data(key, q, (2 * p, 2), dtype) for q in range(p)]
        out, recv = ringlet.alltoall(ins[r].clone())
        even = [[2] * p for _ in range(p)]
        want = reference.alltoall(ins, even)[r]
        want_recv = [2] * p
    else:
        ins = [data(key, q, (sum(splits[q]), 2), dtype) for q in range(p)]
        out, recv = ringlet.alltoall(ins[r].clone(), splits[r])
        want = reference.alltoall(ins, splits)[r]
        want_recv = [splits[s][r] for s in range(p)]
    check_equal(out, want)
    if list(recv) != want_recv:
        raise AssertionError(f"received splits {list(recv)}, want {want_recv}")


def section_alltoall(run: Runner) -> None:
    p = run.size
    splits = [[(q + 2 * d + 1) % 3 for d in range(p)] for q in range(p)]
    for dtype in SUPPORTED_DTYPES:
        run.case(f"alltoall splits={splits} {dtype}", lambda: alltoall_case(run, dtype, splits))
    run.case("alltoall even splits float32", lambda: alltoall_case(run, torch.float32, None))
    big = [[1000 * ((q + d) % 3) for d in range(p)] for q in range(p)]
    run.case("alltoall larger splits float64", lambda: alltoall_case(run, torch.float64, big))
    run.case("alltoall recv_splits every schedule", lambda: alltoall_recv_case(run, splits))
    run.case("alltoall mismatched recv_splits", lambda: alltoall_mismatch_case(run, splits))


def alltoall_recv_case(run: Runner, splits):
    """The receive counts given, every schedule, checked and not: the reference's rows."""
    p, r = run.size, run.rank
    ins = [data(f"a2a-recv|{splits}", q, (sum(splits[q]), 3), torch.float32) for q in range(p)]
    want, recv = reference.alltoall(ins, splits)[r], [splits[s][r] for s in range(p)]
    for algo in ("auto", "pairwise", "hierarchical", "bruck"):
        for check in (True, False):
            out, got = ringlet.alltoall(ins[r].clone(), splits[r], algorithm=algo, recv_splits=recv, check=check)
            check_equal(out, want)
            if list(got) != recv:
                raise AssertionError(f"{algo}: received splits {list(got)}, want {recv}")


def alltoall_mismatch_case(run: Runner, splits):
    """The last rank expects one row more from rank 0 than it sends: the same MismatchError everywhere."""
    from ringlet.types import MismatchError

    p, r = run.size, run.rank
    recv = [splits[s][r] + (1 if r == p - 1 and s == 0 else 0) for s in range(p)]
    for algo in ("auto", "bruck"):
        try:
            ringlet.alltoall(torch.zeros(sum(splits[r])), splits[r], algorithm=algo, recv_splits=recv)
        except MismatchError as e:
            if f"rank 0 sends {splits[0][p - 1]} rows to rank {p - 1}" not in str(e):
                raise
        else:
            raise AssertionError(f"{algo}: mismatched recv_splits did not raise")


# ---- barrier, groups, async --------------------------------------------------------------------------
def barrier_case(run: Runner):
    """Nobody leaves the barrier before the last rank entered it (one shared clock: one machine)."""
    p, r = run.size, run.rank
    if r == p - 1:
        time.sleep(0.3)
    entered = time.time()
    ringlet.barrier()
    left = time.time()
    stamps = ringlet.allgather(torch.tensor([[entered, left]], dtype=torch.float64))
    last_entry = float(stamps[:, 0].max())
    first_exit = float(stamps[:, 1].min())
    if first_exit < last_entry:
        raise AssertionError(f"a rank left the barrier {last_entry - first_exit:.3f}s before the last one entered")


def section_barrier(run: Runner) -> None:
    run.case("barrier x3", lambda: [ringlet.barrier() for _ in range(3)])
    run.case("barrier waits for the slowest rank", lambda: barrier_case(run))


def section_groups(run: Runner) -> None:
    p, r = run.size, run.rank
    evens = ringlet.new_group(range(0, p, 2))
    tail = ringlet.new_group(range(1, p))
    for name, g in (("evens", evens), ("tail", tail)):
        members = list(g.ranks)
        if r not in members:
            continue
        gr = members.index(r)

        def ar(algo, dtype, n, op, members=members, gr=gr, g=g, name=name):
            key = f"grp|{name}|{algo}|{dtype}|{n}|{op.name}"
            ins = [data(key, q, (n,), dtype, op) for q in members]
            try:
                out = ringlet.allreduce(ins[gr].clone(), op=op, algorithm=algo, group=g)
            except ValueError as exc:
                if algo == NATIVE and "not available" in str(exc):
                    raise Skip(str(exc)) from None
                raise
            check_equal(out, reference.allreduce(ins, op)[gr])

        for algo in allreduce_names():
            for n in (7, 1023):
                run.case(f"group {name}={members} allreduce {algo} float32 SUM n={n}",
                         lambda algo=algo, n=n: ar(algo, torch.float32, n, ReduceOp.SUM))
            run.case(f"group {name}={members} allreduce {algo} int64 AVG n=7",
                     lambda algo=algo: ar(algo, torch.int64, 7, ReduceOp.AVG))

        def bc(g=g, members=members, gr=gr, name=name):
            root = members[-1]
            ins = [data(f"grpbc|{name}", q, (5,), torch.int32) for q in members]
            check_equal(ringlet.broadcast(ins[gr].clone(), root, group=g), ins[-1])

        def ag(g=g, members=members, gr=gr, name=name):
            ins = [data(f"grpag|{name}", q, (q + 1, 2), torch.float32) for q in members]
            check_equal(ringlet.allgather(ins[gr].clone(), group=g), torch.cat(ins))

        run.case(f"group {name}={members} broadcast", bc)
        run.case(f"group {name}={members} allgather", ag)
        run.case(f"group {name}={members} barrier", lambda g=g: ringlet.barrier(group=g))
    # The world still works after sub-group traffic.
    run.case("world allreduce after groups", lambda: allreduce_case(run, "ring", torch.float32, ReduceOp.SUM, (33,)))


def async_case(run: Runner):
    p, r = run.size, run.rank
    sizes = (1, 100, 4096, 70_000, 3)
    algos = allreduce_names()
    ar_in = [[data(f"async|{i}", q, (n,), torch.float32) for q in range(p)] for i, n in enumerate(sizes)]
    handles = []
    for i, n in enumerate(sizes):
        algo = algos[i % len(algos)]
        if algo == NATIVE:
            algo = "ring"
        handles.append(("allreduce", i, ringlet.allreduce_async(ar_in[i][r].clone(), op="sum", algorithm=algo)))
    inplace = ar_in[2][r].clone()
    handles.append(("allreduce_", 2, ringlet.allreduce_async_(inplace, op="sum")))
    bc_in = [data("async|bc", q, (9,), torch.int64) for q in range(p)]
    handles.append(("broadcast", 0, ringlet.broadcast_async(bc_in[r].clone(), 0)))
    ag_in = [data("async|ag", q, (q + 1, 2), torch.int32) for q in range(p)]
    handles.append(("allgather", 0, ringlet.allgather_async(ag_in[r].clone())))
    rs_in = [data("async|rs", q, (2 * p + 1, 2), torch.float64) for q in range(p)]
    handles.append(("reduce_scatter", 0, ringlet.reduce_scatter_async(rs_in[r].clone(), op="sum")))
    a2a_in = [data("async|a2a", q, (p, 3), torch.float32) for q in range(p)]
    handles.append(("alltoall", 0, ringlet.alltoall_async(a2a_in[r].clone())))
    handles.append(("barrier", 0, ringlet.barrier_async()))
    # A synchronous op queues behind the asynchronous ones and must see them all finished.
    sync_in = [data("async|sync", q, (5,), torch.float32) for q in range(p)]
    check_equal(ringlet.allreduce(sync_in[r].clone(), op="sum"), reference.allreduce(sync_in)[r], "sync after async")
    for kind, i, h in reversed(handles):
        res = h.wait()
        if not h.done():
            raise AssertionError(f"{kind} handle not done() after wait()")
        if kind == "allreduce":
            check_equal(res, reference.allreduce(ar_in[i])[r], f"async allreduce #{i}")
        elif kind == "allreduce_":
            check_equal(inplace, reference.allreduce(ar_in[i])[r], "async in-place allreduce")
        elif kind == "broadcast":
            check_equal(res, bc_in[0], "async broadcast")
        elif kind == "allgather":
            check_equal(res, torch.cat(ag_in), "async allgather")
        elif kind == "reduce_scatter":
            check_equal(res, reference.reduce_scatter(rs_in)[r], "async reduce_scatter")
        elif kind == "alltoall":
            out, _ = res
            check_equal(out, reference.alltoall(a2a_in, [[1] * p for _ in range(p)])[r], "async alltoall")


def section_async(run: Runner) -> None:
    for rep in range(3):
        run.case(f"async handles round {rep}", lambda: async_case(run))


def section_env(run: Runner) -> None:
    def check():
        problems = env_checks(run.rank, run.size)
        if problems:
            raise AssertionError("; ".join(problems))

    run.case("launcher environment (RINGLET_*/HOROVOD_*)", check)


SECTIONS = (
    ("env", section_env),
    ("allreduce", section_allreduce),
    ("allreduce_dtypes", section_allreduce_dtypes),
    ("allreduce_big", section_allreduce_big),
    ("broadcast", section_broadcast),
    ("reduce", section_reduce),
    ("allgather", section_allgather),
    ("reduce_scatter", section_reduce_scatter),
    ("alltoall", section_alltoall),
    ("barrier", section_barrier),
    ("groups", section_groups),
    ("async", section_async),
)


def main() -> int:
    out_path = sys.argv[1]
    only = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None
    t0 = time.perf_counter()
    ringlet.init()
    run = Runner(ringlet.rank(), ringlet.size())
    aborted = None
    try:
        for name, fn in SECTIONS:
            if only is None or name in only:
                run.section(name, fn)
    except Abort as exc:
        aborted = str(exc)
    summary = {
        "rank": run.rank, "size": run.size, "transport": ringlet.collectives.runtime().transport.name,
        "passed": run.passed, "failed": run.failed, "skipped_count": len(run.skipped),
        "skipped": run.skipped[:50], "aborted": aborted, "sections": run.sections,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    with open(f"{out_path}.rank{run.rank}", "w") as f:
        json.dump(summary, f, indent=1)
    if aborted is None:
        ringlet.shutdown()
        return 0
    sys.stdout.flush()
    os._exit(3)  # ranks may be out of step: do not wait in a collective shutdown


if __name__ == "__main__":
    sys.exit(main())
