"""Compression.none and Compression.fp16: stateless compress -> (tensor, ctx) / decompress."""
from __future__ import annotations

import pytest
import torch

from ringlet.torch.compression import Compression, Compressor


def test_none_is_identity_and_keeps_the_tensor_object():
    t = torch.arange(5.0)
    wire, ctx = Compression.none.compress(t)
    assert wire is t
    assert Compression.none.decompress(wire, ctx) is t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fp16_casts_floating_tensors_and_restores_their_dtype(dtype):
    t = (torch.arange(6, dtype=torch.float64) / 4 - 0.5).to(dtype)  # exact in float16
    wire, ctx = Compression.fp16.compress(t)
    assert wire.dtype == torch.float16
    back = Compression.fp16.decompress(wire, ctx)
    assert back.dtype == dtype and torch.equal(back, t)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.float16])
def test_fp16_leaves_other_tensors_alone(dtype):
    t = torch.arange(4).to(dtype)
    wire, ctx = Compression.fp16.compress(t)
    assert wire is t and ctx is None
    assert Compression.fp16.decompress(wire, ctx) is t


def test_fp16_rounds_to_half_precision():
    t = torch.tensor([1.0 + 2 ** -12])
    wire, ctx = Compression.fp16.compress(t)
    assert Compression.fp16.decompress(wire, ctx).item() == 1.0


def test_compressors_are_stateless_static_methods():
    assert issubclass(Compression.none, Compressor) and issubclass(Compression.fp16, Compressor)
    # Static: usable on the class, as Horovod scripts do (no instance needed).
    Compression.fp16.compress(torch.ones(1))
    with pytest.raises(NotImplementedError):
        Compressor.compress(torch.ones(1))
