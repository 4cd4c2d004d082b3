"""join() cases of the Horovod-API job (see ``hvd_training_worker.py``).

For every rank in turn: that rank joins first, each other rank j runs j + 1 all-reduces (the joined ranks
contribute zeros) and joins after them; join() must return the last rank to join (the largest one
other than the first) everywhere. Then every
rank runs one collective of each kind (allreduce, allgather, broadcast, alltoall, reducescatter,
allgather_object), which must give the ordinary full-membership result. Each combination runs with
three kinds of names:

- ``cached``: an explicit name that already went through the response cache with every rank present;
- ``fresh``: an explicit name never used before;
- ``noname``: no name, so the op is numbered by the per-process handle counter, which the joined rank
  did not advance while the others ran their all-reduce.
"""
from __future__ import annotations

import zlib

import torch

import ringlet.torch as hvd
from ringlet.torch import mpi_ops

KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "allgather_object")
MODES = ("cached", "fresh", "noname")
MAX_WORLD = 4  # cases are generated for first-joining ranks 0..MAX_WORLD-1; ranks beyond size() skip


def ints(key: str, rank: int, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}|{rank}".encode()))
    return torch.randint(-3, 4, shape, generator=g).float()


def same(got, want, what: str) -> None:
    if not isinstance(got, torch.Tensor):
        if got != want:
            raise AssertionError(f"{what}: got {got!r}, want {want!r}")
        return
    if got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.reshape(-1)[:8].tolist()} {tuple(got.shape)}, "
                             f"want {want.reshape(-1)[:8].tolist()} {tuple(want.shape)}")


def _splits(rank: int, n: int) -> list[int]:
    return [(rank + j) % 2 + 1 for j in range(n)]


def run_kind(kind: str, name: str | None, key: str) -> None:
    """One collective of ``kind`` on every rank, checked against the result computed locally."""
    n, r = hvd.size(), hvd.rank()
    if kind == "allreduce":
        got = mpi_ops.allreduce(ints(key, r, (3, 2)), op=hvd.Sum, name=name)
        want = sum(ints(key, j, (3, 2)) for j in range(n))
    elif kind == "allgather":
        got = mpi_ops.allgather(ints(key, r, (r + 1, 2)), name=name)
        want = torch.cat([ints(key, j, (j + 1, 2)) for j in range(n)])
    elif kind == "broadcast":
        got = mpi_ops.broadcast(ints(key, r, (4,)), n - 1, name=name)
        want = ints(key, n - 1, (4,))
    elif kind == "alltoall":
        sp = [_splits(j, n) for j in range(n)]
        got, recv = mpi_ops.alltoall(ints(key, r, (sum(sp[r]), 2)), splits=sp[r], name=name)
        want = torch.cat([ints(key, j, (sum(sp[j]), 2))[sum(sp[j][:r]):sum(sp[j][:r + 1])] for j in range(n)])
        same(recv.tolist(), [sp[j][r] for j in range(n)], f"{kind} received splits")
    elif kind == "reducescatter":
        total = sum(ints(key, j, (2 * n + 1, 3)) for j in range(n))
        start = 2 * r + min(r, 1)
        got = mpi_ops.reducescatter(ints(key, r, (2 * n + 1, 3)), op=hvd.Sum, name=name)
        want = total[start:start + 2 + (1 if r < 1 else 0)]
    else:
        got = hvd.allgather_object({"rank": r, "key": key}, name=name)
        want = [{"rank": j, "key": key} for j in range(n)]
    same(got, want, f"{kind} after join")


def _join_case(kind: str, mode: str, first: int):
    def fn():
        n, r = hvd.size(), hvd.rank()
        if first >= n:
            return
        key = f"{kind}.{mode}.{first}"
        name = {"cached": f"jc.{kind}", "fresh": f"jf.{key}", "noname": None}[mode]
        pre = [{"cached": f"jc.pre{i}", "fresh": f"jf.pre{i}.{key}", "noname": None}[mode] for i in range(n)]
        # Rank j != first runs j + 1 all-reduces before joining: the later ones run with more ranks joined,
        # and the largest rank other than `first` is the last to join.
        ops = [0 if j == first else j + 1 for j in range(n)]
        if mode == "cached":  # every name goes through the response cache with every rank present
            for i in range(n):
                mpi_ops.allreduce(torch.ones(2), op=hvd.Sum, name=pre[i])
            run_kind(kind, name, f"warm.{key}")
        for i in range(ops[r]):
            got = mpi_ops.allreduce(torch.full((2,), float(r + 1)), op=hvd.Sum, name=pre[i])
            same(got, torch.full((2,), float(sum(j + 1 for j in range(n) if ops[j] > i))),
                 f"allreduce {i} with ranks {[j for j in range(n) if ops[j] <= i]} joined (they contribute zeros)")
        last = hvd.join()
        if n > 1 and last != max(j for j in range(n) if j != first):
            raise AssertionError(f"join() returned {last}; rank {first} joined first, the largest other rank last")
        run_kind(kind, name, key)

    return fn


CASES = [(f"join_first{first}_then_{kind}_{mode}", _join_case(kind, mode, first))
         for first in range(MAX_WORLD) for kind in KINDS for mode in MODES]
