"""The payload compressors of ringlet.compression against the protocol of compression/base.py: uint8
payloads of wire_bytes(n) bytes, float32 decompression, error bounds per compressor, accumulate_, bad
input, and get()'s names."""
from __future__ import annotations

import math

import pytest
import torch

from ringlet.compression import (BF16, FP16, NONE, Compressor, ErrorFeedback, Int8, PowerSGD, TopK, get)

COMPRESSORS = {
    "none": NONE, "fp16": FP16, "bf16": BF16,
    "int8": Int8(), "int8:chunk7": Int8(chunk=7), "int8:stochastic": Int8(stochastic=True),
    "topk": TopK(), "topk:0.3": TopK(0.3),
    "int8+ef": ErrorFeedback(Int8()), "topk+ef": ErrorFeedback(TopK()),
}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SIZES = [0, 1, 2, 7, 13, 257, 1021, 65537]


def sample(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Nonzero values of magnitude in [2^-7, 2^7] with random signs (normal in float16 and bfloat16)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + n)
    mag = (0.5 + torch.rand(n, generator=g, dtype=torch.float64)) * 2.0 ** torch.randint(-6, 7, (n,), generator=g)
    sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
    return (mag * sign).to(dtype)


def inner(comp: Compressor) -> Compressor:
    return comp.inner if isinstance(comp, ErrorFeedback) else comp


