"""One rank of the ringlet.torch op job (real processes):

    ringlet run -np N --transport T -- python tests/workers/hvd_ops_worker.py OUT.json

Runs every case below in the same order on every rank, on integer-valued data that every rank can
regenerate for every other rank, then the phases that need a fresh ``init``: fusion disabled (results
must equal the fused ones), a stall (the warning must name the tensor and the missing rank), repeated
shutdown/init, and last a dead peer (the last rank leaves without shutdown; the others' next op must
raise HorovodInternalError, not hang). Writes ``OUT.json.rank<r>`` with passed/failed case names.
Ops are named in every case so that a failure on one rank cannot shift the others' noname numbering.
"""
from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
import traceback
import zlib

import torch

import ringlet.torch as hvd
from ringlet.torch import mpi_ops

CASES: list = []


def case(fn):
    CASES.append(fn)
    return fn


def data(key: str, rank: int, shape, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}|{rank}".encode()))
    n = 1
    for s in shape:
        n *= s
    return torch.randint(-3, 4, (n,), generator=g).to(dtype).reshape(shape)


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.reshape(-1)[:8].tolist()} {tuple(got.shape)} {got.dtype}, "
                             f"want {want.reshape(-1)[:8].tolist()} {tuple(want.shape)} {want.dtype}")


def next_op_works(tag: str) -> None:
    out = mpi_ops.allreduce(torch.ones(3), op=hvd.Sum, name=f"after.{tag}")
    same(out, torch.full((3,), float(hvd.size())), f"op after {tag}")


def fused_batch(tag: str) -> list[torch.Tensor]:
    """Many small all-reduces of two dtypes in flight at once (fusion candidates)."""
    r = hvd.rank()
    xs = [data(f"fb{i}", r, (i % 5 + 1, 3), torch.float32 if i % 2 else torch.int64) for i in range(24)]
    hs = [hvd.allreduce_async(x, name=f"{tag}.{i}", op=hvd.Sum, prescale_factor=2.0) for i, x in enumerate(xs)]
    return [hvd.synchronize(h) for h in hs]


# ---- cases -------------------------------------------------------------------------------------------
@case
def allreduce_ops_and_dtypes():
    n, r = hvd.size(), hvd.rank()
    for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16):
        x = data(f"ar{dt}", r, (33, 7), dt)
        xs = torch.stack([data(f"ar{dt}", j, (33, 7), dt) for j in range(n)])
        same(mpi_ops.allreduce(x, op=hvd.Sum, name=f"sum{dt}"), xs.double().sum(0).to(dt), f"sum {dt}")
        same(mpi_ops.allreduce(x, op=hvd.Max, name=f"max{dt}"), xs.max(0).values, f"max {dt}")
        same(mpi_ops.allreduce(x, op=hvd.Min, name=f"min{dt}"), xs.min(0).values, f"min {dt}")
        if not dt.is_floating_point:
            avg = torch.trunc(xs.double().sum(0) * (1.0 / n)).to(dt)
            same(mpi_ops.allreduce(x, name=f"avg{dt}"), avg, f"integer average {dt}")
    y = data("inpl", r, (10,))
    h = hvd.allreduce_async_(y, op=hvd.Sum, name="inpl", prescale_factor=2.0, postscale_factor=0.5)
    same(hvd.synchronize(h), sum(data("inpl", j, (10,)) for j in range(n)), "in-place scaled")
    same(y, sum(data("inpl", j, (10,)) for j in range(n)), "in-place tensor")


