"""The soak's plan: which collective runs at each step, on which group, with what data, and what every
member must get back (:mod:`soak`).

Every rank builds the same :class:`OpSpec` for step ``i`` from a generator seeded by ``(seed, i)``, so
the plan needs no communication. A step's data are ``x_r = a_r * B + c_r`` for member ``r``: one base
tensor ``B`` of small integers (seeded by the step) and two small integer coefficients per member. Every
value and every reduction of them is an integer well inside the range each dtype holds exactly, so sums,
minima, maxima and products have one right answer, computable locally in closed form (``A * B + C``)
without generating the other members' tensors. Averages of floating tensors are the one inexact result;
they are checked within a rounding tolerance.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from ringlet import ReduceOp, algorithms

KINDS = ("allreduce", "allgather", "broadcast", "reduce", "reduce_scatter", "alltoall", "barrier")
KIND_WEIGHTS = (34, 13, 10, 8, 13, 13, 9)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
DTYPE_WEIGHTS = {torch.float32: 8, torch.float64: 2, torch.float16: 2, torch.bfloat16: 2, torch.int8: 1,
                 torch.uint8: 1, torch.int16: 1, torch.int32: 1, torch.int64: 1}
REDUCTIONS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)
PRODUCT_VALUES = (-2.0, -1.0, 1.0, 2.0)  # |B| ** 8 <= 256: exact in every floating dtype
PRODUCT_MAX_ELEMS = 1 << 16
NATIVE_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
                           torch.int32, torch.int64})  # what Gloo's own all-reduce takes
WIDTHS = (1, 1, 3, 16, 61, 256)


@dataclass(frozen=True)
class SizeDraw:
    """How big the steps are: log-uniform bytes in ``[1, max_bytes]``, a ``large_share`` of steps
    uniform in ``[max_bytes / 2, max_bytes]``, and an ``empty_share`` of steps with no elements."""

    max_bytes: int
    large_share: float = 0.15
    empty_share: float = 0.02

    def nbytes(self, rng: random.Random) -> int:
        u = rng.random()
        if u < self.empty_share:
            return 0
        if u < self.empty_share + self.large_share:
            return rng.randint(self.max_bytes // 2, self.max_bytes)
        return int(math.exp(rng.uniform(0.0, math.log(self.max_bytes))))


@dataclass(frozen=True)
class Groups:
    """The soak's groups as sorted global-rank tuples (``ringlet.new_group`` orders members by rank), in
    creation order: the world, the even ranks, the first two ranks with the last one, and the upper half
    plus one (an odd size for 8 ranks)."""

    members: tuple[tuple[int, ...], ...]

    @staticmethod
    def for_world(p: int) -> "Groups":
        out = [tuple(range(p))]
        if p >= 4:
            out.append(tuple(range(0, p, 2)))
        if p >= 3:
            out.append((0, 1, p - 1))
            out.append(tuple(range(max(p // 2 - 1, 0), p)))
        return Groups(tuple(out))

    def pick(self, rng: random.Random) -> int:
        """Group index: the world 40% of the time, each sub-group alike otherwise."""
        if len(self.members) == 1 or rng.random() < 0.4:
            return 0
        return rng.randrange(1, len(self.members))


@dataclass(frozen=True)
class OpSpec:
    """Step ``index``: ``kind`` over group ``group`` (global ranks ``members``) on tensors of ``dtype``.

    Member ``j`` (group order) holds ``a[j] * B[:rows[j]] + c[j]`` shaped ``(rows[j], width)`` (1-D when
    ``width`` is 0); ``B`` has ``max(rows)`` rows. ``splits[j][k]``: rows member ``j`` sends member ``k``
    (alltoall). ``root``: a global rank (broadcast, reduce). ``algorithm``: all-reduce or all-gather
    algorithm name; ``post``: the all-reduce's postscale factor; ``given_sizes``: all-gather passes
    ``sizes=``."""

    index: int
    seed: int
    kind: str
    group: int
    members: tuple[int, ...]
    dtype: torch.dtype
    width: int
    rows: tuple[int, ...]
    a: tuple[int, ...]
    c: tuple[int, ...]
    op: ReduceOp = ReduceOp.SUM
    algorithm: str = "auto"
    root: int = 0
    post: float = 1.0
    splits: tuple[tuple[int, ...], ...] = ()
    given_sizes: bool = False

    @property
    def shape_rows(self) -> int:
        return max(self.rows) if self.rows else 0

    def elems(self, j: int) -> int:
        return self.rows[j] * max(self.width, 1)

    def nbytes(self, j: int) -> int:
        return self.elems(j) * torch.empty((), dtype=self.dtype).element_size()


def op_rng(seed: int, index: int) -> random.Random:
    return random.Random(seed * 1_000_003 + index)


def _dtype(rng: random.Random, kind: str, op: ReduceOp) -> torch.dtype:
    pool = FLOATS if op == ReduceOp.PRODUCT else tuple(DTYPE_WEIGHTS)
    return rng.choices(pool, weights=[DTYPE_WEIGHTS[d] for d in pool])[0]


def _coefficients(rng: random.Random, p: int, dtype: torch.dtype, op: ReduceOp) -> tuple[tuple, tuple]:
    """Per-member ``a`` and ``c``: with ``|B| <= 4`` every value stays within 11 and any sum over 8
    members within 88 (int8, uint8 and bfloat16 hold it exactly)."""
    if op == ReduceOp.PRODUCT:
        return tuple(rng.choice((-1, 1)) for _ in range(p)), (0,) * p
    if op in (ReduceOp.MIN, ReduceOp.MAX):
        a = (1,) * p
    else:
        a = tuple(rng.choice((1, 2) if dtype == torch.uint8 else (-1, 1, 2)) for _ in range(p))
    lo = 0 if dtype == torch.uint8 else -3
    return a, tuple(rng.randint(lo, 3) for _ in range(p))


def _rows_for(kind: str, rng: random.Random, p: int, total_rows: int) -> tuple[tuple, tuple]:
    """Rows per member and the alltoall splits, for about ``total_rows`` rows per member."""
    if kind == "allgather":  # ragged: output is the sum of all members' rows
        cap = max(total_rows // p, 0)
        return tuple(rng.randint(0, cap) for _ in range(p)), ()
    if kind == "alltoall":
        cap = max(total_rows // p, 0)
        splits = tuple(tuple(rng.randint(0, cap) for _ in range(p)) for _ in range(p))
        return tuple(sum(s) for s in splits), splits
    return (total_rows,) * p, ()


def _algorithm(rng: random.Random, kind: str, dtype: torch.dtype, native: bool) -> str:
    if kind == "allgather":
        return rng.choice(("ring", "direct", "auto"))
    if kind != "allreduce":
        return "auto"
    names = [n for n in algorithms.allreduce_names() if n != algorithms.NATIVE]
    if native and dtype in NATIVE_DTYPES:
        names.append(algorithms.NATIVE)
    return rng.choice(names + ["auto"])


def make_spec(index: int, seed: int, groups: Groups, sizes: SizeDraw, native: bool) -> OpSpec:
    """Step ``index`` of the plan (identical on every rank). ``native``: the transport has an all-reduce
    of its own, which then is one of the algorithms drawn."""
    rng = op_rng(seed, index)
    kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
    g = groups.pick(rng)
    members = groups.members[g]
    p = len(members)
    op = rng.choice(REDUCTIONS) if kind in ("allreduce", "reduce", "reduce_scatter") else ReduceOp.SUM
    dtype = _dtype(rng, kind, op)
    itemsize = torch.empty((), dtype=dtype).element_size()
    width = 0 if kind in ("allreduce", "broadcast", "reduce") and rng.random() < 0.5 else rng.choice(WIDTHS)
    elems = sizes.nbytes(rng) // itemsize
    if op == ReduceOp.PRODUCT:
        elems = min(elems, PRODUCT_MAX_ELEMS)
    if kind == "barrier":
        elems = 0
    rows, splits = _rows_for(kind, rng, p, elems // max(width, 1))
    a, c = _coefficients(rng, p, dtype, op)
    post = rng.choice((1.0, 1.0, 0.5, 2.0)) if kind == "allreduce" and dtype in FLOATS and op != ReduceOp.PRODUCT \
        else 1.0
    algorithm = _algorithm(rng, kind, dtype, native)
    root = rng.choice(members)
    return OpSpec(index=index, seed=seed, kind=kind, group=g, members=members, dtype=dtype, width=width,
                  rows=rows, a=a, c=c, op=op, algorithm=algorithm, root=root, post=post, splits=splits,
                  given_sizes=kind == "allgather" and rng.random() < 0.3)


# ---- data and references --------------------------------------------------------------------------
def base(spec: OpSpec) -> torch.Tensor:
    """``B``: ``(max rows, width)`` small integers in ``spec.dtype`` (non-negative for uint8; from
    :data:`PRODUCT_VALUES` for products)."""
    gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + spec.index)
    shape = (spec.shape_rows, spec.width) if spec.width else (spec.shape_rows,)
    if spec.op == ReduceOp.PRODUCT:
        idx = torch.randint(0, 4, shape, generator=gen, dtype=torch.int64)
        return torch.tensor(PRODUCT_VALUES, dtype=spec.dtype)[idx]
    lo = 0 if spec.dtype == torch.uint8 else -4
    return torch.randint(lo, 5, shape, generator=gen, dtype=torch.int16).to(spec.dtype)


def member_input(spec: OpSpec, b: torch.Tensor, j: int) -> torch.Tensor:
    """Member ``j``'s tensor ``a[j] * B[:rows[j]] + c[j]`` (a fresh tensor)."""
    return b[:spec.rows[j]].mul(spec.a[j]).add_(spec.c[j])


