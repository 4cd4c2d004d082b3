"""Running a :class:`fuzz_cases.Case` on one rank and judging the outcome (see fuzz_cases for the property).

:func:`rank_body` runs on every rank of a world (threads in-process, or the processes of a real job): it
builds the rank's input, calls the collective, and checks a returned result against the reference
computed with plain torch from every member's input (every rank can rebuild them). The outcome is a
plain dict, so that a real-process worker can write it as JSON; :func:`judge` turns it into a list of
problems (empty: the property held on this rank).
"""
from __future__ import annotations

import zlib

import torch
from fuzz_cases import BAD_DTYPES, LOCAL_ERRORS, Call, Case

import ringlet
from ringlet.algorithms import reference
from ringlet.engine.ops import split_rows
from ringlet.types import MismatchError, ReduceOp, RingletError

_FNS = {
    "allreduce": (ringlet.allreduce, ringlet.allreduce_async, ringlet.allreduce_, ringlet.allreduce_async_),
    "broadcast": (ringlet.broadcast, ringlet.broadcast_async, ringlet.broadcast_, ringlet.broadcast_async_),
    "reduce": (ringlet.reduce, ringlet.reduce_async, ringlet.reduce_, ringlet.reduce_async_),
    "allgather": (ringlet.allgather, ringlet.allgather_async),
    "reduce_scatter": (ringlet.reduce_scatter, ringlet.reduce_scatter_async),
    "alltoall": (ringlet.alltoall, ringlet.alltoall_async),
    "barrier": (ringlet.barrier, ringlet.barrier_async),
}
_FORM_INDEX = {"sync": 0, "async": 1, "inplace": 2, "async_inplace": 3}


def canon_op(op) -> ReduceOp | None:
    try:
        return ReduceOp.parse(op)
    except (ValueError, TypeError):
        return None


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def values(case: Case, rank: int, c: Call) -> torch.Tensor:
    """Rank ``rank``'s input as a contiguous tensor: small integers (exact sums and products in every
    dtype, whatever the order), in floating cases with NaN and infinities sprinkled in."""
    if c.dtype in BAD_DTYPES:
        return torch.zeros(c.shape).to(c.dtype)
    g = torch.Generator().manual_seed(zlib.crc32(f"{case.seed}|{rank}".encode()))
    n = numel(c.shape)
    unsigned = c.dtype == torch.uint8
    if canon_op(c.op) == ReduceOp.PRODUCT:
        pool = torch.tensor([1, 2] if unsigned else [-1, 1, 2])
        vals = pool[torch.randint(0, len(pool), (n,), generator=g)].to(c.dtype)
    else:
        vals = torch.randint(0 if unsigned else -3, 4, (n,), generator=g).to(c.dtype)
    if case.specials and c.dtype.is_floating_point and n:
        where = torch.randint(0, 6, (n,), generator=g) == 0
        pick = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=c.dtype)
        vals[where] = pick[torch.randint(0, 3, (n,), generator=g)][where]
    return vals.reshape(c.shape)


def build(case: Case, rank: int, c: Call):
    """The argument rank ``rank`` passes: its values laid out as ``c.layout`` says."""
    if c.layout == "meta":
        return torch.empty(c.shape, dtype=c.dtype, device="meta")
    return lay_out(values(case, rank, c), c.layout)