@case
def allgather_broadcast_alltoall_reducescatter():
    n, r = hvd.size(), hvd.rank()
    got = mpi_ops.allgather(data("ag", r, (r + 1, 2), torch.uint8), name="ag")
    same(got, torch.cat([data("ag", j, (j + 1, 2), torch.uint8) for j in range(n)]), "ragged allgather")
    for root in range(n):
        same(mpi_ops.broadcast(data("bc", r, (5,), torch.int16), root, name=f"bc{root}"),
             data("bc", root, (5,), torch.int16), f"broadcast from {root}")
    sp = [[(j + d) % 3 for d in range(n)] for j in range(n)]
    out, recv = mpi_ops.alltoall(data("a2a", r, (sum(sp[r]), 2)), splits=sp[r], name="a2a")
    want = torch.cat([data("a2a", j, (sum(sp[j]), 2))[sum(sp[j][:r]):sum(sp[j][:r + 1])] for j in range(n)])
    same(out, want, "alltoall with splits")
    if recv.tolist() != [sp[j][r] for j in range(n)]:
        raise AssertionError(f"received splits {recv.tolist()}")
    total = sum(data("rs", j, (2 * n + 1, 3)) for j in range(n))
    rows = [2 + (1 if k < 1 else 0) for k in range(n)]
    got = mpi_ops.reducescatter(data("rs", r, (2 * n + 1, 3)), op=hvd.Sum, name="rs")
    same(got, total[sum(rows[:r]):sum(rows[:r + 1])], "reducescatter")


@case
def different_submission_orders():
    n, r = hvd.size(), hvd.rank()
    names = [f"ord{i}" for i in range(10)]
    random.Random(r).shuffle(names)
    hs = {k: hvd.allreduce_async(torch.full((4,), float(int(k[3:]) + r)), name=k, op=hvd.Sum) for k in names}
    for k, h in hs.items():
        same(hvd.synchronize(h), torch.full((4,), float(n * int(k[3:]) + sum(range(n)))), k)


@case
def x_then_barrier_vs_barrier_then_x():
    if hvd.rank() == 0:
        h = hvd.allreduce_async(torch.ones(2), name="xb", op=hvd.Sum)
        hvd.barrier()
        out = hvd.synchronize(h)
    else:
        hvd.barrier()
        out = mpi_ops.allreduce(torch.ones(2), name="xb", op=hvd.Sum)
    same(out, torch.full((2,), float(hvd.size())), "X vs barrier")


@case
def op_of_one_rank_then_barrier():
    """Only rank 0 submits 'lonely' before the barrier: nobody blocks; it completes once all submit it."""
    r = hvd.rank()
    h = hvd.allreduce_async(torch.ones(2), name="lonely", op=hvd.Sum) if r == 0 else None
    hvd.barrier()
    if h is not None and hvd.poll(h):
        raise AssertionError("'lonely' completed before the other ranks submitted it")
    hvd.barrier()
    if r != 0:
        mpi_ops.allreduce(torch.ones(2), name="lonely", op=hvd.Sum)
    else:
        same(hvd.synchronize(h), torch.full((2,), float(hvd.size())), "lonely")


@case
def mismatches_raise_everywhere_then_next_op_works():
    r = hvd.rank()
    table = [
        ("shape", lambda: mpi_ops.allreduce(torch.ones((17 + min(r, 1),) * 3), name="mm.shape"),
         "Mismatched allreduce tensor shapes: One rank sent a tensor of shape [17, 17, 17], but another rank "
         "sent a tensor of shape [18, 18, 18]."),
        ("dtype", lambda: mpi_ops.allreduce(torch.ones(3, dtype=torch.float32 if r == 0 else torch.int32),
                                            name="mm.dtype"),
         "Mismatched data types: One rank had type float32, but another rank had type int32."),
        ("op", lambda: mpi_ops.allreduce(torch.ones(3), name="mm.op", op=hvd.Sum if r == 0 else hvd.Min),
         "Mismatched allreduce reduction ops"),
        ("root", lambda: mpi_ops.broadcast(torch.ones(3), min(r, 1), name="mm.root"), "Mismatched broadcast root"),
        ("prescale", lambda: mpi_ops.allreduce(torch.ones(3), name="mm.pre", prescale_factor=1.0 + min(r, 1)),
         "Mismatched prescale factors"),
        ("postscale", lambda: mpi_ops.allreduce(torch.ones(3), name="mm.post", postscale_factor=1.0 + min(r, 1)),
         "Mismatched postscale factors"),
        ("allgather", lambda: mpi_ops.allgather(torch.ones(1, 1 + min(r, 1)), name="mm.ag"),
         "Mismatched allgather tensor shapes"),
    ]
    for what, fn, msg in table:
        try:
            fn()
        except hvd.HorovodInternalError as exc:
            if not str(exc).startswith(msg):
                raise AssertionError(f"{what}: message {exc}") from None
        else:
            raise AssertionError(f"{what}: no error")
        next_op_works(f"mm.{what}")


