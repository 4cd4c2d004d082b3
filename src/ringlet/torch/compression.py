"""Gradient compression for ``ringlet.torch``: what a tensor looks like on the wire.

A compressor is stateless: ``compress(t) -> (wire_tensor, ctx)`` before the collective and
``decompress(wire_tensor, ctx) -> t`` after it, where ``ctx`` is whatever ``decompress`` needs to undo
``compress``. ``Compression.none`` sends tensors as they are; ``Compression.fp16`` sends floating
tensors as float16 (halving the bytes moved) and restores their dtype afterwards; other dtypes pass
through untouched. Custom compressors subclass :class:`Compressor`.
"""
from __future__ import annotations

import torch


class Compressor:
    """Interface of a compressor: both methods are static, a compressor keeps no state."""

    @staticmethod
    def compress(tensor: torch.Tensor):
        """Return ``(tensor_to_send, ctx)``."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx):
        """Undo :meth:`compress` on the received tensor, given the ``ctx`` it returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Identity: the tensor itself goes on the wire (so in-place collectives stay in place)."""

    compress = staticmethod(lambda tensor: (tensor, None))
    decompress = staticmethod(lambda tensor, ctx: tensor)


class FP16Compressor(Compressor):
    """Floating tensors travel as float16; ``ctx`` is the original dtype (``None``: left as is)."""

    @staticmethod
    def compress(tensor: torch.Tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx):
        if ctx is None:
            return tensor
        return tensor.to(ctx)


class Compression:
    """The built-in compressors, as Horovod names them: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"]
