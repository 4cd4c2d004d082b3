"""Comm hooks that route the buckets of stock ``torch.nn.parallel.DistributedDataParallel`` through ringlet.

Usage — the hook line is all a script needs::

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(ringlet.torch.hooks.HookState(), ringlet.torch.hooks.allreduce_hook)

Each hook receives a ``torch.distributed.GradBucket`` and returns a ``torch.futures.Future`` holding the
bucket's flat gradient averaged over the group, as torch's own ``allreduce_hook`` does. The hook does
not block: it hands the bucket to the training layer's reduction strategy — the same
:class:`~ringlet.torch.training.reduction.DenseReduction` or
:class:`~ringlet.torch.training.compressed_reduction.CompressedReduction` that ringlet's own DDP and
``DistributedOptimizer`` use, over torch's buffer (torch's DDP is the bucket reducer here) — and chains
the completion to its future. DDP calls hooks in bucket order on every rank, which is the order ringlet's
core queue needs.

When ringlet is not initialised, the first hook call initialises it on torch.distributed's default
process group, with ringlet's traffic on a Gloo group of its own (every rank reaches its first hook
call at the same point, so the group is created collectively). ``ValueError`` when torch.distributed
is not initialised either.

Compressed hooks: :func:`compressed_hook` averages the bucket with the compressed all-reduce
(:meth:`ringlet.torch.comm.Comm.allreduce_compressed_`) of ``HookState(compression=...)``'s compressor,
the bucket's :class:`BucketState` holding the compressor's state (error-feedback residuals, PowerSGD's
``Q``) and the bucket's parameter shapes going to compressors with a schedule of their own. Payloads are
summed in float32, so nothing overflows. Named variants: :func:`fp16_compress_hook` and
:func:`bf16_compress_hook` (half-precision payloads), :func:`int8_ef_hook` (``"int8+ef"``),
:func:`topk_ef_hook` (``"topk:F+ef"`` with ``F = HookState.topk_fraction``) and :func:`powersgd_hook`
(``"powersgd:R"`` with ``R = HookState.powersgd_rank``); each uses the state's ``compression`` instead
when one was given. They run on ringlet's core queue whatever the backend, with any number of buckets
(on Gloo too). ``HookState.algorithm`` picks ringlet's all-reduce algorithm.

State: torch accepts ``None`` as a hook's state, but a compressor that keeps state between steps (error
feedback's residuals, PowerSGD's ``Q`` and residual) would start afresh at every call and silently train
worse. So a compressed hook whose compressor keeps state raises ``ValueError`` when given ``state=None``,
saying to pass a :class:`HookState` (one per DDP model); :func:`allreduce_hook` and the stateless
compressors (``fp16``, ``bf16``, ``int8``, ``topk`` without ``+ef``) accept ``None``.
"""
# No ``from __future__ import annotations``: torch's register_comm_hook checks the hooks' return
# annotation as an object.
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ringlet import compression as _compression
from ringlet import timeline

from ..comm import Comm, CommFuture, ensure_initialized, session_key
from .buckets import Bucket
from .compressed_reduction import CompressedReduction
from .reduction import DenseReduction, ReductionContext

__all__ = ["HookState", "BucketState", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "compressed_hook", "int8_ef_hook", "topk_ef_hook", "powersgd_hook"]


@dataclass(slots=True)
class BucketState:
    """What a hook keeps for one bucket between steps (compressors keep their residuals here).
    ``calls``: how many times the bucket was reduced; ``data``: the hook's own per-bucket state;
    ``view``: the bucket as the training layer's reductions see it (:func:`_view`)."""

    index: int
    calls: int = 0
    data: dict = field(default_factory=dict)
    view: Any = None  # the training layer's Bucket over torch's buffer, with its reduction strategy


