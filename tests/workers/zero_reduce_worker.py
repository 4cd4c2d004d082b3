"""One rank of the ZeRO reducers' job (4 ranks):

    ringlet run -np 4 --transport T -- python tests/workers/zero_reduce_worker.py OUT.json

Cases, in order (inputs and references from tests/workers/zero_reduce_cases.py: every rank can make every
rank's bucket, so each checks its block against the exact average):

* ``compressed_lossless``: ``CompressedReducer`` with ``none``: the exact average, for float32, float16,
  bfloat16, ragged counts with an empty block, 0, 1 and 1009 elements;
* ``compressed_lossy``: ``fp16``, ``int8+ef``, ``topk:0.1+ef`` over five steps: each step's error within
  the compressor's bound, error feedback's sum over steps within the last residuals of the exact sum,
  and after the exact all-gather every rank holds bitwise the same bucket;
* ``hierarchical``: ``HierarchicalReducer(host_of=(0, 0, 1, 1))``: the exact average in every dtype,
  both replicas of a block bitwise identical, the all-gather within the host;
* ``hierarchical_compressed``: the same with ``int8+ef`` across hosts;
* ``unequal_hosts``: ``host_of=(0, 0, 0, 1)`` raises ``ValueError`` on every rank (and nothing hangs);
* ``coordinated``: with ``ringlet.torch`` initialised ``CompressedReducer`` still gives the exact
  average (its jobs run on the core queue beside the coordinator) and ``HierarchicalReducer`` raises
  ``TypeError`` for a Comm scheduled by the name-matched coordinator.
"""
from __future__ import annotations

import sys

import torch
from case_harness import check, identical_across_ranks, worker_main

from zero_reduce_cases import DTYPES, average, block_of, bucket, counts_of

import ringlet
from ringlet.torch.comm import Comm
from ringlet.torch.name_matched import NAME_MATCHED
from ringlet.torch.training.zero.reduce_compressed import CompressedReducer
from ringlet.torch.training.zero.reduce_hierarchical import HierarchicalReducer

HOSTS = (0, 0, 1, 1)
BOUND = {"fp16": 2.0 ** -11, "int8+ef": 1 / 254, "topk:0.1+ef": 1.0}


def reduce_and_gather(red, rank, world, n, counts, dtype, *, step=0, exact=True, state=None):
    """This rank's reduced block, the gathered bucket and the exact average of every rank's bucket."""
    flat = bucket(rank, n, dtype, step, exact)
    block = red.reduce_scatter_(flat, counts, f"b{n}", state, check=True).wait().clone()
    out = torch.zeros(n, dtype=dtype)
    block_of(out, counts, red.shard_rank).copy_(block)
    red.allgather_(out, counts, f"b{n}", check=True).wait()
    return block, out, average([bucket(r, n, dtype, step, exact) for r in range(world)])


def others_residuals(state, counts, rank, world):
    """The sum of the residuals that the other ranks keep for this rank's block (float64)."""
    mine = torch.zeros(sum(counts), dtype=torch.float64)
    for d in range(world):
        if d != rank and counts[d]:
            block_of(mine, counts, d).copy_(state[("rs", d)]["residual"])
    rows = ringlet.allgather(mine.unsqueeze(0))
    return block_of(rows.sum(0), counts, rank)


def case_compressed_lossless(rank, world):
    def run(numbers):
        red = CompressedReducer(Comm(), "none")
        for dtype in DTYPES:
            for n, cut in ((0, "even"), (1, "even"), (1009, "ragged"), (5, "ragged")):
                counts = counts_of(n, world, cut)
                block, out, avg = reduce_and_gather(red, rank, world, n, counts, dtype)
                check(torch.equal(block, block_of(avg, counts, rank).float().to(dtype)), f"{dtype} {n}: block")
                check(torch.equal(out, avg.float().to(dtype)), f"{dtype} {n}: gathered")
    return run


