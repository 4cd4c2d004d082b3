"""Top-k's selection on large inputs (a sampled threshold first) gives torch.topk's set."""
import math

import pytest
import torch

from ringlet.compression.topk import SAMPLED_FROM, TopK, top_indices


def _same_set(mag: torch.Tensor, k: int) -> bool:
    got = top_indices(mag, k).sort().values
    want = torch.topk(mag, k, sorted=False).indices.sort().values
    return torch.equal(got, want)


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1])
def test_sampled_selection_is_exact(fraction):
    n = SAMPLED_FROM + 12345
    mag = torch.randn(n, generator=torch.Generator().manual_seed(1)).abs()
    assert _same_set(mag, math.ceil(fraction * n))


def test_misleading_sample_falls_back():
    # The large entries sit exactly where the stride never looks, so the sample's threshold admits too few.
    n = SAMPLED_FROM * 2
    mag = torch.zeros(n)
    stride = max(1, n // (1 << 16))
    big = torch.arange(1, n, stride)[:5000]
    mag[big] = torch.arange(1, big.numel() + 1, dtype=torch.float32)
    assert _same_set(mag, 3000)


def test_non_finite_always_selected():
    n = SAMPLED_FROM + 7
    x = torch.randn(n, generator=torch.Generator().manual_seed(2))
    x[[5, 77777]] = float("nan")
    x[123] = float("inf")
    payload, ctx = TopK(0.01).compress(x, {})
    idx = set(payload[:4 * TopK(0.01).k(n)].view(torch.int32).tolist())
    assert {5, 77777, 123} <= idx


def test_state_buffer_is_reused():
    comp, state, x = TopK(0.01), {}, torch.randn(SAMPLED_FROM)
    comp.compress(x, state)
    buf = state["abs"]
    comp.compress(x * 2, state)
    assert state["abs"] is buf
