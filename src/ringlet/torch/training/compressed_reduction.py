"""A bucket of :class:`~ringlet.torch.training.ddp.DistributedDataParallel` averaged by a compressed
all-reduce (``DistributedDataParallel(..., compression=...)``).

:class:`CompressedReduction` is :class:`~ringlet.torch.training.reduction.DenseReduction` (the same
buffer, the same way gradients go in and averages come out, ``no_sync`` accumulation included) with
another launch: :meth:`ringlet.torch.comm.Comm.allreduce_compressed_` of the bucket's buffer (the sum
or the average by the context's ``op``; a ``postscale`` other than 1 is a predivide factor: the buffer is
divided by it before and multiplied by it after, the context's ``prescale`` being its inverse), with the
bucket's own compressor state (error-feedback residuals, PowerSGD's ``Q``: one strategy object, hence
one state, per bucket; a rebuilt bucket starts afresh) and its parameters' shapes. Weights averaged
from sufficient factors keep their :class:`~ringlet.torch.training.factor_reduction.FactorReduction`:
they are not compressed again.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ringlet.types import ReduceOp

from .reduction import DenseReduction, ReductionContext

if TYPE_CHECKING:
    from ringlet.compression import Compressor

    from ..comm import CommFuture
    from .buckets import Bucket

__all__ = ["CompressedReduction"]


class CompressedReduction(DenseReduction):
    """Compressed all-reduce (average) of one bucket's flat buffer (see the module doc). Make one per
    bucket: it holds the bucket's compressor state."""

    __slots__ = ("compressor", "state", "shapes")

    def __init__(self, ctx: ReductionContext, compressor: Compressor):
        super().__init__(ctx)
        self.compressor = compressor
        self.state: dict = {}
        self.shapes: tuple[tuple[int, ...], ...] = ()

    def new_buffer(self, params: list[torch.nn.Parameter], numel: int) -> torch.Tensor:
        self.shapes = tuple(tuple(p.shape) for p in params)
        return super().new_buffer(params, numel)

    def launch(self, b: Bucket, timed: bool) -> CommFuture:
        # Matched by order on the core queue, where the name is checked too.
        ctx = self.ctx
        if ctx.postscale != 1.0:
            b.buffer.div_(ctx.postscale)  # a predivide factor: divided before the sum, multiplied after
        return ctx.comm.allreduce_compressed_(
            b.buffer, self.compressor, self.state, ctx.name(b, "compressed"), average=ctx.op == ReduceOp.AVG,
            shapes=self.shapes, check=None if b.algo not in b.validated else False, algorithm=b.algo)

    def finish(self, b: Bucket, result) -> None:
        if self.ctx.postscale != 1.0:
            b.buffer.mul_(self.ctx.postscale)