def case_compressed_lossy(rank, world):
    def run(numbers):
        n, steps = 1009, 5
        counts = counts_of(n, world, "ragged")
        for name, bound in BOUND.items():
            red, state, total, exact_total = CompressedReducer(Comm(), name), {}, 0, 0
            for step in range(steps):
                block, out, avg = reduce_and_gather(red, rank, world, n, counts, torch.float32, step=step,
                                                    exact=False, state=state)
                ref = block_of(avg, counts, rank)
                err = float((block.double() - ref).abs().max()) if ref.numel() else 0.0
                scale = max((float(block_of(bucket(r, n, torch.float32, step, False), counts, rank).abs().max())
                             for r in range(world)), default=0.0) if ref.numel() else 0.0
                check(err <= bound * 4 * scale + 1e-6 or name.startswith("topk"), f"{name}: error {err}")
                check(identical_across_ranks([out]), f"{name}: gathered buckets differ")
                total, exact_total = total + block.double(), exact_total + ref
            drift = float((total - exact_total).abs().max()) if counts[rank] else 0.0
            numbers[f"drift_{name}"] = max(numbers.get(f"drift_{name}", 0.0), drift)
            if name.endswith("+ef"):  # the sum over steps is the exact sum less the others' last residuals
                kept = others_residuals(state, counts, rank, world)
                miss = float((total - (exact_total - kept / world)).abs().max()) if counts[rank] else 0.0
                check(miss <= 1e-5, f"{name}: the sum over steps is off the telescoped sum by {miss}")
    return run


def case_hierarchical(rank, world, compression=None):
    def run(numbers):
        red = HierarchicalReducer(host_of=HOSTS, compression=compression)
        check((red.world, red.shard_size, red.shard_rank) == (4, 2, rank % 2), "reducer facts")
        dtypes = DTYPES if compression is None else (torch.float32,)
        for dtype in dtypes:
            for n, cut in ((0, "even"), (1, "even"), (13, "ragged"), (1009, "even")):
                counts = counts_of(n, red.shard_size, cut)
                block, out, avg = reduce_and_gather(red, rank, world, n, counts, dtype, exact=compression is None,
                                                    state={})
                mine = block_of(avg, counts, red.shard_rank).float().to(dtype)
                placed = torch.zeros(n, dtype=torch.float64)
                block_of(placed, counts, red.shard_rank).copy_(block)
                replicas = ringlet.allgather(placed.unsqueeze(0)) if n else None
                check(n == 0 or torch.equal(replicas[rank], replicas[(rank + 2) % 4]), f"{dtype} {n}: replicas")
                if compression is None:
                    check(torch.equal(block, mine), f"{dtype} {n}: block")
                    check(torch.equal(out, avg.float().to(dtype)), f"{dtype} {n}: gathered")
                elif n:
                    err = float((block.double() - mine.double()).abs().max()) if mine.numel() else 0.0
                    check(err <= float(avg.abs().max()) / 50, f"{n}: compressed error {err}")
    return run


def case_unequal_hosts(rank, world):
    def run(numbers):
        try:
            HierarchicalReducer(host_of=(0, 0, 0, 1))
            check(False, "unequal hosts were accepted")
        except ValueError as err:
            check("same number of ranks" in str(err), str(err))
        ringlet.barrier()
    return run


def case_coordinated(rank, world):
    def run(numbers):
        import ringlet.torch as hvd

        hvd.init()
        red = CompressedReducer(Comm(), "none")
        counts = counts_of(101, world, "ragged")
        block, out, avg = reduce_and_gather(red, rank, world, 101, counts, torch.float32, state={})
        check(torch.equal(out, avg.float()), "CompressedReducer under the coordinator")
        try:
            HierarchicalReducer(Comm(scheduler=NAME_MATCHED), host_of=HOSTS)
            check(False, "HierarchicalReducer under the coordinator did not raise")
        except TypeError as err:
            check("name-matched" in str(err), str(err))
    return run


def make_cases(rank, world):
    return [("compressed_lossless", case_compressed_lossless(rank, world)),
            ("compressed_lossy", case_compressed_lossy(rank, world)),
            ("hierarchical", case_hierarchical(rank, world)),
            ("hierarchical_compressed", case_hierarchical(rank, world, "int8+ef")),
            ("unequal_hosts", case_unequal_hosts(rank, world)), ("coordinated", case_coordinated(rank, world))]


if __name__ == "__main__":
    sys.exit(worker_main(make_cases))
