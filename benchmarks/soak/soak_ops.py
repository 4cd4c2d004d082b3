"""Running one step of the soak's plan on this rank and checking what came back (:mod:`soak`).

:func:`issue` calls the public collective that :class:`~soak_plan.OpSpec` names, in the blocking or the
``_async`` form and out of place or in place as :class:`Mode` says (each rank draws its own mode: the
forms must interoperate); :func:`complete` waits for it and compares the result with the reference of
:mod:`soak_plan`, returning a description of every difference (an empty list when all is right).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import ringlet
from ringlet import ReduceOp
from soak_plan import (FLOATS, OpSpec, alltoall_received, base, gathered, member_input, reduced,
                       scatter_slice)

AVG_TOLERANCE = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6, torch.float64: 1e-12}
CHECK_INPUT_BELOW = 1 << 16  # elements: out-of-place calls also verify that the input is untouched


@dataclass(frozen=True)
class Mode:
    """How this rank calls a step: ``sync`` (blocking form, else ``_async`` and ``wait`` later) and
    ``inplace`` (the trailing-underscore form where the collective has one)."""

    sync: bool
    inplace: bool


@dataclass
class Pending:
    """A step issued on this rank: ``j`` is its member index, ``b`` the step's base tensor, ``x`` the
    tensor given to the collective, ``value`` the blocking form's result or the ``_async`` form's handle."""

    spec: OpSpec
    j: int
    b: torch.Tensor
    x: torch.Tensor
    mode: Mode
    value: object

    def result(self):
        return self.value if self.mode.sync else self.value.wait()


def _forms(name: str) -> dict:
    """The four forms of collective ``name`` by ``(sync, inplace)``; the out-of-place ones where a
    collective has no in-place form."""
    sync, asyn = getattr(ringlet, name), getattr(ringlet, f"{name}_async")
    sync_in, asyn_in = getattr(ringlet, f"{name}_", sync), getattr(ringlet, f"{name}_async_", asyn)
    return {(True, False): sync, (True, True): sync_in, (False, False): asyn, (False, True): asyn_in}


FORMS = {k: _forms(k) for k in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall")}


def issue(spec: OpSpec, group, rank: int, mode: Mode) -> Pending:
    """Call step ``spec`` on this rank (a member of ``spec.members``; ``group`` the ringlet Group)."""
    j = spec.members.index(rank)
    b = base(spec)
    x = member_input(spec, b, j)
    if spec.kind == "barrier":
        value = ringlet.barrier(group) if mode.sync else ringlet.barrier_async(group)
        return Pending(spec, j, b, x, mode, value)
    fn = FORMS[spec.kind][(mode.sync, mode.inplace)]
    if spec.kind == "allreduce":
        value = fn(x, op=spec.op, algorithm=spec.algorithm, group=group, postscale_factor=spec.post)
    elif spec.kind == "broadcast":
        value = fn(x, spec.root, group=group)
    elif spec.kind == "reduce":
        value = fn(x, spec.root, op=spec.op, group=group)
    elif spec.kind == "allgather":
        value = fn(x, group=group, algorithm=spec.algorithm, sizes=list(spec.rows) if spec.given_sizes else None)
    elif spec.kind == "reduce_scatter":
        value = fn(x, op=spec.op, group=group)
    else:
        value = fn(x, splits=list(spec.splits[j]), group=group)
    return Pending(spec, j, b, x, mode, value)


def differences(got, want: torch.Tensor, spec: OpSpec, what: str) -> list[str]:
    """``[]`` when ``got`` is ``want`` (same dtype and shape; equal, or within rounding for floating
    averages), else one line naming the step and the first difference."""
    if not isinstance(got, torch.Tensor):
        return [f"{what}: got {type(got).__name__}, expected a tensor"]
    if got.dtype != want.dtype or got.shape != want.shape:
        return [f"{what}: got {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}"]
    if spec.op == ReduceOp.AVG and spec.dtype in FLOATS and what.startswith("result"):
        tol = AVG_TOLERANCE[spec.dtype]
        ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    if ok:
        return []
    bad = (got.double() - want.double()).abs().reshape(-1)
    first = int(torch.nonzero(bad > 0)[0]) if bad.numel() else -1
    return [f"{what}: {int((bad > 0).sum())} of {bad.numel()} elements differ, max {float(bad.max()):g}, "
            f"first at flat index {first}: got {got.reshape(-1)[first].item()} want {want.reshape(-1)[first].item()}"]


def _expected(pend: Pending, rank: int):
    """The reference result of this rank's call, or None where the result is unspecified (the in-place
    reduce off the root)."""
    spec, j = pend.spec, pend.j
    if spec.kind == "allreduce":
        return reduced(spec, pend.b)
    if spec.kind == "broadcast":
        return member_input(spec, pend.b, spec.members.index(spec.root))
    if spec.kind == "reduce":
        if rank == spec.root:
            return reduced(spec, pend.b)
        return None if pend.mode.inplace else member_input(spec, pend.b, j)
    if spec.kind == "allgather":
        return gathered(spec, pend.b)
    if spec.kind == "reduce_scatter":
        return reduced(spec, pend.b)[scatter_slice(spec.rows[j], len(spec.members), j)]
    raise AssertionError(spec.kind)


def complete(pend: Pending, rank: int) -> list[str]:
    """Wait for ``pend`` and check its result (and, for small out-of-place calls, that the input is
    unchanged); the differences found, each prefixed with the step."""
    spec = pend.spec
    got = pend.result()
    if spec.kind == "barrier":
        errs = [] if got is None else [f"result: barrier returned {got!r}"]
    elif spec.kind == "alltoall":
        out, splits = got
        want, want_splits = alltoall_received(spec, pend.b, pend.j)
        errs = differences(out, want, spec, "result")
        if list(splits) != want_splits:
            errs.append(f"received splits {list(splits)}, expected {want_splits}")
    else:
        want = _expected(pend, rank)
        errs = [] if want is None else differences(got, want, spec, "result")
        if pend.mode.inplace and spec.kind in ("allreduce", "broadcast") and got is not pend.x:
            errs.append("in-place form returned another tensor than its argument")
    overwritten = pend.mode.inplace and spec.kind in ("allreduce", "broadcast", "reduce")
    if pend.x.numel() < CHECK_INPUT_BELOW and spec.kind != "barrier" and not overwritten:
        errs += differences(pend.x, member_input(spec, pend.b, pend.j), spec, "input after the call")
    return [f"step {spec.index} {describe(spec, pend.mode)}: {e}" for e in errs]


def describe(spec: OpSpec, mode: Mode) -> str:
    form = ("sync" if mode.sync else "async") + (" in-place" if mode.inplace else "")
    return (f"{spec.kind}[{form}] group {spec.group} {list(spec.members)} {str(spec.dtype).replace('torch.', '')} "
            f"rows {list(spec.rows)} x {spec.width} op {spec.op.name.lower()} algorithm {spec.algorithm} "
            f"root {spec.root} post {spec.post}")
