"""PowerSGD's own schedule, run by p = 1..5 simulated ranks: one thread per rank, and an all-reduce that
sums every rank's tensor in rank order (so each rank gets the same bits, as a real one gives)."""
from __future__ import annotations

import math
import threading

import pytest
import torch

from ringlet.compression import PowerSGD, rescale_residuals_


class Group:
    """``p`` ranks in threads; ``allreduce(rank)`` is that rank's in-place float32 SUM, recording sizes."""

    def __init__(self, p: int):
        self.p = p
        self.barrier = threading.Barrier(p, timeout=30)
        self.slots: list[torch.Tensor | None] = [None] * p
        self.sizes: list[list[int]] = [[] for _ in range(p)]

    def allreduce(self, rank: int):
        def fn(t: torch.Tensor) -> None:
            assert t.dtype == torch.float32 and t.dim() == 1
            self.sizes[rank].append(t.numel())
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = self.slots[0].clone()
            for other in self.slots[1:]:
                total += other
            self.barrier.wait()  # every rank has read the slots before any overwrites its own
            t.copy_(total)
        return fn

    def run(self, fn):
        """``fn(rank, allreduce)`` on every rank at once; the results in rank order."""
        out, errors = [None] * self.p, []

        def body(rank):
            try:
                out[rank] = fn(rank, self.allreduce(rank))
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.p)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out


def flat_inputs(p: int, shapes, seed: int, dtype=torch.float32) -> list[torch.Tensor]:
    n = sum(math.prod(s) for s in shapes)
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype) for _ in range(p)]


def step(comp: PowerSGD, group: Group, inputs, states, shapes):
    """One allreduce_ on every rank (inputs are copied); the ranks' outputs."""
    return group.run(lambda r, ar: comp.allreduce_(inputs[r].clone(), states[r], ar, shapes))


def exact_sum(inputs) -> torch.Tensor:
    total = inputs[0].float().clone()
    for x in inputs[1:]:
        total += x.float()
    return total


@pytest.mark.parametrize("ortho", ["gram_schmidt", "qr"])
@pytest.mark.parametrize("shape", [(6, 4), (3, 8), (5, 2, 3)])
@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_full_rank_reproduces_the_sum(p, shape, ortho):
    comp = PowerSGD(rank=8, min_compression_rate=0, orthogonalize=ortho)
    assert comp.plan([shape])[0].rank == min(shape[0], math.prod(shape[1:]))
    group, states = Group(p), [{} for _ in range(p)]
    for seed in range(3):
        inputs = flat_inputs(p, [shape], seed)
        outs = step(comp, group, inputs, states, [shape])
        torch.testing.assert_close(outs[0], exact_sum(inputs), rtol=1e-5, atol=1e-5)
        assert all(torch.equal(o, outs[0]) for o in outs)


@pytest.mark.parametrize("p", [1, 2, 4])
def test_matrices_of_low_rank_are_exact(p):
    rank, shape = 2, (20, 30)
    g = torch.Generator().manual_seed(7)
    left = torch.randn(20, rank, generator=g)
    inputs = [(left @ torch.randn(rank, 30, generator=g)).reshape(-1) for _ in range(p)]
    comp, group, states = PowerSGD(rank=rank), Group(p), [{} for _ in range(p)]
    assert comp.plan([shape])[0].rank == rank
    outs = step(comp, group, inputs, states, [shape])
    torch.testing.assert_close(outs[0], exact_sum(inputs), rtol=1e-5, atol=1e-5)
    for s in states:
        assert s["residual"].abs().max() < 1e-5


@pytest.mark.parametrize("p", [1, 3, 5])
def test_uncompressed_tensors_are_summed_exactly(p):
    shapes = [(7,), (3, 3), (5,), (2, 100)]  # 1-D, then two matrices not worth compressing at rank 2
    comp, group = PowerSGD(), Group(p)
    assert all(part.rank == 0 for part in comp.plan(shapes))
    inputs = flat_inputs(p, shapes, 0)
    outs = step(comp, group, inputs, [{} for _ in range(p)], shapes)
    assert all(torch.equal(o, exact_sum(inputs)) for o in outs)
    assert group.sizes == [[inputs[0].numel()]] * p  # one call: nothing to compress


