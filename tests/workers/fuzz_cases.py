"""Fuzz cases for ringlet's core API (``ringlet.allreduce`` ... ``ringlet.barrier``, sub-groups), shared by
the in-process fuzz (tests/unit/test_fuzz_core.py) and the real-process one (tests/workers/fuzz_worker.py).

A :class:`Case` holds every rank's arguments, drawn through a :class:`Draw` (hypothesis' ``data`` in the
unit tests, a ``random.Random`` of a seed shared by the ranks in the real-process job), so every rank
can rebuild every rank's input and compute the reference with plain torch. Faults make a case unclean:
*local* ones (an unsupported dtype, a strided view, a ``meta`` tensor, a bad op, algorithm, root, scale
factor or splits, a non-tensor) and *cross-rank* ones (some ranks with another shape, dtype, op,
algorithm, root, scale factor or collective, or not calling at all). :func:`judge` states the property:
in a clean case every calling rank returns the reference (NaN positions included); in an unclean one
every calling rank raises a clear exception (a ringlet error, or ValueError/TypeError/NotImplementedError
with a message; a rank with a local fault one of the latter), none returns.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field, replace

import torch

import ringlet
from ringlet.algorithms import reference
from ringlet.types import SUPPORTED_DTYPES, ReduceOp, RingletError

KINDS = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "barrier")
REDUCING = ("allreduce", "reduce", "reduce_scatter")
FORMS = {"allreduce": ("sync", "async", "inplace", "async_inplace"), "broadcast": ("sync", "async", "inplace",
         "async_inplace"), "reduce": ("sync", "async", "inplace", "async_inplace"), "allgather": ("sync", "async"),
         "reduce_scatter": ("sync", "async"), "alltoall": ("sync", "async"), "barrier": ("sync", "async")}
# Spellings of the same op, the same algorithm: a case stays clean when ranks spell them differently.
OP_SPELLINGS = {ReduceOp.SUM: (ReduceOp.SUM, "sum", 1, " Sum"), ReduceOp.AVG: (ReduceOp.AVG, "avg", "mean", 0),
                ReduceOp.MIN: (ReduceOp.MIN, "min"), ReduceOp.MAX: (ReduceOp.MAX, "MAX"),
                ReduceOp.PRODUCT: (ReduceOp.PRODUCT, "product", "prod")}
ALGO_SPELLINGS = {"auto": ("auto", None, "", "AUTO"), "ring": ("ring", " Ring"), "tree": ("tree", "dbtree"),
                  "halving_doubling": ("halving_doubling", "hd", "rabenseifner"),
                  "recursive_doubling": ("recursive_doubling", "rd"), "direct": ("direct", "two_shot"),
                  "torus": ("torus", "2d_torus"), "hierarchical": ("hierarchical", "hier")}
GATHER_SPELLINGS = {"ring": ("ring", None, "auto", "Ring"), "direct": ("direct", "DIRECT")}
BAD_DTYPES = (torch.bool, torch.complex64, torch.complex128, torch.uint16, torch.uint32)
BAD_OPS = ("nope", 17, None, 2.5, ReduceOp.ADASUM)
BAD_ALGOS = ("nope", 3, b"ring", "native?")
BAD_SCALES = ("x", None, 1j, [1.0])
DIMS = (0, 1, 2, 3, 5, 7, 13)
LARGE = (1009, 65537, 262147)
LOCAL_ERRORS = (ValueError, TypeError, NotImplementedError)


class Draw:
    """Where a case's choices come from: ``int(lo, hi)`` (inclusive), ``pick(seq)``, ``chance(n, d)``."""

    def int(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def pick(self, seq):
        return seq[self.int(0, len(seq) - 1)]

    def chance(self, n: int, d: int) -> bool:
        return self.int(0, d - 1) < n


class RandomDraw(Draw):
    """Choices from ``random.Random(seed)``: the same case on every rank that uses the same seed."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


@dataclass(frozen=True)
class Call:
    """One rank's call. ``layout``: contiguous, transposed, strided, expanded, meta, notensor, or
    group_bad (a valid tensor, but a string for ``group``); ``calls``: False for a rank that sits out."""

    kind: str
    form: str = "sync"
    shape: tuple = (3,)
    dtype: object = torch.float32
    layout: str = "contiguous"
    op: object = ReduceOp.SUM
    algorithm: object = "auto"
    root: object = 0
    pre: object = 1.0
    post: object = 1.0
    splits: object = None
    calls: bool = True


@dataclass(frozen=True)
class Case:
    p: int
    seed: int
    members: tuple[int, ...]
    group: bool
    specials: bool
    calls: tuple[Call, ...]
    faults: tuple[str, ...] = ()
    local: frozenset = field(default_factory=frozenset)  # ranks given a local fault

    @property
    def clean(self) -> bool:
        return not self.faults


# ---- drawing --------------------------------------------------------------------------------------------
def _shape(d: Draw, kind: str, n: int) -> tuple:
    if kind in ("allreduce", "broadcast", "allgather") and n <= 4 and d.chance(1, 20):
        return (d.pick(LARGE),)
    if d.chance(1, 25):
        return (1,) * 15 + (2, 3)  # more dimensions than a metadata record holds
    nd = d.int(0 if kind not in ("reduce_scatter", "alltoall") else 1, 3)
    return tuple(d.pick(DIMS) for _ in range(nd))


def _scales(d: Draw, dtype, op) -> tuple[float, float]:
    if not dtype.is_floating_point:
        if op == ReduceOp.PRODUCT:
            return 1.0, 1.0
        pool = (1.0, 0.5, 2.0) if dtype == torch.uint8 else (1.0, 0.5, 2.0, -1.0)
    else:
        pool = (1.0, 0.5, 2.0, -1.0, 0.25, 4.0, float("nan"), float("inf"))
    return d.pick(pool), d.pick(pool)


def draw_case(d: Draw, p: int, *, faults: bool = True, partial: bool = True,
              algos: tuple = tuple(ALGO_SPELLINGS)) -> Case:
    """A case on ``p`` ranks; ``faults``: may break it (about half the cases); ``partial``: local faults
    may hit some members only and members may sit out, which leaves the others to time out (off for
    transports where a timeout ends the job: Gloo closes the connection); ``algos``: the canonical
    all-reduce algorithms to draw from (``"native"`` only where the transport has one)."""
    kind = d.pick(KINDS)
    group = p >= 2 and d.chance(1, 4)
    members = tuple(sorted({d.int(0, p - 1) for _ in range(d.int(1, p))})) if group else tuple(range(p))
    n = len(members)
    dtype = d.pick(SUPPORTED_DTYPES)
    op = d.pick(tuple(OP_SPELLINGS)) if kind in REDUCING else ReduceOp.SUM
    pre, post = _scales(d, dtype, op) if kind in ("allreduce", "reduce_scatter") else (1.0, 1.0)
    algo = d.pick(algos) if kind == "allreduce" else d.pick(tuple(GATHER_SPELLINGS)) if kind == "allgather" else "auto"
    shape = _shape(d, kind, n)
    root = d.pick(members)
    calls = []
    for r in range(p):
        if r not in members:
            calls.append(Call(kind, calls=False))
            continue
        spell = OP_SPELLINGS[op] if kind in REDUCING else (op,)
        algos_of = ALGO_SPELLINGS if kind == "allreduce" else GATHER_SPELLINGS
        c = Call(kind, d.pick(FORMS[kind]), shape, dtype, "contiguous", d.pick(spell),
                 d.pick(algos_of.get(algo, (algo,))), root, pre, post)
        if kind == "allgather" and len(shape) >= 1:
            c = replace(c, shape=(d.pick(DIMS),) + shape[1:])
        if kind == "alltoall":
            sp = [d.int(0, 3) for _ in range(n)]
            c = replace(c, shape=(sum(sp),) + shape[1:], splits=sp if d.chance(3, 4) or len(set(sp)) > 1 else None)
            if c.splits is None and c.shape[0] % n:
                c = replace(c, splits=sp)
        calls.append(c)
    case = Case(p, d.int(0, 2 ** 31 - 1), members, group, dtype.is_floating_point and d.chance(1, 3), tuple(calls))
    if faults and d.chance(1, 2):
        case = add_fault(d, case, partial=partial)
        if d.chance(1, 3):  # a second fault: a local one, so that it cannot undo the first
            case = add_fault(d, case, local_only=True, partial=partial)
    return case


# ---- faults ---------------------------------------------------------------------------------------------
def _who(d: Draw, case: Case) -> list[int]:
    """All members (a third of the time) or a non-empty subset of them."""
    if len(case.members) == 1 or d.chance(1, 3):
        return list(case.members)
    return sorted({d.pick(case.members) for _ in range(d.int(1, len(case.members) - 1))})


def _noncontiguous_layouts(shape: tuple) -> list[str]:
    n = 1
    for s in shape:
        n *= s
    if n == 0 or not shape:
        return []
    out = []
    if len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1:
        out.append("transposed")
    if shape[0] > 1:
        out.append("strided")
    if any(s > 1 for s in shape):
        out.append("expanded")
    return out


def _other(d: Draw, current, pool):
    choices = [x for x in pool if x != current]
    return d.pick(choices)


def _local_fault(d: Draw, kind: str, c: Call, case: Case) -> tuple[str, Call]:
    names = ["dtype_bad", "layout", "meta", "notensor"]
    names += ["op_bad"] if kind in REDUCING else []
    names += ["algo_bad"] if kind in ("allreduce", "allgather") else []
    names += ["root_bad"] if kind in ("broadcast", "reduce") else []
    names += ["scale_bad"] if kind in ("allreduce", "reduce_scatter") else []
    names += ["splits_bad"] if kind == "alltoall" else []
    names += ["scalar"] if kind in ("reduce_scatter", "alltoall") else []
    if kind == "barrier":
        return "group_bad", replace(c, layout="group_bad")
    name = d.pick(names)
    if name == "layout":
        layouts = _noncontiguous_layouts(c.shape)
        return (name, replace(c, layout=d.pick(layouts))) if layouts else ("meta", replace(c, layout="meta"))
    if name in ("meta", "notensor"):
        return name, replace(c, layout=name)
    if name == "dtype_bad":
        return name, replace(c, dtype=d.pick(BAD_DTYPES))
    if name == "op_bad":
        return name, replace(c, op=d.pick(BAD_OPS))
    if name == "algo_bad":
        return name, replace(c, algorithm=d.pick(BAD_ALGOS))
    if name == "root_bad":
        outside = [r for r in range(case.p + 1) if r not in case.members]
        return name, replace(c, root=d.pick(outside + [-1, 1.0, "0", True, None]))
    if name == "scale_bad":
        return name, replace(c, **{d.pick(("pre", "post")): d.pick(BAD_SCALES)})
    if name == "scalar" or not c.shape:  # splits_bad on a call already 0-d (a second fault): scalar
        return "scalar", replace(c, shape=(), splits=None)
    n = len(case.members)
    sp = list(c.splits) if c.splits is not None else [c.shape[0] // n] * n
    bad = d.pick(("short", "negative", "sum", "float"))
    sp = (sp[:-1] if bad == "short" else [-1] + sp[1:] if bad == "negative" else sp[:-1] + [sp[-1] + 1]
          if bad == "sum" else [s + 0.5 for s in sp])
    return name, replace(c, splits=sp)


def _cross_fault(d: Draw, kind: str, c: Call, case: Case, name: str) -> Call:
    if name == "shape":
        if len(c.shape) == 17:
            return replace(c, shape=c.shape[:15] + c.shape[15:][::-1])
        if kind in ("allgather", "alltoall") and c.shape:
            return replace(c, shape=c.shape + (2,))
        return replace(c, shape=c.shape[:-1] + (c.shape[-1] + 1,) if c.shape else (1,))
    if name == "dtype":
        return replace(c, dtype=_other(d, c.dtype, SUPPORTED_DTYPES))
    if name == "op":
        return replace(c, op=_other(d, ReduceOp.parse(c.op), tuple(OP_SPELLINGS)))
    if name == "algo":
        pool = ALGO_SPELLINGS if kind == "allreduce" else GATHER_SPELLINGS
        canon = next((k for k, v in pool.items() if c.algorithm in v), c.algorithm)
        return replace(c, algorithm=_other(d, canon, tuple(pool)))
    if name == "root":
        return replace(c, root=_other(d, c.root, case.members))
    if name == "scale":
        which = d.pick(("pre", "post"))
        return replace(c, **{which: -2.0 * abs(getattr(c, which)) if getattr(c, which) == getattr(c, which) else 1.0})
    if name == "kind":
        k, shape = _other(d, kind, KINDS), c.shape or (1,)
        splits = [shape[0]] + [0] * (len(case.members) - 1) if k == "alltoall" else None  # valid here
        return replace(c, kind=k, form="sync", shape=shape, splits=splits, op=ReduceOp.SUM,
                       algorithm="auto", pre=1.0, post=1.0)
    return replace(c, calls=False)  # "skip"


def add_fault(d: Draw, case: Case, *, local_only: bool = False, partial: bool = True) -> Case:
    """``case`` with one more fault on some members: a local one, or (unless ``local_only``) a cross-rank
    difference. ``partial``: see :func:`draw_case`."""
    kind = case.calls[case.members[0]].kind
    cross = ["kind"] + (["shape", "dtype"] if kind != "barrier" else [])
    cross += ["op"] if kind in REDUCING else []
    cross += ["algo"] if kind in ("allreduce", "allgather") and len(case.members) > 1 else []
    cross += ["root"] if kind in ("broadcast", "reduce") and len(case.members) > 1 else []
    cross += ["scale"] if kind in ("allreduce", "reduce_scatter") else []
    cross += ["skip"] if partial and len(case.members) > 1 and d.chance(1, 4) else []
    local = d.chance(1, 2)
    if len(case.members) == 1 or local_only:
        local = True
    name = "local" if local else d.pick(cross)
    who = _who(d, case) if partial or not local else list(case.members)
    if not local and len(who) == len(case.members):
        who = who[:-1]  # a cross-rank difference needs a rank that keeps the original
    calls, local_ranks, labels = list(case.calls), set(case.local), []
    for r in who:
        if local:
            label, calls[r] = _local_fault(d, calls[r].kind, calls[r], case)
            local_ranks.add(r)
        else:
            label, calls[r] = name, _cross_fault(d, kind, calls[r], case, name)
        labels.append(f"{label}@{r}")
    return replace(case, calls=tuple(calls), faults=case.faults + tuple(labels), local=frozenset(local_ranks))
