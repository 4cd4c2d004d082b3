"""The real ZeroOptimizer through ``zero.checkpoint``: saved with one world size and stage, loaded with another, consolidated into a plain model that continues exactly as the
sharded one; an asynchronous save continues bitwise as the uninterrupted run."""
import pytest
import torch
import torch.nn.functional as F

from conftest import run_world
from zero_cases import OPTIMIZERS, Config, batch, flat_params, make_model, snapshot, train_zero

from ringlet.torch.training.zero import checkpoint as zckpt


def mod(net, stage):
    """The module for the checkpoint's module state (under stage 3 it holds placeholders: still fine)."""
    return net


def steps(rank, net, zero, first, n):
    for s in range(first, first + n):
        x, y = batch(rank, s)
        F.mse_loss(net(x), y).backward()
        zero.step()
        zero.zero_grad()
    return snapshot(net, zero)


@pytest.mark.parametrize("before, after", [((2, 1), (3, 2)), ((4, 2), (2, 1)), ((3, 2), (2, 3)), ((2, 3), (3, 1))])
def test_save_load_other_world_and_stage(tmp_path, before, after):
    (w0, s0), (w1, s1) = before, after
    path = tmp_path / "ckpt"

    def first(rank):
        net, zero = train_zero(rank, Config(stage=s0, steps=3, bucket_bytes=128))
        zckpt.save(path, zero, mod(net, s0), extra={"step": 3})
        return snapshot(net, zero)
    saved = run_world(w0, first)[0]

    def second(rank):
        net, zero = train_zero(rank, Config(stage=s1, steps=0, bucket_bytes=200))
        assert zckpt.load(path, zero, mod(net, s1)) == {"step": 3}
        return snapshot(net, zero), zero.shard_state()
    out = run_world(w1, second)
    assert all(torch.equal(o[0], saved) for o in out)
    full = zckpt.consolidate(path)
    states = {(p.name, p.start, p.end): p for o in out for p in o[1].pieces}
    for (name, a, b), p in states.items():
        st = full["optimizer"]["state"][name]
        assert torch.equal(st["exp_avg"].reshape(-1)[a:b], p.state["exp_avg"])
        assert float(st["step"]) == float(p.state["step"]) == 3.0


@pytest.mark.parametrize("stage", [1, 2])
def test_consolidated_plain_model_continues_like_zero(tmp_path, stage):
    path = tmp_path / "ckpt"

    def body(rank):
        net, zero = train_zero(rank, Config(stage=stage, steps=2))
        zckpt.save(path, zero, net)
        return steps(rank, net, zero, 2, 2)
    sharded = run_world(1, body)[0]
    full = zckpt.consolidate(path)
    plain = make_model()
    plain.load_state_dict(full["model"])
    cls, kw = OPTIMIZERS["adam"]
    opt = cls(plain.parameters(), **kw)
    zckpt.load_into_torch_optimizer(full, opt, plain)
    for s in range(2, 4):
        x, y = batch(0, s)
        F.mse_loss(plain(x), y).backward()
        opt.step()
        opt.zero_grad()
    assert torch.equal(flat_params(plain), sharded)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_async_save_continues_bitwise(tmp_path, stage):
    path = tmp_path / "ckpt"

    def body(rank):
        net, zero = train_zero(rank, Config(stage=stage, steps=2))
        handle = zckpt.save_async(path, zero, mod(net, stage))
        ref = steps(rank, net, zero, 2, 3)  # training goes on; its first step waits for the shard copy
        handle.wait()
        assert handle.snapshot_seconds > 0 and handle.blocked_seconds >= 0
        assert not zero._optimizer_step_pre_hooks  # the copy's step hook removed itself
        net2, zero2 = train_zero(rank, Config(stage=stage, steps=0))
        zckpt.load(path, zero2, mod(net2, stage))
        return torch.equal(steps(rank, net2, zero2, 2, 3), ref)
    assert all(run_world(2, body))