@case
def local_errors_then_next_op_works():
    checks = [
        (ValueError, lambda: hvd.allreduce_async(torch.ones(2, dtype=torch.uint8), name="le1")),
        (ValueError, lambda: hvd.allreduce_async(torch.ones(4, 4).t(), name="le2")),
        (ValueError, lambda: hvd.alltoall_async(torch.ones(3), splits=[3], name="le3")),
        (ValueError, lambda: hvd.reducescatter_async(torch.tensor(2.0), name="le4")),
        (ValueError, lambda: hvd.broadcast_async(torch.ones(1), hvd.size(), name="le5")),
        (hvd.HorovodInternalError, lambda: hvd.reducescatter_async(torch.ones(4), op=hvd.Product, name="le6")),
        (NotImplementedError, lambda: hvd.allreduce_async(torch.ones(1), op=hvd.Adasum, name="le7")),
        (ValueError, lambda: hvd.allreduce_async(torch.ones(1), average=False, op=hvd.Sum, name="le8")),
        (ValueError, lambda: hvd.poll(987654)),
    ]
    for i, (exc_type, fn) in enumerate(checks):
        try:
            fn()
        except exc_type:
            pass
        else:
            raise AssertionError(f"check {i}: no {exc_type.__name__}")
    next_op_works("local")


@case
def duplicate_name_raises_at_once():
    r = hvd.rank()
    if r == 1:
        time.sleep(0.3)  # keeps the name pending on rank 0
    h = hvd.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
    if r == 0:
        try:
            hvd.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
        except ValueError:
            pass
        else:
            raise AssertionError("no ValueError for a duplicate pending name")
    same(hvd.synchronize(h), torch.full((2,), float(hvd.size())), "dup")
    next_op_works("dup")


@case
def poll_false_right_after_async():
    h = hvd.allreduce_async(torch.ones(1 << 21), name="poll")
    if hvd.poll(h):
        raise AssertionError("poll returned True right after allreduce_async of 8 MiB")
    hvd.synchronize(h)


@case
def join_contributes_zeros():
    n, r = hvd.size(), hvd.rank()
    if r == n - 1:
        last = hvd.join()
    else:
        s = mpi_ops.allreduce(torch.full((3,), float(r + 1)), op=hvd.Sum, name="join.s")
        same(s, torch.full((3,), float(sum(range(1, n)))), "sum with a joined rank")
        a = mpi_ops.allreduce(torch.full((3,), float(n)), name="join.a")
        same(a, torch.full((3,), float(n - 1)), "average divides by the full size")
        try:
            mpi_ops.broadcast(torch.ones(1), 0, name="join.b")
        except hvd.HorovodInternalError:
            pass
        else:
            raise AssertionError("broadcast succeeded while a rank had joined")
        if r == 0:
            time.sleep(0.3)
        last = hvd.join()
    if last != 0:
        raise AssertionError(f"join returned {last}, want 0 (the last rank to join)")
    next_op_works("join")


@case
def process_sets():
    n, r = hvd.size(), hvd.rank()
    sub = hvd.add_process_set([0, n - 1])
    if sub.included():
        hvd.barrier(process_set=sub)
        out = mpi_ops.allreduce(torch.full((2,), float(r)), op=hvd.Sum, process_set=sub, name="ps.ar")
        same(out, torch.full((2,), float(n - 1)), "process set allreduce")
        same(mpi_ops.allgather(torch.full((1,), r), process_set=sub, name="ps.ag"), torch.tensor([0, n - 1]),
             "process set allgather")
    else:
        try:
            hvd.allreduce_async(torch.ones(1), process_set=sub, name="ps.bad")
        except ValueError:
            pass
        else:
            raise AssertionError("a non-member could submit to the process set")
    hvd.remove_process_set(sub)
    next_op_works("ps")