def lay_out(t: torch.Tensor, layout: str):
    """``t``'s values as ``layout`` says: the tensor, a list, or a non-contiguous view (transposed,
    every other row of a larger tensor, one value expanded), or a ``meta`` tensor of its shape. A view
    the tensor's shape does not allow (a transposed vector, an expanded empty tensor) leaves it as is."""
    if layout == "meta":
        return torch.empty(t.shape, dtype=t.dtype, device="meta")
    if layout == "notensor":
        return t.tolist()
    if layout == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided" and t.dim() >= 1:
        base = torch.zeros((2 * t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype)
        base[::2] = t
        return base[::2]
    if layout == "expanded" and t.numel() > 0:
        return t.reshape(-1)[:1].reshape(()).expand(t.shape)
    return t


def invoke(c: Call, t, group):
    fn = _FNS[c.kind][_FORM_INDEX[c.form]]
    g = "world" if c.layout == "group_bad" else group
    if c.kind == "allreduce":
        out = fn(t, op=c.op, algorithm=c.algorithm, group=g, prescale_factor=c.pre, postscale_factor=c.post)
    elif c.kind == "broadcast":
        out = fn(t, c.root, group=g)
    elif c.kind == "reduce":
        out = fn(t, c.root, op=c.op, group=g)
    elif c.kind == "allgather":
        out = fn(t, group=g, algorithm=c.algorithm)
    elif c.kind == "reduce_scatter":
        out = fn(t, op=c.op, group=g, prescale_factor=c.pre, postscale_factor=c.post)
    elif c.kind == "alltoall":
        out = fn(t, splits=c.splits, group=g)
    else:
        out = fn(group=g)
    return out.wait() if c.form.startswith("async") else out


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and values, NaN where the other has NaN."""
    if not isinstance(a, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        return torch.equal(na, nb) and torch.equal(a[~na], b[~nb])
    return torch.equal(a, b)


def expected(case: Case, rank: int):
    """The reference result of a clean case on ``rank`` (``None`` where the content is unspecified)."""
    members = case.members
    c = case.calls[rank]
    ins = [values(case, r, case.calls[r]) for r in members]
    me = members.index(rank)
    op = canon_op(c.op)
    if c.kind == "allreduce":
        return reference.allreduce(ins, op, float(c.pre), float(c.post))[me]
    if c.kind == "broadcast":
        return ins[members.index(c.root)]
    if c.kind == "reduce":
        if rank == c.root:
            return reference.allreduce(ins, op)[0]
        return None if c.form.endswith("inplace") else ins[me]
    if c.kind == "allgather":
        return reference.allgather(ins)[0]
    if c.kind == "reduce_scatter":
        red = reference.allreduce(ins, op, float(c.pre), float(c.post))[0]
        return torch.split(red, split_rows(red.shape[0], len(members)), dim=0)[me]
    if c.kind == "alltoall":
        n = len(members)
        sp = [[int(x) for x in case.calls[r].splits] if case.calls[r].splits is not None else [ins[i].shape[0] // n] * n
              for i, r in enumerate(members)]
        return reference.alltoall(ins, sp)[me], [sp[s][me] for s in range(n)]
    return None


def check_result(case: Case, rank: int, t, before, out) -> list[str]:
    c = case.calls[rank]
    exp = expected(case, rank)
    problems = []
    if c.kind == "alltoall":
        if not (isinstance(out, tuple) and len(out) == 2 and list(out[1]) == exp[1]):
            return [f"alltoall returned {out!r:.300}, expected received splits {exp[1]}"]
        out, exp = out[0], exp[0]
    if c.kind == "barrier":
        return [] if out is None else [f"barrier returned {out!r}"]
    if exp is not None and not same(out, exp):
        problems.append(f"wrong result on rank {rank}: got {_show(out)}, expected {_show(exp)}")
    inplace = c.form.endswith("inplace") and (c.kind != "reduce" or rank == c.root)
    if inplace and out is not t:
        problems.append("the in-place form did not return its input tensor")
    if not c.form.endswith("inplace") and before is not None and not same(t, before):
        problems.append("the input tensor was modified")
    return problems


def _show(t) -> str:
    if not isinstance(t, torch.Tensor):
        return repr(t)[:200]
    return f"{t.dtype} {list(t.shape)} {t.reshape(-1)[:8].tolist()}"


def rank_body(case: Case, rank: int, *, fresh_group: bool = False) -> dict:
    """Run ``case`` on ``rank`` (the calling thread's or process's runtime); the outcome as a dict:
    ``status`` (ok, err, skip), ``error`` (type: message), ``local`` (the error is a local argument
    error), ``problems`` (what was wrong with a returned result or with the world afterwards).
    ``fresh_group``: run on a new group even when the case uses the whole world (a long-lived world
    whose earlier cases may have left ranks out of step)."""
    group = ringlet.new_group(case.members) if case.group or fresh_group else None
    c = case.calls[rank]
    if not c.calls:
        return {"status": "skip", "problems": []}
    t = build(case, rank, c)
    before = t.clone() if isinstance(t, torch.Tensor) and not t.is_meta else None
    try:
        out = invoke(c, t, group)
    except Exception as exc:  # noqa: BLE001 - the outcome under test
        res = {"status": "err", "error": f"{type(exc).__name__}: {exc}", "problems": [],
               "local": isinstance(exc, LOCAL_ERRORS) and not isinstance(exc, RingletError),
               "clear": isinstance(exc, LOCAL_ERRORS + (RingletError,)) and bool(str(exc).strip())}
        if isinstance(exc, MismatchError) and not case.local and not any(f.startswith("skip") for f in case.faults):
            res["problems"] += _recovers(case, group)
        return res
    return {"status": "ok", "problems": check_result(case, rank, t, before, out)}


def _recovers(case: Case, group) -> list[str]:
    """After a mismatch every member raised, the group still works."""
    try:
        got = ringlet.allreduce(torch.ones(2), group=group)
    except Exception as exc:  # noqa: BLE001
        return [f"after the MismatchError an all-reduce failed: {type(exc).__name__}: {exc}"]
    return [] if torch.equal(got, torch.full((2,), float(len(case.members)))) else [f"recovery sum {got.tolist()}"]


def judge(case: Case, rank: int, res: dict) -> list[str]:
    """What broke the property on ``rank`` (empty: nothing)."""
    c = case.calls[rank]
    out = [f"rank {rank}: {p}" for p in res.get("problems", [])]
    if not c.calls:
        return out + ([] if res["status"] == "skip" else [f"rank {rank} does not call but got {res}"])
    if case.clean and res["status"] != "ok":
        return out + [f"rank {rank}: clean case raised {res.get('error')}"]
    if not case.clean:
        if res["status"] == "ok":
            return out + [f"rank {rank}: returned although the case has faults {case.faults}"]
        if not res["clear"]:
            out.append(f"rank {rank}: unclear error {res['error']}")
        elif rank in case.local and not res["local"]:
            out.append(f"rank {rank}: local fault answered by {res['error']}")
    return out
