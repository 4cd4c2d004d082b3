"""``ringlet.torch.Pipeline`` in-process (ranks as threads): 2 and 4 stages × 1 and 2 replicas, GPipe and
1F1B, end three SGD steps where the single-process model does; the held micro-batches; compression, ZeRO
and GradScaler composing; checkpoints; the schedules' lists; every clear error."""
from __future__ import annotations

import pytest
import torch
from conftest import run_world
from pipe_cases import expected_peak, mlp, train

from ringlet.torch import Pipeline
from ringlet.torch.training.pipeline.schedules import SCHEDULES, bubble_fraction, simulate
from ringlet.torch.training.pipeline.split import even_balance
from ringlet.types import Options, RingletError

pytestmark = pytest.mark.filterwarnings("ignore:Pipeline.*micro-batches")


@pytest.mark.parametrize("stages,replicas", [(2, 1), (2, 2), (4, 1), (4, 2)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_equivalent_to_the_single_process_model(stages, replicas, schedule):
    def body(rank):
        pipe, err, losses = train(stages, schedule, tune=False)
        assert (losses[0] is not None) == pipe.is_last
        s = pipe.stats
        assert 0 < s.step_s and s.compute_s > 0 and 0 <= s.bubble < 1
        assert s.compute_end_us > 0 and bool(s.allreduce_spans) == (replicas > 1)
        assert all(0 < a <= b for a, b in s.allreduce_spans) and 0 <= s.allreduce_s < s.step_s
        return pipe.stage, err, pipe.stats.peak_inflight, expected_peak(pipe)

    for stage, err, peak, want in run_world(stages * replicas, body):
        assert err < 1e-5, (stage, err)
        assert peak == want


@pytest.mark.parametrize("how", ["fp16", "zero1", "zero2", "scaler"])
def test_composes_with_compression_zero_and_grad_scaler(how):
    kw = {"fp16": dict(compression="fp16", tune=False), "zero1": dict(zero=1), "zero2": dict(zero=2),
          "scaler": dict(scale=1024.0, tune=False)}[how]

    def body(rank):
        pipe, err, _ = train(2, "1f1b", **kw)
        return err, [p.detach().clone() for p in pipe.parameters()], pipe.stage

    res = run_world(4, body)
    for err, params, stage in res:
        assert err < (1e-2 if how == "fp16" else 1e-5), (how, stage, err)
    for a, b in ((0, 1), (2, 3)):  # the replicas of a stage stay equal
        assert all(torch.equal(p, q) for p, q in zip(res[a][1], res[b][1]))


def test_checkpoint_loads_into_the_same_layout_only():
    def body(rank):
        pipe, _, _ = train(2, "gpipe", steps=1, tune=False)
        state = pipe.state_dict()
        keys = sorted(state["module"])
        other = Pipeline(mlp(), 2, 4)
        other.load_state_dict(state)
        same = all(torch.equal(p, q) for p, q in zip(pipe.parameters(), other.parameters()))
        moved = Pipeline(mlp(), 2, 4, balance=[3, 6])
        with pytest.raises(ValueError, match="same layout"):
            moved.load_state_dict(state)
        with pytest.raises(ValueError, match="not a Pipeline state dict"):
            moved.load_state_dict(state["module"])
        return pipe.stage, keys, same

    (s0, k0, same0), (s1, k1, same1) = run_world(2, body)
    assert same0 and same1 and s0 == 0 and s1 == 1
    assert sorted(k0 + k1) == sorted(mlp().state_dict())  # the stages' keys are the whole model's


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedules_run_every_microbatch_without_deadlock(name):
    for stages in range(1, 6):
        for m in range(1, 9):
            peak = simulate(SCHEDULES[name], stages, m)
            assert peak == [m if name == "gpipe" else min(stages - s, m) for s in range(stages)]
    assert bubble_fraction(4, 12) == 3 / 15


def test_even_balance_by_parameters():
    assert even_balance([10, 0, 10, 0, 10, 0, 10, 0], 2) == [4, 4]
    assert even_balance([1, 100, 1, 1], 2) == [2, 2]
    assert even_balance([0, 0, 0, 0, 0], 2) == [3, 2]
    assert even_balance([30, 0, 10, 0, 10, 0, 10], 2) == [2, 5]


def test_construction_errors():
    def body(rank):
        net = mlp()
        cases = [((torch.nn.Linear(2, 2), 2, 2), TypeError, "nn.Sequential"),
                 ((net, 3, 2), ValueError, "do not divide the world"),
                 ((torch.nn.Sequential(torch.nn.Linear(2, 2)), 2, 2), ValueError, "fewer than the 2 stages"),
                 ((net, 2, 2, "1f1b", [4, 4]), ValueError, "sums to 8 layers"),
                 ((net, 2, 2, "1f1b", [9]), ValueError, "1 entries for 2 stages"),
                 ((net, 2, 2, "1f1b", [0, 9]), ValueError, "empty stage"),
                 ((net, 2, 0), ValueError, "microbatches must be a positive int"),
                 ((net, 2, 2, "interleaved"), ValueError, "schedule must be one of")]
        for args, exc, msg in cases:
            with pytest.raises(exc, match=msg):
                Pipeline(*args)
        with pytest.warns(UserWarning, match="bubble"):
            pipe = Pipeline(net, 2, 1)
        with pytest.raises(ValueError, match="compression and DDP options need sync_replicas"):
            Pipeline(net, 2, 2, sync_replicas=False, compression="fp16")
        return pipe.stage

    assert run_world(2, body) == [0, 1]


def test_step_errors():
    def body(rank):
        pipe = Pipeline(mlp(), 1, 2)
        with pytest.raises(ValueError, match="needs x as a tensor"):
            pipe.step(None, torch.zeros(4, 3), torch.nn.functional.mse_loss)
        with pytest.raises(ValueError, match="not divisible into 2 micro-batches"):
            pipe.step(torch.zeros(3, 6), torch.zeros(3, 3), torch.nn.functional.mse_loss)
        with pytest.raises(ValueError, match="x has 4 rows but y has 2"):
            pipe.step(torch.zeros(4, 6), torch.zeros(2, 3), torch.nn.functional.mse_loss)
        return True

    assert run_world(2, body) == [True, True]


def test_mismatched_batches_across_stages_raise_on_the_last_stage_and_time_out_before_it():
    def body(rank):
        pipe = Pipeline(mlp(), 2, 2)
        x, y = torch.zeros(4, 6), torch.zeros(6, 3)
        try:
            pipe.step(x if pipe.is_first else None, y if pipe.is_last else None, torch.nn.functional.mse_loss)
        except (ValueError, RingletError) as exc:
            with pytest.raises(RuntimeError, match="earlier step of this pipeline failed") as later:
                pipe.step(x, y, torch.nn.functional.mse_loss)
            return type(exc).__name__, str(exc) + str(later.value)
        return None

    (e0, m0), (e1, m1) = run_world(2, body, options=Options(timeout=0.5))
    assert e1 == "ValueError" and "same batch size" in m1 and "cannot run another" in m1
    assert e0 == "CollectiveTimeout" and "rank 1" in m0


def test_a_smaller_batch_in_a_later_step_is_agreed_anew():
    def body(rank):
        pipe = Pipeline(mlp(), 2, 2)
        ref = mlp()
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (pipe.module, ref)]
        g = torch.Generator().manual_seed(3)
        for rows in (8, 4, 8):
            x, y = torch.randn(rows, 6, generator=g), torch.randn(rows, 3, generator=g)
            for o in opts:
                o.zero_grad()
            pipe.step(x if pipe.is_first else None, y if pipe.is_last else None, torch.nn.functional.mse_loss)
            torch.nn.functional.mse_loss(ref(x), y).backward()
            for o in opts:
                o.step()
        want = dict(ref.named_parameters())
        return max(float((p.detach() - want[k].detach()).abs().max()) for k, p in pipe.named_parameters())

    assert max(run_world(2, body)) < 1e-5


class _Shrinks(torch.nn.Module):
    """Drops a row from its second call on: micro-batches of one step with different output shapes."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x if self.calls == 1 else x[:-1]


def test_a_microbatch_of_another_shape_is_a_clear_error_on_its_stage():
    def body(rank):
        net = torch.nn.Sequential(torch.nn.Linear(6, 6), _Shrinks(), torch.nn.Linear(6, 3))
        pipe = Pipeline(net, 2, 2, balance=[2, 1])
        try:
            pipe.step(torch.zeros(4, 6) if pipe.is_first else None, torch.zeros(4, 3) if pipe.is_last else None,
                      torch.nn.functional.mse_loss)
        except (ValueError, RingletError) as exc:
            return type(exc).__name__, str(exc)
        return None

    (e0, m0), (e1, _) = run_world(2, body, options=Options(timeout=0.5))
    assert e0 == "ValueError" and "every micro-batch of a step must send the same shape" in m0
    assert e1 == "CollectiveTimeout"
