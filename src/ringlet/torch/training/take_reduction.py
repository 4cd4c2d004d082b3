"""Reductions that hand their averages over Horovod's way, for ``ringlet.torch.DistributedOptimizer``
(:mod:`ringlet.torch.ordered_grads`): the same strategies as ringlet's DDP, with another delivery.

Horovod's ``.grad`` keeps its identity: the tensor object the script holds is pointed at the average's
memory (:func:`~ringlet.torch.training.buckets.take_into`), a copy only where dtype or shape differ. The
bucket then has lent its memory; before it is written again it is replaced if anything besides those
``.grad`` tensors still holds it (:meth:`~ringlet.torch.training.buckets.Bucket.reclaim`), so a gradient
the caller kept from an earlier step keeps its values, while a ``.grad`` that still is the lent view is
accumulated into by autograd and not copied at all.

* :class:`TakeDense`: the bucket's all-reduce with the context's op and scales, its gradients travelling
  through Horovod's stateless ``compress``/``decompress`` pair (``Compression.none``, ``Compression.fp16``
  or a custom one keeping each tensor's size): the buffer holds the wire tensors, in the wire dtype (a
  bucket of one parameter reduces its contiguous wire tensor in place instead);
* :class:`TakeCompressed`: a ringlet compressor's all-reduce (one state per bucket);
* :class:`TakeFactors`: a weight averaged from sufficient factors.

A parameter marked as having no gradient (a sparse one the optimizer reduces by name, or a rank serving
``hvd.join()``) takes part with zeros and its ``.grad`` is left alone.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .buckets import is_view_of, take_into
from .compressed_reduction import CompressedReduction
from .factor_reduction import FactorReduction
from .reduction import DenseReduction

if TYPE_CHECKING:
    from .buckets import Bucket
    from .reduction import ReductionContext, StepMarks

__all__ = ["TakeDense", "TakeCompressed", "TakeFactors", "wire_dtype"]


def wire_dtype(wire, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype ``wire.compress`` sends a tensor of ``dtype`` as; ``ValueError`` for a compressor that
    changes a tensor's size (a bucket holds one wire tensor per gradient, of the gradient's size)."""
    probe, _ = wire.compress(torch.zeros(2, dtype=dtype, device=device))
    if probe.numel() != 2:
        raise ValueError(f"{getattr(wire, '__name__', type(wire).__name__)}.compress changes a tensor's size; "
                         "fused gradient reductions need compressors that keep it (cast only), or a ringlet "
                         "compressor (ringlet.compression)")
    return probe.dtype


class _Take:
    """Horovod's delivery (module doc), mixed in front of a strategy with a bucket buffer."""

    __slots__ = ()

    def prepare(self, b: Bucket) -> None:
        if b.reclaim():
            self.ctx.fresh_buffers += 1

    def deliver_slot(self, b: Bucket, j: int, marks: StepMarks) -> None:
        if not marks.got_grad[b.start + j]:
            return
        p = b.params[j]
        if take_into(p.grad, self.result_of(b, j).view(p.shape)):
            b.lent = True

    def result_of(self, b: Bucket, j: int) -> torch.Tensor:
        return b.slot(j)


class TakeDense(_Take, DenseReduction):
    """The dense all-reduce of one bucket through the stateless codec ``wire`` (see the module doc).
    Make one per bucket: it keeps each gradient's ``compress`` context for ``decompress``."""

    __slots__ = ("wire", "wire_ctx")

    def __init__(self, ctx: ReductionContext, wire):
        super().__init__(ctx)
        self.wire = wire
        self.wire_ctx: list = []

    def new_buffer(self, params: list[torch.nn.Parameter], numel: int) -> torch.Tensor:
        self.wire_ctx = [None] * len(params)
        p = params[0]
        return torch.zeros(numel, dtype=wire_dtype(self.wire, p.dtype, p.device), device=p.device)

    def accept(self, b: Bucket, j: int, grad: torch.Tensor | None) -> None:
        slot = b.slot(j)
        if grad is None:
            slot.zero_()
            return
        w, self.wire_ctx[j] = self.wire.compress(grad)
        if is_view_of(w, slot):
            return  # a lent gradient that backward accumulated into is in place already
        if len(b.params) == 1 and w.is_contiguous() and w.dtype == slot.dtype and w.device == slot.device:
            b.buffer, b.lent = w.view(-1), True  # a lone gradient is reduced in place: nothing copied
            return
        slot.copy_(w.reshape(-1))

    def result_of(self, b: Bucket, j: int) -> torch.Tensor:
        return self.wire.decompress(b.slot(j), self.wire_ctx[j])


class TakeCompressed(_Take, CompressedReduction):
    """A ringlet compressor's all-reduce of one bucket (one compressor state per bucket), delivered
    Horovod's way."""

    __slots__ = ()

    def accept(self, b: Bucket, j: int, grad: torch.Tensor | None) -> None:
        slot = b.slot(j)
        if grad is None:
            slot.zero_()
        elif not is_view_of(grad, slot):
            slot.copy_(grad.reshape(-1))


class TakeFactors(FactorReduction):
    """A weight averaged from sufficient factors, delivered Horovod's way."""

    __slots__ = ()

    def give(self, b: Bucket, avg: torch.Tensor, marks: StepMarks) -> None:
        p = b.params[0]
        if not marks.got_grad[b.start]:
            return
        if p.grad is None:
            p.grad = avg.view_as(p)
        else:
            take_into(p.grad, avg.view_as(p))
