"""Cross-rank checks of a ready request, run identically on every rank before any data moves.

Messages follow Horovod's wording so that scripts (and tests) matching on them keep working; the
ranks involved are appended.
"""
from __future__ import annotations

from ringlet.types import ReduceOp, dtype_name

from .requests import (ADD_PS, ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, KIND_NAMES, REDUCESCATTER, Meta)


def _dev(d: int) -> str:
    return "CPU" if d < 0 else f"GPU {d}"


def _shape(s: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(x) for x in s) + "]"


def check(metas: dict[int, Meta]) -> str | None:
    """None when every rank's record agrees; otherwise the error message for every rank."""
    ranks = sorted(metas)
    a = ranks[0]
    first = metas[a]
    kind = KIND_NAMES.get(first.kind, str(first.kind))
    for b in ranks[1:]:
        m = metas[b]
        who = f" (tensor {first.name!r}, rank {a} vs rank {b})"
        if m.kind != first.kind:
            return (f"Mismatched operations: One rank did a {kind}, but another rank did a "
                    f"{KIND_NAMES.get(m.kind, m.kind)}.{who}")
        if m.dtype != first.dtype:
            return (f"Mismatched data types: One rank had type {dtype_name(first.torch_dtype)}, but another rank "
                    f"had type {dtype_name(m.torch_dtype)}.{who}")
        if first.kind in (ALLGATHER, ALLTOALL):
            if len(m.shape) != len(first.shape):
                return (f"Mismatched {kind} tensor shapes: One rank sent a tensor of rank {len(first.shape)}, but "
                        f"another rank sent a tensor of rank {len(m.shape)}.{who}")
            if m.shape[1:] != first.shape[1:]:
                return (f"Mismatched {kind} tensor shapes: One rank sent a tensor with dimensions beyond the first "
                        f"{_shape(first.shape[1:])}, but another rank sent {_shape(m.shape[1:])}.{who}")
        elif m.shape != first.shape:
            return (f"Mismatched {kind} tensor shapes: One rank sent a tensor of shape {_shape(first.shape)}, but "
                    f"another rank sent a tensor of shape {_shape(m.shape)}.{who}")
        if first.kind in (ALLREDUCE, REDUCESCATTER) and m.op != first.op:
            return (f"Mismatched {kind} reduction ops: One rank used {ReduceOp(first.op).name}, but another rank "
                    f"used {ReduceOp(m.op).name}.{who}")
        if first.kind == BROADCAST and m.root != first.root:
            return (f"Mismatched {kind} root ranks: One rank specified root rank {first.root}, but another rank "
                    f"specified root rank {m.root}.{who}")
        if m.pre != first.pre:
            return (f"Mismatched prescale factors: One rank sent factor {first.pre}, but another rank sent "
                    f"factor {m.pre}.{who}")
        if m.post != first.post:
            return (f"Mismatched postscale factors: One rank sent factor {first.post}, but another rank sent "
                    f"factor {m.post}.{who}")
        if m.device != first.device:
            return (f"Mismatched {kind} CPU/GPU device selection: One rank specified device {_dev(first.device)}, "
                    f"but another rank specified device {_dev(m.device)}.{who}")
        if first.kind == ADD_PS and m.splits != first.splits:
            return (f"Mismatched add_process_set: One rank registered ranks {list(first.splits)}, but another rank "
                    f"registered ranks {list(m.splits)}.{who}")
    return None
