"""ErrorFeedback: the residual telescopes, top-k with error feedback trains where plain top-k stalls,
residuals rescale and reset (nested states included), and misuse raises."""
from __future__ import annotations

import math

import pytest
import torch

from ringlet.compression import (FP16, NONE, ErrorFeedback, Int8, TopK, rescale_residuals_, reset_residuals_)

INNERS = {"int8": Int8(chunk=16), "int8:stochastic": Int8(chunk=16, stochastic=True), "topk": TopK(0.05),
          "fp16": FP16, "none": NONE}


@pytest.mark.parametrize("name", list(INNERS))
def test_sent_values_telescope_to_inputs_minus_residual(name):
    comp, state, steps = ErrorFeedback(INNERS[name]), {"seed": 1}, 25
    g = torch.Generator().manual_seed(0)
    sent = torch.zeros(301, dtype=torch.float64)
    given = torch.zeros(301, dtype=torch.float64)
    for _ in range(steps):
        x = torch.randn(301, generator=g, dtype=torch.float64)
        given += x
        sent += comp.decompress(*comp.compress(x, state)).double()
    assert state["residual"].dtype == torch.float64
    torch.testing.assert_close(sent, given - state["residual"], rtol=0, atol=1e-12)


def test_residual_is_what_the_inner_compressor_dropped():
    comp, state, x = ErrorFeedback(TopK(0.25)), {}, torch.tensor([4.0, -1.0, 0.5, 3.0, 0.0, 2.0, -8.0, 1.0])
    payload, ctx = comp.compress(x, state)
    assert torch.equal(comp.decompress(payload, ctx), torch.tensor([4.0, 0, 0, 0, 0, 0, -8, 0]))
    assert torch.equal(state["residual"], torch.tensor([0.0, -1, 0.5, 3, 0, 2, 0, 1]))
    comp.compress(torch.zeros(8), state)  # the residual alone is compressed next: 3 and 2 go
    assert torch.equal(state["residual"], torch.tensor([0.0, -1, 0.5, 0, 0, 0, 0, 1]))


def test_first_step_equals_the_inner_compressor_and_low_precision_inputs_work():
    x = torch.randn(100, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    state = {}
    p, ctx = ErrorFeedback(Int8()).compress(x, state)
    assert torch.equal(p, Int8().compress(x)[0]) and state["residual"].dtype == torch.float32


def _train(comp, steps: int = 400, n: int = 200, lr: float = 0.01, bias: float = 5.0):
    """SGD on 0.5 |w - target|^2 by two workers whose gradients carry opposite biases ``±bias`` on two
    coordinates (heterogeneous data); each worker compresses its gradient, the mean of the
    decompressed ones is applied. Returns (final loss, initial loss)."""
    g = torch.Generator().manual_seed(0)
    target = torch.randn(n, generator=g, dtype=torch.float64)
    push = torch.zeros(n, dtype=torch.float64)
    push[:2] = bias
    w, states = torch.zeros(n, dtype=torch.float64), [{}, {}]
    for _ in range(steps):
        step = sum(comp.decompress(*comp.compress(w - target + sign * push, state)).double()
                   for sign, state in zip((1, -1), states))
        w -= lr * step / 2
    return 0.5 * float((w - target).square().sum()), 0.5 * float(target.square().sum())


def test_error_feedback_converges_where_plain_topk_stalls():
    # Plain top-1%: each worker always sends its two biased coordinates, which cancel in the mean.
    plain, start = _train(TopK(0.01))
    fed, _ = _train(ErrorFeedback(TopK(0.01)))
    assert plain > 0.9 * start
    assert fed < 0.01 * start


def test_rescale_and_reset_find_nested_residuals():
    comp = ErrorFeedback(TopK(0.5))
    bucket = {"blocks": [{"scatter": {}}, {"scatter": {}}], "gather": {}}
    for d in (bucket["blocks"][0]["scatter"], bucket["blocks"][1]["scatter"], bucket["gather"]):
        comp.compress(torch.tensor([1.0, 2.0, 3.0, 4.0]), d)
    before = bucket["gather"]["residual"].clone()
    assert rescale_residuals_(bucket, 0.5) == 3
    assert torch.equal(bucket["gather"]["residual"], before * 0.5)
    assert comp.rescale_(bucket["gather"], 4.0) == 1 and torch.equal(bucket["gather"]["residual"], before * 2)
    assert reset_residuals_(bucket) == 3 and "residual" not in bucket["gather"]
    assert ErrorFeedback.reset_(bucket) == 0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            rescale_residuals_(bucket, bad)


def test_non_finite_inputs_reach_the_payload_but_not_the_residual():
    comp, state = ErrorFeedback(Int8(chunk=2)), {}
    out = comp.decompress(*comp.compress(torch.tensor([1.0, math.inf, 2.0, 3.0]), state))
    assert torch.isnan(out[:2]).all() and torch.isfinite(state["residual"]).all()
    out = comp.decompress(*comp.compress(torch.tensor([1.0, 1.0, 2.0, 3.0]), state))
    assert torch.isfinite(out).all()


def test_misuse():
    comp = ErrorFeedback(Int8())
    state = {}
    comp.compress(torch.ones(10), state)
    with pytest.raises(ValueError, match="10"):
        comp.compress(torch.ones(11), state)
    with pytest.raises(TypeError):
        comp.compress(torch.ones(10), None)
    with pytest.raises(TypeError):
        ErrorFeedback("int8")


def test_seed_is_passed_to_the_inner_state():
    comp, x = ErrorFeedback(Int8(stochastic=True)), torch.randn(500, generator=torch.Generator().manual_seed(4))
    a, b, c = {"seed": 3}, {"seed": 3}, {"seed": 4}
    pa, pb, pc = (comp.compress(x, s)[0] for s in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc) and a["inner"]["seed"] == 3
