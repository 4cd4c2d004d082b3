"""ringlet.torch.MoE on in-process worlds (ranks as threads): output, aux loss, dropped counts and gate and
expert gradients equal an independent single-process reference (``moe_cases``) for ep_size 2 and 4, k 1
and 2, with and without drops; the wrapping helpers average expert gradients over their replicas only and
dense ones over the world, so SGD steps equal the reference's on all ranks' batches; bad arguments raise."""
from __future__ import annotations

import pytest
import torch
from conftest import run_world
from moe_cases import E, H, check_training, check_unwrapped, expert_module

import ringlet
from ringlet.torch import MoE


@pytest.mark.parametrize("world,ep", [(2, 2), (4, 4), (4, 2)])
def test_matches_reference(world, ep):
    def fn(rank):
        errs = []
        for k in (1, 2):
            for cf in (16.0, 0.5):  # nothing dropped; at least 4 (k=1) or 8 (k=2) of 12 tokens dropped
                errs += check_unwrapped(ep, k, cf)
        return errs

    assert run_world(world, fn) == [[]] * world


def test_drops_are_counted():
    def fn(rank):
        moe = MoE(H, expert_module(), E, k=2, capacity_factor=0.25, min_capacity=1)
        out, _ = moe(torch.randn(40, H))
        s = moe.stats
        zero_rows = int((out.abs().sum(1) == 0).sum())
        return s["tokens"], s["capacity"], s["dropped"], sum(s["load"]), s["dropped_tokens"], zero_rows

    # 80 assignments into 8 experts x 3 slots: at least 56 dropped, at least 16 tokens get no expert (zeros).
    for tokens, cap, dropped, load, dropped_tokens, zero_rows in run_world(2, fn):
        assert (tokens, cap, load) == (40, 3, 80) and dropped >= 56 and zero_rows == dropped_tokens >= 16


@pytest.mark.parametrize("world,ep", [(4, 2), (2, 2)])
def test_moe_parallel_averages_over_groups(world, ep):
    def fn(rank):
        return check_training(ep, 2, 16.0, steps=2) + check_training(ep, 1, 0.5, steps=1, accumulate=True)

    assert run_world(world, fn) == [[]] * world


def test_moe_zero_optimizers():
    def fn(rank):
        return check_training(2, 2, 16.0, zero_stage=1) + check_training(2, 1, 16.0, zero_stage=2, accumulate=True)

    assert run_world(4, fn) == [[]] * 4


def test_layer_on_a_subgroup():
    """Ranks 0-3 of 5 hold the layers; rank 4 creates their groups all the same, so that the world's later
    groups and collectives still line up."""
    from ringlet.torch.training.experts import expert_groups

    def fn(rank):
        span = ringlet.new_group([0, 1, 2, 3])
        errs = []
        if rank == 4:
            errs += [] if expert_groups(2, span) is None else ["rank 4 got groups"]
            with pytest.raises(ValueError, match="not a member"):
                MoE(H, expert_module(), E, ep_size=2, group=span)
        else:
            errs += check_training(2, 2, 16.0, group=span)
        everyone = ringlet.new_group(range(5))
        return errs + [ringlet.allreduce(torch.ones(1), group=everyone).item()]

    assert run_world(5, fn) == [[5.0]] * 5


def test_bad_arguments():
    def fn(rank):
        msgs = []
        for kw in [dict(ep_size=3), dict(num_experts=6), dict(k=3), dict(capacity_factor=0), dict(ep_size=0),
                   dict(hidden_size=0), dict(group="world")]:
            args = dict(hidden_size=H, expert=expert_module(), num_experts=E, ep_size=4)
            args.update(kw)
            with pytest.raises(ValueError) as info:
                MoE(**args)
            msgs.append(str(info.value))
        moe = MoE(H, expert_module(), E)
        with pytest.raises(ValueError, match=r"inputs \[\.\.\., 6\]"):
            moe(torch.randn(3, H + 1))
        with pytest.raises(ValueError, match="no ringlet.torch.MoE"):
            ringlet.torch.moe_parallel(torch.nn.Linear(2, 2))
        return msgs

    msgs = run_world(4, fn)[0]
    assert "ep_size 3 does not divide the 4 ranks" in msgs[0]
    assert "num_experts (6) must be divisible by ep_size (4)" in msgs[1]
    assert "k must be 1" in msgs[2] and "capacity_factor" in msgs[3] and "ep_size must be" in msgs[4]