class HookState:
    """The state of ringlet's comm hooks: ``group`` (a :class:`ringlet.Group`, a ``ringlet.torch``
    ProcessSet or ``None`` for the world — the same ranks as DDP's process group), ``algorithm``, and
    mutable per-bucket :class:`BucketState` (:meth:`bucket`). One state per DDP model.

    For the compressed hooks: ``compression`` (a name for :func:`ringlet.compression.get` or a
    :class:`ringlet.compression.Compressor`; :func:`compressed_hook` needs it, the named hooks use it
    instead of their own), ``topk_fraction`` (:func:`topk_ef_hook`) and ``powersgd_rank``
    (:func:`powersgd_hook`). ``ValueError`` for a compressor name that is not known."""

    __slots__ = ("group", "algorithm", "buckets", "compressor", "topk_fraction", "powersgd_rank", "_named",
                 "_comm", "_comm_key", "ctx")

    def __init__(self, group: Any = None, algorithm: str = "auto", compression=None, *, topk_fraction: float = 0.01,
                 powersgd_rank: int = 2):
        self.group = group
        self.algorithm = algorithm
        self.compressor = None if compression is None else _compression.get(compression)
        self.topk_fraction = float(topk_fraction)
        self.powersgd_rank = int(powersgd_rank)
        self._named: dict[str, _compression.Compressor] = {}
        self.buckets: dict[int, BucketState] = {}
        self._comm: Comm | None = None
        self._comm_key: tuple | None = None
        self.ctx: ReductionContext | None = None  # what the buckets' reductions share (set by comm())

    def compressor_for(self, name: str | None) -> "_compression.Compressor":
        """The state's own ``compression`` when given, else the compressor ``name`` names (made once).
        ``ValueError`` when neither is there (or the name is unknown)."""
        if self.compressor is not None:
            return self.compressor
        if name is None:
            raise ValueError("compressed_hook needs HookState(compression=...): a name such as 'fp16' or a "
                             "ringlet.compression.Compressor")
        comp = self._named.get(name)
        if comp is None:
            comp = self._named[name] = _compression.get(name)
        return comp

    def bucket(self, index: int) -> BucketState:
        """The state of bucket ``index``, created on first use."""
        st = self.buckets.get(index)
        if st is None:
            st = self.buckets[index] = BucketState(index)
        return st

    def compression_states(self) -> list[dict]:
        """The compressor state of every bucket the compressed hooks reduced (error-feedback residuals
        live there: a loss scaler rescales them when its scale changes)."""
        return [v for b in self.buckets.values() for k, v in b.data.items()
                if isinstance(k, tuple) and k[:1] == ("compression",)]

    def comm(self) -> "Comm":
        """The communicator, initialising ringlet first if needed; rebuilt when ringlet or
        ``ringlet.torch`` was initialised or shut down since the last call."""
        ensure_initialized()
        key = session_key()
        if self._comm is None or key != self._comm_key:
            self._comm, self._comm_key = Comm(self.group, self.algorithm), key
            self.ctx = ReductionContext(self._comm, "ringlet.hook", False, False,
                                        label=lambda b, kind: f"ringlet.hook.ddp_hook.bucket{b.index}")
        return self._comm


def _view(st: BucketState, bucket, buf: torch.Tensor, reduction) -> Bucket:
    """Torch's bucket as the training layer's :class:`~ringlet.torch.training.buckets.Bucket` (its buffer
    is torch's, nothing allocated) with ``reduction``, kept in ``st`` while the reduction stays."""
    view = st.view
    if view is None or view.reduction is not reduction:
        view = st.view = Bucket(st.index, list(_tensors(bucket)), reduction, 0, buffer=buf)
    view.buffer = buf
    return view