@case
def grouped_and_sparse():
    n, r = hvd.size(), hvd.rank()
    xs = [data(f"gr{i}", r, (i + 2, 3)) for i in range(4)]
    red = mpi_ops.grouped_allreduce(xs, op=hvd.Sum, name="gr")
    for i, t in enumerate(red):
        same(t, sum(data(f"gr{i}", j, (i + 2, 3)) for j in range(n)), f"grouped {i}")
    gat = mpi_ops.grouped_allgather(xs, name="gg")
    for i, t in enumerate(gat):
        same(t, torch.cat([data(f"gr{i}", j, (i + 2, 3)) for j in range(n)]), f"grouped allgather {i}")
    dense = torch.zeros(n + 1, 2)
    dense[r] = r + 1.0
    got = hvd.sparse_allreduce_async(dense.to_sparse(), name="sp", op=hvd.Sum)().to_dense()
    want = torch.zeros(n + 1, 2)
    for j in range(n):
        want[j] = j + 1.0
    same(got, want, "sparse allreduce")


# ---- driver ------------------------------------------------------------------------------------------
def run_cases(result: dict) -> None:
    import hvd_cases_coord  # the coordinator's bit-vector path and execution thread

    for fn in CASES + [fn for _, fn in hvd_cases_coord.CASES]:
        try:
            fn()
            result["passed"].append(fn.__name__)
        except Exception as exc:  # noqa: BLE001 - collected for the test
            result["failed"].append({"case": fn.__name__, "error": f"{type(exc).__name__}: {exc}",
                                     "trace": traceback.format_exc()[-1500:]})


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def phase(result: dict, name: str, fn) -> None:
    try:
        fn()
        result["passed"].append(name)
    except Exception as exc:  # noqa: BLE001
        result["failed"].append({"case": name, "error": f"{type(exc).__name__}: {exc}",
                                 "trace": traceback.format_exc()[-1500:]})


def main(out: str) -> None:
    result: dict = {"passed": [], "failed": []}
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    result["rank"] = r
    run_cases(result)
    fused = fused_batch("fused")
    hvd.shutdown()

    def fusion_off():
        os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"
        hvd.init()
        try:
            for a, b in zip(fused, fused_batch("unfused")):
                same(b, a, "fusion off vs on")
            for i, t in enumerate(fused):
                dt = torch.float32 if i % 2 else torch.int64
                same(t, sum(2 * data(f"fb{i}", j, (i % 5 + 1, 3), dt) for j in range(n)), f"fused {i}")
        finally:
            hvd.shutdown()
            del os.environ["HOROVOD_FUSION_THRESHOLD"]

    def stall():
        os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"] = "0.5"
        handler = _Collect()
        logging.getLogger("ringlet.torch").addHandler(handler)
        hvd.init()
        try:
            if r == n - 1:
                time.sleep(2.0)
            mpi_ops.allreduce(torch.ones(1), name="straggler")
            if r == 0 and not any("allreduce.straggler" in m and f"missing ranks [{n - 1}]" in m
                                  for m in handler.messages):
                raise AssertionError(f"no stall warning naming the tensor and rank {n - 1}: {handler.messages}")
        finally:
            hvd.shutdown()
            logging.getLogger("ringlet.torch").removeHandler(handler)
            del os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"]

    def reinit_cycles():
        for i in range(3):
            hvd.init()
            h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum)
            if h != 1:
                raise AssertionError(f"handle counter did not restart: {h}")
            same(hvd.synchronize(h), torch.full((2,), float(n)), f"after re-init {i}")
            hvd.shutdown()

    phase(result, "fusion_off_equals_fusion_on", fusion_off)
    phase(result, "stall_warning", stall)
    phase(result, "reinit_cycles", reinit_cycles)

    # Last: the last rank leaves without shutdown; the others must get an error, not a hang.
    hvd.init()
    hvd.barrier()
    if r == n - 1:
        result["role"] = "victim"
        write(out, r, result)
        os._exit(0)
    time.sleep(0.5)
    try:
        mpi_ops.allreduce(torch.ones(2), name="after.death")
        result["failed"].append({"case": "dead_peer", "error": "no error after a peer died"})
    except hvd.HorovodInternalError:
        result["passed"].append("dead_peer")
    except Exception as exc:  # noqa: BLE001
        result["failed"].append({"case": "dead_peer", "error": f"{type(exc).__name__}: {exc}"})
    result["role"] = "survivor"
    write(out, r, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def write(out: str, r: int, result: dict) -> None:
    with open(f"{out}.rank{r}", "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
