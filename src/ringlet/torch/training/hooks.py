"""Comm hooks that route the buckets of stock ``torch.nn.parallel.DistributedDataParallel`` through ringlet.

Usage — the hook line is all a script needs::

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(ringlet.torch.hooks.HookState(), ringlet.torch.hooks.allreduce_hook)

Each hook receives a ``torch.distributed.GradBucket`` and returns a ``torch.futures.Future`` holding the
bucket's flat gradient averaged over the group, as torch's own ``allreduce_hook`` does. The hook does
not block: it hands the bucket to the communicator (:class:`ringlet.torch.comm.Comm`) and chains the
completion to its future. DDP calls hooks in bucket order on every rank, which is the order ringlet's
core queue needs.

When ringlet is not initialised, the first hook call initialises it on torch.distributed's default
process group, with ringlet's traffic on a Gloo group of its own (every rank reaches its first hook
call at the same point, so the group is created collectively). ``ValueError`` when torch.distributed
is not initialised either.

Variants: :func:`fp16_compress_hook` / :func:`bf16_compress_hook` cast the bucket to half precision,
sum ``bucket / size`` (dividing first keeps fp16 from overflowing) and cast the result back into the
bucket. ``HookState.algorithm`` picks ringlet's all-reduce algorithm.
"""
# No ``from __future__ import annotations``: torch's register_comm_hook checks the hooks' return
# annotation as an object.
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ringlet import timeline
from ringlet.types import ReduceOp

from ..comm import Comm, CommFuture, ensure_initialized, session_key

__all__ = ["HookState", "BucketState", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]


@dataclass(slots=True)
class BucketState:
    """What a hook keeps for one bucket between steps (compressors keep their residuals here).
    ``calls``: how many times the bucket was reduced; ``data``: the hook's own per-bucket state."""

    index: int
    calls: int = 0
    data: dict = field(default_factory=dict)


class HookState:
    """The state of ringlet's comm hooks: ``group`` (a :class:`ringlet.Group`, a ``ringlet.torch``
    ProcessSet or ``None`` for the world — the same ranks as DDP's process group), ``algorithm``, and
    mutable per-bucket :class:`BucketState` (:meth:`bucket`). One state per DDP model."""

    __slots__ = ("group", "algorithm", "buckets", "_comm", "_comm_key")

    def __init__(self, group: Any = None, algorithm: str = "auto"):
        self.group = group
        self.algorithm = algorithm
        self.buckets: dict[int, BucketState] = {}
        self._comm: Comm | None = None
        self._comm_key: tuple | None = None

    def bucket(self, index: int) -> BucketState:
        """The state of bucket ``index``, created on first use."""
        st = self.buckets.get(index)
        if st is None:
            st = self.buckets[index] = BucketState(index)
        return st

    def comm(self) -> "Comm":
        """The communicator, initialising ringlet first if needed; rebuilt when ringlet or
        ``ringlet.torch`` was initialised or shut down since the last call."""
        ensure_initialized()
        key = session_key()
        if self._comm is None or key != self._comm_key:
            self._comm, self._comm_key = Comm(self.group, self.algorithm), key
        return self._comm


def _reduce(state: HookState | None, bucket, send: torch.Tensor, finish: Callable[[], torch.Tensor],
            op: ReduceOp, prescale: float) -> torch.futures.Future[torch.Tensor]:
    """All-reduce ``send`` in place; the returned future's value is ``finish()``, run once it is done."""
    state = state if state is not None else HookState()
    comm = state.comm()
    state.bucket(bucket.index()).calls += 1
    label = f"ddp_hook.bucket{bucket.index()}"
    fut = comm.allreduce_(send, op, f"ringlet.hook.{label}", prescale=prescale)
    nbytes = send.numel() * send.element_size()

    def done(f: CommFuture) -> torch.Tensor:
        f.wait()  # raises the collective's error into the chained future
        tl = timeline.active()
        times = f.span() if tl is not None else None
        if times is not None:
            tl.span(label, "COMMUNICATE", times[0], times[1], {"bytes": nbytes})
        return finish()

    return fut.then(done)


def allreduce_hook(state: HookState | None, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over the group with ringlet (op AVG, in place on the bucket's buffer)."""
    buf = bucket.buffer()
    return _reduce(state, bucket, buf, lambda: buf, ReduceOp.AVG, 1.0)


def _compress_hook(dtype: torch.dtype, state: HookState | None, bucket) -> torch.futures.Future[torch.Tensor]:
    state = state if state is not None else HookState()
    buf = bucket.buffer()
    size = state.comm().size
    small = buf.to(dtype)

    def finish() -> torch.Tensor:
        buf.copy_(small)
        return buf

    return _reduce(state, bucket, small, finish, ReduceOp.SUM, 1.0 / size)


def fp16_compress_hook(state: HookState | None, bucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`allreduce_hook` with the bucket sent as float16 (pre-divided by the group size)."""
    return _compress_hook(torch.float16, state, bucket)


def ringlet_bf16_compress_hook(state: HookState | None, bucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`allreduce_hook` with the bucket sent as bfloat16 (pre-divided by the group size)."""
    return _compress_hook(torch.bfloat16, state, bucket)


# Exported under torch's name, but defined under another: torch's register_comm_hook rejects any function
# whose __name__ is "bf16_compress_hook" unless CUDA + NCCL are present, and ringlet's needs neither.
bf16_compress_hook = ringlet_bf16_compress_hook
