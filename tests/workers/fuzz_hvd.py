"""Fuzz cases for the Horovod facade (``ringlet.torch``): allreduce (blocking, async, in place), grouped
allreduce, allgather, grouped allgather, broadcast (and in place), alltoall, reducescatter and grouped
reducescatter, with names (none, empty, Unicode, long, NUL, unencodable, too long) and the faults of
:mod:`fuzz_cases` (local ones, and cross-rank shape, dtype, op, root, name and op-kind differences, ranks
sitting out).

Ops are matched by name, so a rank that never submits a name (it sits out, uses another name, or its
call failed locally) leaves the others waiting: the fuzz runs with ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``
set, under which that ends in ``HorovodInternalError`` on every rank. The property is that of
:func:`fuzz_run.judge`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from fuzz_cases import BAD_DTYPES, BAD_SCALES, DIMS, LOCAL_ERRORS, Draw, _noncontiguous_layouts, _other, _who
from fuzz_run import numel, same

import ringlet.torch as hvd
from ringlet.algorithms import reference
from ringlet.engine.ops import split_rows
from ringlet.types import ReduceOp, RingletError

REDUCE_DTYPES = (torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64)
MOVE_DTYPES = REDUCE_DTYPES + (torch.uint8, torch.int8, torch.int16)
KINDS = ("allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
         "reducescatter", "grouped_reducescatter")
REDUCING = ("allreduce", "grouped_allreduce", "reducescatter", "grouped_reducescatter")
NAMES = (None, "", "x", "grad/layer.0", "ü名前🙂", "n" * 1000, "a\0b")
BAD_NAMES = ("\udcff", "x" * 70000)


@dataclass(frozen=True)
class HCall:
    kind: str
    form: str = "sync"  # sync, async, inplace (allreduce_, broadcast_)
    shapes: tuple = ((3,),)
    dtype: object = torch.float32
    layout: str = "contiguous"
    op: object = None
    root: object = 0
    pre: object = 1.0
    post: object = 1.0
    splits: object = None
    name: object = None
    calls: bool = True


@dataclass(frozen=True)
class HCase:
    p: int
    seed: int
    specials: bool
    calls: tuple
    faults: tuple = ()
    local: frozenset = frozenset()

    @property
    def clean(self) -> bool:
        return not self.faults

    @property
    def members(self) -> tuple:
        return tuple(range(self.p))


def _op(kind: str, op):
    return ReduceOp.AVG if op is None else ReduceOp.parse(op)


def draw_hcase(d: Draw, p: int, *, faults: bool = True) -> HCase:
    kind = d.pick(KINDS)
    dtype = d.pick(REDUCE_DTYPES if kind in REDUCING else MOVE_DTYPES)
    nt = d.int(1, 3) if kind.startswith("grouped") else 1
    lo = 1 if kind in ("alltoall", "reducescatter", "grouped_reducescatter") else 0
    shapes = tuple(tuple(d.pick(DIMS) for _ in range(d.int(lo, 3))) for _ in range(nt))
    op = d.pick((None, hvd.Sum, hvd.Average) + ((hvd.Min, hvd.Max, hvd.Product) if "allreduce" in kind else ()))
    ints = not dtype.is_floating_point
    pool = (1.0,) if ints and op == hvd.Product else (1.0, 0.5, 2.0, -1.0) if ints else (1.0, 0.5, 2.0, -1.0, 4.0)
    pre, post = (d.pick(pool), d.pick(pool)) if kind in REDUCING else (1.0, 1.0)
    form = d.pick(("sync", "async", "inplace")) if kind in ("allreduce", "broadcast") else d.pick(("sync", "async"))
    base = HCall(kind, form, shapes, dtype, "contiguous", op, d.int(0, p - 1), pre, post, None, d.pick(NAMES))
    calls = []
    for _ in range(p):
        c = base
        if kind in ("allgather", "grouped_allgather"):
            c = replace(c, shapes=tuple(((d.pick(DIMS),) + s[1:]) if s else s for s in shapes))
        if kind == "alltoall":
            sp = [d.int(0, 3) for _ in range(p)]
            c = replace(c, shapes=((sum(sp),) + shapes[0][1:],), splits=sp)
        calls.append(c)
    case = HCase(p, d.int(0, 2 ** 31 - 1), dtype.is_floating_point and d.chance(1, 3), tuple(calls))
    if faults and d.chance(1, 2):
        case = add_hfault(d, case)
    return case


def _local(d: Draw, c: HCall, p: int) -> tuple[str, HCall]:
    names = ["dtype_bad", "layout", "meta", "notensor", "name_bad"]
    names += ["op_bad", "scale_bad"] if c.kind in REDUCING else []
    names += ["root_bad"] if c.kind == "broadcast" else []
    names += ["splits_bad"] if c.kind == "alltoall" else []
    name = d.pick(names)
    if name == "layout":
        layouts = _noncontiguous_layouts(c.shapes[0])
        return (name, replace(c, layout=d.pick(layouts))) if layouts else ("meta", replace(c, layout="meta"))
    if name in ("meta", "notensor"):
        return name, replace(c, layout=name)
    if name == "dtype_bad":
        bad = BAD_DTYPES + ((torch.uint8, torch.int8, torch.int16) if c.kind in REDUCING else ())
        return name, replace(c, dtype=d.pick(bad))
    if name == "name_bad":
        return name, replace(c, name=d.pick(BAD_NAMES))
    if name == "op_bad":
        return name, replace(c, op=d.pick(("nope", 17, hvd.Adasum) + ((hvd.Min,) if "scatter" in c.kind else ())))
    if name == "scale_bad":
        return name, replace(c, **{d.pick(("pre", "post")): d.pick(BAD_SCALES[:1] + BAD_SCALES[3:])})
    if name == "root_bad":
        return name, replace(c, root=d.pick((p, -1, 1.0, None)))
    return name, replace(c, splits=list(c.splits[:-1]) if len(c.splits) > 1 else [-1])


def _cross(d: Draw, c: HCall, case: HCase, name: str) -> HCall:
    if name == "shape":
        s = c.shapes[0]
        s = s + (2,) if c.kind in ("allgather", "grouped_allgather", "alltoall") else s[:-1] + (s[-1] + 1,) if s else (1,)
        return replace(c, shapes=(s,) + c.shapes[1:])
    if name == "dtype":
        return replace(c, dtype=_other(d, c.dtype, REDUCE_DTYPES if c.kind in REDUCING else MOVE_DTYPES))
    if name == "op":
        ops = (hvd.Sum, hvd.Average) + ((hvd.Min, hvd.Max) if "allreduce" in c.kind else ())
        return replace(c, op=_other(d, int(_op(c.kind, c.op)), ops))
    if name == "root":
        return replace(c, root=_other(d, c.root, case.members))
    if name == "name":
        return replace(c, name=f"{c.name}.other")
    if name == "kind":
        return replace(c, kind=_other(d, c.kind, ("allreduce", "allgather", "broadcast")), shapes=(c.shapes[0] or (1,),),
                       dtype=torch.float32, layout="contiguous", op=None, pre=1.0, post=1.0, splits=None, form="sync")
    return replace(c, calls=False)


def add_hfault(d: Draw, case: HCase) -> HCase:
    c0 = case.calls[0]
    local = case.p == 1 or d.chance(1, 2)
    cross = ["shape", "dtype", "kind", "name", "skip"] + (["op"] if c0.kind in REDUCING else [])
    cross += ["root"] if c0.kind == "broadcast" else []
    name = "local" if local else d.pick(cross)
    who = _who(d, case)
    if not local and len(who) == case.p:
        who = who[:-1]
    calls, labels = list(case.calls), []
    for r in who:
        if local:
            label, calls[r] = _local(d, calls[r], case.p)
        else:
            label, calls[r] = name, _cross(d, calls[r], case, name)
        labels.append(f"{label}@{r}")
    return replace(case, calls=tuple(calls), faults=tuple(labels), local=frozenset(who if local else ()))


# ---- running and judging ------------------------------------------------------------------------------
def _values(case: HCase, rank: int, c: HCall, i: int, shape) -> torch.Tensor:
    from fuzz_cases import Call, Case
    from fuzz_run import values

    op = _op(c.kind, c.op) if c.op in (None, hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product) else ReduceOp.SUM
    sub = Case(case.p, case.seed * 31 + i, case.members, False, case.specials, ())
    return values(sub, rank, Call("x", shape=shape, dtype=c.dtype, op=op))


def _build(case: HCase, rank: int, c: HCall) -> list:
    from fuzz_run import lay_out

    return [lay_out(_values(case, rank, c, i, s), c.layout) for i, s in enumerate(c.shapes)]


def _submit(c: HCall, ts: list):
    """Start the op; returns a callable giving the result."""
    kw = dict(name=c.name)
    if c.kind in ("allreduce", "grouped_allreduce"):
        kw.update(op=c.op, prescale_factor=c.pre, postscale_factor=c.post)
        if c.kind == "grouped_allreduce":
            h = hvd.grouped_allreduce_async(ts, **kw)
        elif c.form == "inplace":
            return lambda: hvd.allreduce_(ts[0], **kw)
        else:
            h = hvd.allreduce_async(ts[0], **kw)
    elif c.kind in ("allgather", "grouped_allgather"):
        h = hvd.allgather_async(ts[0], **kw) if c.kind == "allgather" else hvd.grouped_allgather_async(ts, **kw)
    elif c.kind == "broadcast":
        h = (hvd.broadcast_async_ if c.form == "inplace" else hvd.broadcast_async)(ts[0], c.root, **kw)
    elif c.kind == "alltoall":
        h = hvd.alltoall_async(ts[0], splits=c.splits, **kw)
    else:
        kw.update(op=hvd.Average if c.op is None else c.op, prescale_factor=c.pre, postscale_factor=c.post)
        h = (hvd.reducescatter_async(ts[0], **kw) if c.kind == "reducescatter" else
             hvd.grouped_reducescatter_async(ts, **kw))
    return _started(h)


def _started(h):
    return lambda: hvd.synchronize(h)


def _expected(case: HCase, rank: int, c: HCall, i: int, shape):
    ins = [_values(case, r, case.calls[r], i, case.calls[r].shapes[i]) for r in case.members]
    if c.kind in ("allreduce", "grouped_allreduce"):
        return reference.allreduce(ins, _op(c.kind, c.op), float(c.pre), float(c.post))[rank]
    if c.kind in ("allgather", "grouped_allgather"):
        return reference.allgather(ins)[0]
    if c.kind == "broadcast":
        return ins[c.root]
    if c.kind == "alltoall":
        sp = [list(case.calls[r].splits) for r in case.members]
        return reference.alltoall(ins, sp)[rank], [sp[s][rank] for s in case.members]
    red = reference.allreduce(ins, _op(c.kind, c.op), float(c.pre), float(c.post))[0]
    return torch.split(red, split_rows(red.shape[0], case.p), dim=0)[rank]


def _check(case: HCase, rank: int, c: HCall, ts: list, before: list, out) -> list[str]:
    outs = out if c.kind.startswith("grouped") else [out]
    if not isinstance(outs, list) or len(outs) != len(c.shapes):
        return [f"rank {rank}: got {type(out).__name__} for {len(c.shapes)} tensors"]
    problems = []
    for i, (o, s) in enumerate(zip(outs, c.shapes)):
        exp = _expected(case, rank, c, i, s)
        if c.kind == "alltoall":
            if not (isinstance(o, tuple) and list(o[1]) == exp[1]):
                problems.append(f"alltoall returned {o!r:.200}, expected received splits {exp[1]}")
                continue
            o, exp = o[0], exp[0]
        if not same(o, exp):
            problems.append(f"wrong result of tensor {i}: got {o!r:.300}, expected {exp!r:.300}")
        if c.form == "inplace" and o is not ts[i]:
            problems.append("the in-place form did not return its input tensor")
        if c.form != "inplace" and not same(ts[i], before[i]):
            problems.append("the input tensor was modified")
    return problems


def hvd_rank_body(case: HCase, rank: int) -> dict:
    """Run ``case`` on ``rank`` between ``hvd.init()`` and ``hvd.shutdown()``; the outcome as
    :func:`fuzz_run.rank_body` gives it."""
    c = case.calls[rank]
    if not c.calls:
        return {"status": "skip", "problems": []}
    ts = _build(case, rank, c)
    before = [t.clone() if isinstance(t, torch.Tensor) and not t.is_meta else None for t in ts]
    res = {"problems": []}
    try:
        out = _submit(c, ts)()
    except Exception as exc:  # noqa: BLE001 - the outcome under test
        res.update(status="err", error=f"{type(exc).__name__}: {exc}"[:2000],
                   local=isinstance(exc, LOCAL_ERRORS) and not isinstance(exc, RingletError),
                   clear=isinstance(exc, LOCAL_ERRORS + (RingletError,)) and bool(str(exc).strip()))
        return res
    res.update(status="ok", problems=_check(case, rank, c, ts, before, out))
    return res


def hvd_judge(case: HCase, rank: int, res: dict) -> list[str]:
    """:func:`fuzz_run.judge`, with Horovod's one local error that is not a ValueError: reducescatter
    with Min, Max or Product raises ``HorovodInternalError`` at the call (the API contract)."""
    from fuzz_run import judge

    if res.get("error", "").startswith("HorovodInternalError: reducescatter supports Sum and Average only"):
        res = {**res, "local": True}
    return judge(case, rank, res)