def test_mixed_shapes_sizes_telescoping_and_agreement():
    p, steps = 3, 6
    shapes = [(4,), (16, 3, 3, 3), (32, 10), (5,), (8, 9), (2, 100)]
    comp, group, states = PowerSGD(rank=2), Group(p), [{} for _ in range(p)]
    assert [part.rank for part in comp.plan(shapes)] == [0, 2, 2, 0, 2, 0]
    given = torch.zeros(sum(math.prod(s) for s in shapes), dtype=torch.float64)
    got = torch.zeros_like(given)
    for seed in range(steps):
        inputs = flat_inputs(p, shapes, seed)
        outs = step(comp, group, inputs, states, shapes)
        assert all(torch.equal(o, outs[0]) for o in outs)
        assert all(all(torch.equal(q, q0) for q, q0 in zip(s["q"], states[0]["q"])) for s in states)
        given += exact_sum(inputs).double()
        got += outs[0].double()
    left = sum(s["residual"].double() for s in states)
    torch.testing.assert_close(got, given - left, rtol=0, atol=1e-4)
    per_step = [n * 4 for n in group.sizes[0][:2]]
    assert sum(per_step) == comp.wire_bytes_for(shapes) == 4 * (4 + 5 + 200 + 2 * (16 + 27) + 2 * (32 + 10) + 2 * (8 + 9))
    assert group.sizes[0] == group.sizes[1] and len(group.sizes[0]) == 2 * steps


def test_warm_start_keeps_q_and_cold_start_draws_it():
    shapes, group = [(20, 30)], Group(2)
    warm, cold = [{}, {}], [{}, {}]
    for seed in range(2):
        inputs = flat_inputs(2, shapes, seed)
        step(PowerSGD(), group, inputs, warm, shapes)
        step(PowerSGD(warm_start=False), group, inputs, cold, shapes)
    assert warm[0]["q"][0].shape == (2, 30) and "q" not in cold[0]  # Q^T, rows contiguous


def test_input_dtypes_are_written_back():
    shapes = [(12, 10), (3,)]
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        inputs = flat_inputs(2, shapes, 0, dtype)
        outs = step(PowerSGD(rank=2), Group(2), inputs, [{}, {}], shapes)
        assert outs[0].dtype == dtype and torch.isfinite(outs[0]).all()
        torch.testing.assert_close(outs[0][-3:].float(), exact_sum(inputs)[-3:], rtol=1e-2, atol=1e-2)


def test_zero_and_non_finite_gradients_recover():
    shapes, group, states = [(10, 10)], Group(2), [{}, {}]
    comp = PowerSGD(rank=2, min_compression_rate=1)
    zeros = [torch.zeros(100), torch.zeros(100)]
    assert all(torch.equal(o, torch.zeros(100)) for o in step(comp, group, zeros, states, shapes))
    bad = flat_inputs(2, shapes, 1)
    bad[1][5] = math.inf
    assert torch.isnan(step(comp, group, bad, states, shapes)[0]).all()
    assert all(torch.isfinite(s["residual"]).all() for s in states)
    inputs = flat_inputs(2, shapes, 2)
    outs = step(comp, group, inputs, states, shapes)
    assert torch.isfinite(outs[0]).all() and all(torch.isfinite(q).all() for q in states[0]["q"])


def test_rescale_finds_the_residual_and_no_error_feedback_keeps_none():
    shapes, inputs = [(20, 30)], flat_inputs(2, [(20, 30)], 0)
    states = [{}, {}]
    step(PowerSGD(), Group(2), inputs, states, shapes)
    before = states[0]["residual"].clone()
    assert rescale_residuals_(states[0], 2.0) == 1 and torch.equal(states[0]["residual"], 2 * before)
    plain = [{}, {}]
    step(PowerSGD(error_feedback=False), Group(2), inputs, plain, shapes)
    assert "residual" not in plain[0]


def test_seed_in_state_decides_q():
    shapes, inputs = [(20, 30)], flat_inputs(1, [(20, 30)], 0)
    a, b, c = [{"seed": 1}], [{"seed": 1}], [{"seed": 2}]
    outs = [step(PowerSGD(), Group(1), inputs, s, shapes)[0] for s in (a, b, c)]
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_errors():
    comp, ar = PowerSGD(), (lambda t: None)
    with pytest.raises(ValueError, match="shapes hold 6"):
        comp.allreduce_(torch.ones(7), {}, ar, [(2, 3)])
    state = {}
    comp.allreduce_(torch.ones(6), state, ar, [(2, 3)])
    with pytest.raises(ValueError, match="shapes"):
        comp.allreduce_(torch.ones(6), state, ar, [(3, 2)])
    with pytest.raises(ValueError):
        comp.plan([(2, -1)])
    with pytest.raises(TypeError):
        comp.allreduce_(torch.ones(6), None, ar)
    with pytest.raises(NotImplementedError, match="allreduce_"):
        comp.compress(torch.ones(6))
    with pytest.raises(NotImplementedError):
        comp.decompress(torch.ones(6, dtype=torch.uint8), 6)
    assert comp.wire_bytes(6) == 24 and comp.wire_bytes_for([(6,)]) == 24