def chunk_scales(comp: Int8, x: torch.Tensor) -> torch.Tensor:
    """Each element's chunk scale max|x| / 127 (the reference of Int8)."""
    xf = x.float()
    c = -(-x.numel() // comp.chunk)
    rows = torch.nn.functional.pad(xf.abs(), (0, c * comp.chunk - x.numel())).view(c, comp.chunk)
    return (rows.amax(dim=1) / 127).double().repeat_interleave(comp.chunk)[:x.numel()]


def check_bound(comp: Compressor, x: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` (float32) is within ``comp``'s documented error of ``x``."""
    ref, got = x.double(), out.double()
    err = (got - ref).abs()
    if comp is NONE:
        assert torch.equal(out, x.float())
    elif isinstance(comp, type(FP16)):
        assert torch.all(err <= 2.0 ** (-11 if comp is FP16 else -8) * ref.abs())
    elif isinstance(comp, Int8):
        scale = chunk_scales(comp, x)
        step = scale if comp.stochastic else scale / 2
        assert torch.all(err <= step * (1 + 1e-5) + 1e-6 * scale * 127)
    elif isinstance(comp, TopK):
        k = comp.k(x.numel())
        kept = out != 0
        assert int(kept.sum()) == k
        assert torch.equal(out[kept], x[kept].float())
        if k < x.numel():
            assert x[kept].abs().min() >= x[~kept].abs().max()
    else:
        raise AssertionError(f"no bound for {comp!r}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_payload_size_dtype_and_error_bound(name, dtype, n):
    comp = COMPRESSORS[name]
    x = sample(n, dtype)
    payload, ctx = comp.compress(x, {})
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    assert payload.numel() == comp.wire_bytes(n)
    out = comp.decompress(payload, ctx)
    assert out.dtype == torch.float32 and out.shape == (n,)
    check_bound(inner(comp), x, out)


@pytest.mark.parametrize("n", [0, 7, 1021])
@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_accumulate_is_acc_plus_decompress(name, n):
    comp = COMPRESSORS[name]
    payload, ctx = comp.compress(sample(n, torch.float32), {})
    acc = torch.randn(n, generator=torch.Generator().manual_seed(1))
    expected = acc + comp.decompress(payload, ctx)
    assert torch.equal(comp.accumulate_(acc, payload, ctx), expected)
    assert torch.equal(acc, expected)


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_payload_at_any_byte_offset_decompresses(name):
    comp = COMPRESSORS[name]
    payload, ctx = comp.compress(sample(61, torch.float32), {})
    recv = torch.zeros(payload.numel() + 3, dtype=torch.uint8)
    recv[3:].copy_(payload)
    assert torch.equal(comp.decompress(recv[3:], ctx), comp.decompress(payload, ctx))


def test_wire_bytes_formulas():
    assert [Int8(chunk=256).wire_bytes(n) for n in (0, 1, 256, 257)] == [0, 5, 260, 265]
    assert [TopK(0.01).k(n) for n in (0, 1, 100, 101, 1000)] == [0, 1, 1, 2, 10]
    assert TopK(0.01).wire_bytes(1000) == 80 and TopK(1.0).wire_bytes(5) == 40


def test_int8_payload_layout_scales_then_values():
    comp, x = Int8(chunk=4), torch.tensor([1.0, -2.0, 0.5, 0.0, 127.0, 3.0])
    payload, _ = comp.compress(x)
    scales = payload[:8].view(torch.float32)
    assert torch.equal(scales, torch.tensor([2.0 / 127, 1.0]))
    assert payload[8:].view(torch.int8).tolist() == [64, -127, 32, 0, 127, 3]


def test_int8_zero_and_non_finite_chunks():
    comp = Int8(chunk=2)
    x = torch.tensor([0.0, 0.0, 1.0, math.inf, math.nan, 2.0, 3.0, -3.0, -math.inf])
    out = comp.decompress(*comp.compress(x))
    assert torch.equal(out[:2], torch.zeros(2))
    assert torch.isnan(out[2:6]).all() and torch.isnan(out[8:]).all()
    assert torch.equal(out[6:8], torch.tensor([3.0, -3.0]))


def test_int8_tiny_values_do_not_overflow():
    x = torch.tensor([1e-40, -3e-41, 0.0])
    out = Int8().decompress(*Int8().compress(x))
    assert torch.isfinite(out).all() and out[0] > 0 and out[1] < 0


def test_int8_stochastic_rounding_is_unbiased():
    comp, x, draws = Int8(chunk=64, stochastic=True), sample(1021, torch.float32, seed=3), 2000
    state = {"seed": 11}
    total = torch.zeros(x.numel(), dtype=torch.float64)
    for _ in range(draws):
        total += comp.decompress(*comp.compress(x, state)).double()
    scale = chunk_scales(comp, x)
    # per element: the rounding is Bernoulli, std <= scale / 2; the mean of `draws` within 5 sigma.
    z = (total / draws - x.double()) / (scale / 2 / math.sqrt(draws))
    assert z.abs().max() < 5.5 and abs(z.mean()) < 5 / math.sqrt(x.numel())
    nearest = Int8(chunk=64).decompress(*Int8(chunk=64).compress(x)).double()
    assert (total / draws - x.double()).abs().mean() < 0.2 * (nearest - x.double()).abs().mean()


def test_int8_stochastic_is_reproducible_per_state_seed():
    comp, x = Int8(stochastic=True), sample(1021, torch.float32)

    def run(state):
        return [comp.compress(x, state)[0] for _ in range(3)]

    a, b, c = run({"seed": 5}), run({"seed": 5}), run({"seed": 6})
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[0], a[1])
    assert torch.equal(run({})[0], run({"seed": comp.seed})[0])


def test_topk_sends_non_finite_values():
    x = torch.tensor([1.0, math.nan, -3.0, math.inf, 2.0])
    out = TopK(0.4).decompress(*TopK(0.4).compress(x))
    assert torch.isnan(out[1]) and out[3] == math.inf and torch.equal(out[[0, 2, 4]], torch.zeros(3))


BAD_INPUTS = [torch.arange(4), torch.ones(4, dtype=torch.int32), torch.ones(2, 3), torch.ones(8)[::2], [1.0, 2.0]]


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=["int64", "int32", "2-D", "strided", "list"])
@pytest.mark.parametrize("name", list(COMPRESSORS) + ["powersgd"])
def test_bad_input_raises_type_error(name, bad):
    comp = COMPRESSORS.get(name) or PowerSGD()
    with pytest.raises(TypeError):
        if name == "powersgd":
            comp.allreduce_(bad, {}, lambda t: None)
        else:
            comp.compress(bad, {})


@pytest.mark.parametrize("make", [
    lambda: Int8(chunk=0), lambda: Int8(chunk=2.5), lambda: Int8(stochastic="yes"), lambda: Int8(seed=-1),
    lambda: TopK(0), lambda: TopK(1.5), lambda: TopK(-0.1), lambda: TopK(math.nan), lambda: TopK(True),
    lambda: PowerSGD(rank=0), lambda: PowerSGD(rank=1.5), lambda: PowerSGD(min_compression_rate=-1),
    lambda: PowerSGD(min_compression_rate=math.inf), lambda: PowerSGD(orthogonalize="svd"),
    lambda: ErrorFeedback(PowerSGD()),
])
def test_bad_parameters_raise_value_error(make):
    with pytest.raises(ValueError):
        make()


def test_decompress_checks_the_payload_size():
    payload, n = Int8().compress(torch.ones(10))
    with pytest.raises(ValueError, match="expected 14"):
        Int8().decompress(payload[:-1], n)
    with pytest.raises(TypeError):
        TopK().decompress(payload.view(torch.int8), n)


@pytest.mark.parametrize("spec, kind, attrs", [
    ("int8", Int8, {"chunk": 256, "stochastic": False}), ("int8:stochastic", Int8, {"stochastic": True}),
    ("int8:1024", Int8, {"chunk": 1024}), ("topk", TopK, {"fraction": 0.01}), ("TopK:0.05", TopK, {"fraction": 0.05}),
    ("powersgd", PowerSGD, {"rank": 2}), ("powersgd:4", PowerSGD, {"rank": 4}),
])
def test_get_parses_names(spec, kind, attrs):
    comp = get(spec)
    assert isinstance(comp, kind) and all(getattr(comp, k) == v for k, v in attrs.items())
    wrapped = None if kind is PowerSGD else get(spec + "+ef")
    assert wrapped is None or (isinstance(wrapped, ErrorFeedback) and isinstance(wrapped.inner, kind))


def test_get_names_reduce_kinds_and_errors():
    assert get("int8+ef").name == "int8+ef" and get("topk+ef").reduces_by == "gather"
    assert get("int8").reduces_by == "scatter" and get("powersgd").reduces_by == "custom"
    for bad in ("powersgd+ef", "topk:0", "int8:x", "zip", "topk:"):
        with pytest.raises(ValueError):
            get(bad)
    with pytest.raises(TypeError):
        get(3)
