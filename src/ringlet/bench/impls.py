"""The implementations a sweep can time, behind one shape: ``impl(collective, inp, out, inplace)``.

``ringlet:<algorithm>`` runs ringlet's collective; ``native`` runs torch.distributed's own collective
(Gloo here) and ``mpi`` mpi4py's, on the same tensors, so a table compares them side by side.
An implementation that cannot run a collective or dtype returns ``None`` from :func:`make`.

:class:`CompressedAllreduce` is the compressed all-reduce of ``--compression``: one compressor, its state
kept between calls.
"""
from __future__ import annotations

from typing import Callable

import math

import torch

import ringlet
from ringlet import compression
from ringlet.types import ReduceOp

Impl = Callable[[torch.Tensor, torch.Tensor | None, bool], torch.Tensor]

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall")
IN_PLACE = {"allreduce", "broadcast"}
# ``--compression all``: every built-in compressor at its default parameters, plain and with error feedback.
ALL_COMPRESSIONS = ("none", "fp16", "bf16", "int8", "int8+ef", "topk", "topk+ef", "powersgd")


def _ringlet(collective: str, algorithm: str, op: ReduceOp) -> Impl | None:
    if collective != "allreduce" and algorithm not in ("auto", ""):
        return None  # algorithm choice applies to all-reduce; other collectives have one schedule each

    def run(inp: torch.Tensor, out: torch.Tensor | None, inplace: bool) -> torch.Tensor:
        if collective == "allreduce":
            return (ringlet.allreduce_ if inplace else ringlet.allreduce)(inp, op=op, algorithm=algorithm)
        if collective == "broadcast":
            return (ringlet.broadcast_ if inplace else ringlet.broadcast)(inp, 0)
        if collective == "allgather":
            return ringlet.allgather(inp)
        if collective == "reduce_scatter":
            return ringlet.reduce_scatter(inp, op=op)
        if collective == "alltoall":
            return ringlet.alltoall(inp)[0]
        raise ValueError(collective)

    return run


def _native(collective: str, op: ReduceOp, dtype: torch.dtype) -> Impl | None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    ops = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.MIN: dist.ReduceOp.MIN, ReduceOp.MAX: dist.ReduceOp.MAX,
           ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT}
    if op not in ops or collective == "reduce_scatter":  # Gloo has no reduce-scatter
        return None
    if dtype == torch.int16 and collective == "allreduce":
        return None
    p = dist.get_world_size()

    def run(inp: torch.Tensor, out: torch.Tensor | None, inplace: bool) -> torch.Tensor:
        if collective == "allreduce":
            t = inp if inplace else inp.clone()
            dist.all_reduce(t, ops[op])
            return t
        if collective == "broadcast":
            t = inp if inplace else inp.clone()
            dist.broadcast(t, 0)
            return t
        if collective == "allgather":
            dist.all_gather(list(out.chunk(p)), inp)
            return out
        if collective == "alltoall":
            dist.all_to_all_single(out, inp)
            return out
        raise ValueError(collective)

    return run


def _mpi(collective: str, op: ReduceOp, dtype: torch.dtype) -> Impl | None:
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != ringlet.size() or dtype in (torch.float16, torch.bfloat16):
        return None  # not launched by mpiexec, or no MPI datatype
    ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX, ReduceOp.PRODUCT: MPI.PROD}
    if op not in ops:
        return None

    def run(inp: torch.Tensor, out: torch.Tensor | None, inplace: bool) -> torch.Tensor:
        if collective == "allreduce":
            if inplace:
                comm.Allreduce(MPI.IN_PLACE, inp.numpy(), ops[op])
                return inp
            res = torch.empty_like(inp)
            comm.Allreduce(inp.numpy(), res.numpy(), ops[op])
            return res
        if collective == "broadcast":
            t = inp if inplace else inp.clone()
            comm.Bcast(t.numpy(), root=0)
            return t
        if collective == "allgather":
            comm.Allgather(inp.numpy(), out.numpy())
            return out
        if collective == "reduce_scatter":
            comm.Reduce_scatter_block(inp.numpy(), out.numpy(), ops[op])
            return out
        if collective == "alltoall":
            comm.Alltoall(inp.numpy(), out.numpy())
            return out
        raise ValueError(collective)

    return run


def make(name: str, collective: str, op: ReduceOp, dtype: torch.dtype) -> Impl | None:
    """Build the implementation called ``name`` (``ringlet:<algo>``, ``ringlet``, ``native`` or ``mpi``)."""
    if name == "ringlet":
        return _ringlet(collective, "auto", op)
    if name.startswith("ringlet:"):
        return _ringlet(collective, name.split(":", 1)[1], op)
    if name == "native":
        return _native(collective, op, dtype)
    if name == "mpi":
        return _mpi(collective, op, dtype)
    raise ValueError(f"Unknown implementation {name!r}: use ringlet:<algorithm>, native or mpi.")


def compressions(text: str) -> tuple[str, ...]:
    """The compressors of ``--compression``: ``all`` (:data:`ALL_COMPRESSIONS`) or a comma list of names
    that :func:`ringlet.compression.get` knows, ``none`` first (the reference row) whether listed or not,
    duplicates dropped. ``ValueError`` for an unknown name, or for none at all."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("no compressor named; give a comma list (e.g. fp16,int8+ef,topk:0.01+ef) or 'all'")
    if names == ["all"]:
        names = list(ALL_COMPRESSIONS)
    for n in names:
        compression.get(n)  # ValueError naming the choices
    return tuple(dict.fromkeys(["none"] + names))


def near_square(n: int) -> tuple[int, int]:
    """``(rows, cols)`` with ``rows * cols == n`` and ``rows`` the largest divisor of ``n`` not above its
    square root: the matrix a flat buffer is viewed as for PowerSGD (a prime ``n`` gives ``1 x n``, which
    PowerSGD sums uncompressed)."""
    rows = max(1, math.isqrt(n))
    while n % rows:
        rows -= 1
    return rows, n // rows


class CompressedAllreduce:
    """The out-of-place compressed SUM all-reduce of a ``numel``-element floating buffer with the compressor
    ``name`` (``BASE[:ARG][+ef]``), over the whole world with the all-reduce ``algorithm`` (the ``sum`` and
    ``custom`` strategies' schedule; ``direct`` or else the ring for the all-gathers of the others).

    ``call(inp, check=False, state=None)`` returns a new tensor, ``inp`` untouched, like
    ``ringlet.allreduce(inp, compression=name, compression_state=self.state, algorithm=algorithm,
    check=check)``; ``state`` replaces the kept state for that call (a fresh ``{}``: one call without
    error-feedback memory). A compressor with its own schedule (``reduces_by == "custom"``: PowerSGD) gets
    the buffer viewed as one :func:`near_square` matrix (the core API hands a tensor's shape to it)."""

    def __init__(self, name: str, numel: int, algorithm: str = "ring"):
        self.name, self.algorithm = name, algorithm
        self.compressor = compression.get(name)
        self.state: dict = {}
        self.shapes = (near_square(numel),) if self.compressor.reduces_by == "custom" else None

    def __call__(self, inp: torch.Tensor, check: bool = False, state: dict | None = None) -> torch.Tensor:
        state = self.state if state is None else state
        out = inp.clone() if self.shapes is None else inp.clone().view(self.shapes[0])
        ringlet.allreduce_(out, algorithm=self.algorithm, check=check, compression=self.compressor,
                           compression_state=state)
        return out.view(-1)