def allreduce_hook(state: HookState | None, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over the group with ringlet (op AVG, in place on the bucket's buffer): the
    training layer's dense strategy (:class:`~ringlet.torch.training.reduction.DenseReduction`)."""
    state = state if state is not None else HookState()
    state.comm()
    st = state.bucket(bucket.index())
    st.calls += 1
    buf = bucket.buffer()
    old = st.view.reduction if st.view is not None else None
    dense = old if isinstance(old, DenseReduction) and old.ctx is state.ctx else DenseReduction(state.ctx)
    view = _view(st, bucket, buf, dense)
    fut = dense.launch(view, False)
    return _chain(fut, f"ddp_hook.bucket{st.index}", buf.numel() * buf.element_size(), lambda: buf)


def _chain(fut: CommFuture, label: str, nbytes: int, finish: Callable[[], torch.Tensor]) -> torch.futures.Future:
    """``fut`` chained to ``finish()``, recording the collective's span on the timeline."""

    def done(f: CommFuture) -> torch.Tensor:
        f.wait()  # raises the collective's error into the chained future
        tl = timeline.active()
        times = f.span() if tl is not None else None
        if times is not None:
            tl.span(label, "COMMUNICATE", times[0], times[1], {"bytes": nbytes})
        return finish()

    return fut.then(done)


def _tensors(bucket) -> list[torch.Tensor]:
    """The tensors the bucket's buffer concatenates, in order."""
    return bucket.parameters() if hasattr(bucket, "parameters") else bucket.gradients()


def _shapes(bucket) -> list[tuple[int, ...]]:
    """The shapes of the tensors the bucket's buffer concatenates, in order."""
    return [tuple(t.shape) for t in _tensors(bucket)]


def keeps_state(comp: "_compression.Compressor") -> bool:
    """Whether ``comp`` carries state from one step to the next (error-feedback residuals, PowerSGD's
    schedule of its own: ``Q``, its residual), which a fresh state per call would silently lose."""
    return isinstance(comp, _compression.ErrorFeedback) or comp.reduces_by == "custom"


def _compressed(state: HookState | None, bucket, name: str | None) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in place with the compressed all-reduce of ``state``'s compressor (or ``name``'s).
    The compressor's state is kept per bucket and per layout (a bucket that torch rebuilt with other
    parameters starts afresh). ``ValueError`` for ``state=None`` with a compressor that keeps state."""
    if state is None:
        comp = _compression.get(name) if name is not None else None
        if comp is None or keeps_state(comp):
            what = name if name is not None else "compressed_hook"
            raise ValueError(f"the {what!r} comm hook keeps compressor state between steps (error feedback, "
                             "warm start) and was given state=None, which would start afresh at every call: "
                             "pass one ringlet.torch.hooks.HookState() per DDP model, e.g. "
                             "ddp.register_comm_hook(ringlet.torch.hooks.HookState(), ringlet.torch.hooks."
                             "powersgd_hook)")
        state = HookState()
    comp = state.compressor_for(name)
    state.comm()
    st = state.bucket(bucket.index())
    st.calls += 1
    buf = bucket.buffer()
    shapes = _shapes(bucket)
    key = ("compression", comp.name, tuple(shapes))
    for old in [k for k in st.data if isinstance(k, tuple) and k[:1] == ("compression",) and k != key]:
        del st.data[old]
    comp_state = st.data.setdefault(key, {})
    red = st.view.reduction if st.view is not None else None
    if not (isinstance(red, CompressedReduction) and red.state is comp_state and red.ctx is state.ctx
            and red.compressor is comp):
        red = CompressedReduction(state.ctx, comp)  # the training layer's compressed strategy, this bucket's state
        red.state, red.shapes = comp_state, tuple(shapes)
    fut = red.launch(_view(st, bucket, buf, red), False)
    return _chain(fut, f"ddp_hook.bucket{st.index}", comp.wire_bytes(buf.numel()), lambda: buf)


def compressed_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket with the compressed all-reduce of ``HookState(compression=...)``."""
    return _compressed(state, bucket, None)


def int8_ef_hook(state: HookState | None, bucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`compressed_hook` with ``"int8+ef"``: bytes scaled per chunk, with error feedback."""
    return _compressed(state, bucket, "int8+ef")


def topk_ef_hook(state: HookState | None, bucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`compressed_hook` with ``"topk:F+ef"`` (``F``: ``state.topk_fraction``, 0.01 by default): the
    largest magnitudes only, with error feedback, gathered whole and never densified."""
    fraction = state.topk_fraction if state is not None else 0.01
    return _compressed(state, bucket, f"topk:{fraction:g}+ef")


def powersgd_hook(state: HookState | None, bucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`compressed_hook` with ``"powersgd:R"`` (``R``: ``state.powersgd_rank``, 2 by default): low-rank
    all-reduce of the bucket's matrices. Unlike torch's own PowerSGD hook, it works on Gloo with any
    number of buckets."""
    rank = state.powersgd_rank if state is not None else 2
    return _compressed(state, bucket, f"powersgd:{rank}")


def fp16_compress_hook(state: HookState | None, bucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`allreduce_hook` with float16 payloads, summed in float32 (:func:`compressed_hook` with
    ``"fp16"``)."""
    return _compressed(state, bucket, "fp16")


def ringlet_bf16_compress_hook(state: HookState | None, bucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`allreduce_hook` with bfloat16 payloads, summed in float32 (:func:`compressed_hook` with
    ``"bf16"``)."""
    return _compressed(state, bucket, "bf16")


# Exported under torch's name, but defined under another: torch's register_comm_hook rejects any function
# whose __name__ is "bf16_compress_hook" unless CUDA + NCCL are present, and ringlet's needs neither.
bf16_compress_hook = ringlet_bf16_compress_hook