def reduced(spec: OpSpec, b: torch.Tensor) -> torch.Tensor:
    """The reduction ``spec.op`` over all members of their full tensors, times ``spec.post``."""
    p = len(spec.members)
    if spec.op == ReduceOp.PRODUCT:
        sign = math.prod(spec.a)
        return b.pow(p).mul_(sign)
    if spec.op in (ReduceOp.MIN, ReduceOp.MAX):
        total = b + (min if spec.op == ReduceOp.MIN else max)(spec.c)
    else:
        total = b.mul(sum(spec.a)).add_(sum(spec.c))
    if spec.op == ReduceOp.AVG:
        avg = total.double() / p
        total = (avg if spec.dtype in FLOATS else avg.trunc()).to(spec.dtype)
    if spec.post != 1.0:
        total = total.mul_(spec.post)
    return total


def scatter_slice(rows: int, p: int, j: int) -> slice:
    """Member ``j``'s rows of a reduce-scatter of ``rows`` rows: the first ``rows % p`` members get one extra."""
    q, r = divmod(rows, p)
    start = j * q + min(j, r)
    return slice(start, start + q + (1 if j < r else 0))


def gathered(spec: OpSpec, b: torch.Tensor) -> torch.Tensor:
    return torch.cat([member_input(spec, b, j) for j in range(len(spec.members))])


def alltoall_received(spec: OpSpec, b: torch.Tensor, k: int) -> tuple[torch.Tensor, list[int]]:
    """What member ``k`` receives: from every member ``j`` in order, its block ``k``."""
    parts = []
    for j, row in enumerate(spec.splits):
        start = sum(row[:k])
        parts.append(b[start:start + row[k]].mul(spec.a[j]).add_(spec.c[j]))
    return torch.cat(parts), [row[k] for row in spec.splits]
