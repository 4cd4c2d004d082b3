"""ringlet.torch.GradScaler against torch.amp.GradScaler on one rank (same scales, trackers, parameters
and state dicts for the same overflow pattern, unscale before clipping), its errors and callbacks; the
agreement over ranks in-process (core queue and coordinator); MasterWeights' contract."""
from __future__ import annotations

import pickle
import threading

import pytest
import torch
from conftest import run_world
from hvd_world import hvd_world

from ringlet.torch import GradScaler, MasterWeights

INF_STEPS = {2, 3, 9}  # overflows injected on these steps


_SEED_LOCK = threading.Lock()  # in-process ranks are threads sharing torch's global generator


def net(dtype=torch.float32) -> torch.nn.Module:
    with _SEED_LOCK:
        torch.manual_seed(7)
        return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(dtype)


def train(scaler, model, steps: int = 14, clip: float | None = None, inf_steps=INF_STEPS, poison=float("inf")):
    """Scaled training with overflows injected on ``inf_steps``; (scale, tracker) after every update."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    trace = []
    for step in range(steps):
        opt.zero_grad()
        x = torch.randn(4, 5, generator=g)
        scaler.scale(model(x).square().mean()).backward()
        if step in inf_steps:
            model[0].weight.grad[0, 0] = poison
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(opt)
        scaler.update()
        trace.append((scaler.get_scale(), scaler._get_growth_tracker()))
    return trace


def one_rank(fn):
    return run_world(1, lambda rank: fn())[0]


KW = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)


@pytest.mark.parametrize("clip", [None, 0.5], ids=["plain", "unscale_then_clip"])
@pytest.mark.parametrize("poison", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_same_scales_and_parameters_as_torch(clip, poison):
    ours_model, torch_model = net(), net()
    ours = one_rank(lambda: train(GradScaler(**KW), ours_model, clip=clip, poison=poison))
    ref = torch.amp.GradScaler("cpu", **KW)
    theirs = train(ref, torch_model, clip=clip, poison=poison)
    assert ours == theirs
    assert [s for s, _ in ours][:5] == [2.0**10, 2.0**10, 2.0**9, 2.0**8, 2.0**8]  # two backoffs
    assert max(s for s, _ in ours) > 2.0**8  # grew after three clean steps
    for p, q in zip(ours_model.parameters(), torch_model.parameters()):
        assert torch.equal(p, q)


def test_odd_factors_round_like_torch():
    kw = dict(init_scale=3.3, growth_factor=1.7, backoff_factor=0.37, growth_interval=2)
    ours = one_rank(lambda: train(GradScaler(**kw), net()))
    assert ours == train(torch.amp.GradScaler("cpu", **kw), net())


def test_state_dict_matches_torch_and_round_trips():
    ours = GradScaler(**KW)
    ref = torch.amp.GradScaler("cpu", **KW)
    one_rank(lambda: train(ours, net(), steps=5))
    train(ref, net(), steps=5)
    assert ours.state_dict() == ref.state_dict()
    fresh = GradScaler()
    fresh.load_state_dict(ref.state_dict())  # torch's checkpoints load into ours, and ours into torch's
    assert fresh.state_dict() == ours.state_dict()
    back = torch.amp.GradScaler("cpu")
    back.load_state_dict(ours.state_dict())
    assert back.state_dict() == ours.state_dict()
    # Continues identically: the rest of one run equals a fresh scaler loaded from the checkpoint.
    m1, m2 = net(), net()
    assert one_rank(lambda: train(ours, m1, steps=6)) == one_rank(lambda: train(fresh, m2, steps=6))
    assert pickle.loads(pickle.dumps(ours)).state_dict() == ours.state_dict()


def test_errors_like_torch():
    def run():
        scaler, model = GradScaler(), net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(AssertionError, match="No inf checks"):
            scaler.update()
        scaler.scale(model(torch.ones(2, 5)).sum()).backward()
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="already been called"):
            scaler.unscale_(opt)
        scaler.step(opt)
        with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
            scaler.step(opt)
        with pytest.raises(RuntimeError, match="after step"):
            scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="Closure"):
            scaler.step(opt, closure=lambda: 0.0)
        scaler.update()
        half = net(torch.float16)
        hopt = torch.optim.SGD(half.parameters(), lr=0.1)
        half(torch.ones(2, 5, dtype=torch.float16)).sum().backward()
        with pytest.raises(ValueError, match="FP16"):
            scaler.unscale_(hopt)

    one_rank(run)
    for bad in (dict(growth_factor=1.0), dict(backoff_factor=1.0), dict(backoff_factor=0.0),
                dict(growth_interval=0)):
        with pytest.raises(ValueError):
            GradScaler(**bad)


def test_disabled_is_a_pass_through():
    scaler, model = GradScaler(enabled=False), net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.ones(2, 5)).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {} and not scaler.is_enabled()


def test_scale_keeps_containers_and_dtype():
    scaler = GradScaler(init_scale=4.0)
    a, b = torch.ones(2, dtype=torch.bfloat16), torch.ones(3)
    out = scaler.scale([a, (b, b)])
    assert isinstance(out, list) and isinstance(out[1], tuple)
    assert out[0].dtype == torch.bfloat16 and torch.equal(out[1][0], 4 * b)
    with pytest.raises(ValueError):
        scaler.scale(3.0)


def test_scale_change_callbacks():
    calls = []

    def run():
        scaler = GradScaler(**KW)
        handle = scaler.on_scale_change(lambda old, new: calls.append((old, new)))
        train(scaler, net(), steps=8)
        scaler.update(new_scale=7.0)  # an explicit scale counts as a change
        handle.remove()
        scaler.update(new_scale=torch.tensor(3.0))
        return scaler.get_scale()

    assert one_rank(run) == 3.0
    assert calls == [(1024.0, 512.0), (512.0, 256.0), (256.0, 512.0), (512.0, 7.0)]


def test_residuals_follow_the_scale():
    class Owner:  # what a ringlet DDP offers: a list of per-bucket compressor states
        def __init__(self):
            self.compression_states = [{"residual": torch.ones(3)}, {("ag", 0): {"residual": torch.ones(2)}}]

    owner = Owner()

    def run():
        scaler = GradScaler(**KW)
        scaler.rescale_residuals_of(owner)
        scaler.update(new_scale=KW["init_scale"] / 4)
        return scaler.get_scale()

    one_rank(run)
    assert torch.equal(owner.compression_states[0]["residual"], torch.full((3,), 0.25))
    assert torch.equal(owner.compression_states[1][("ag", 0)]["residual"], torch.full((2,), 0.25))


@pytest.mark.parametrize("coordinated", [False, True], ids=["core", "coordinator"])
def test_one_rank_overflow_skips_every_rank(coordinated):
    """Ranks as threads: an inf in rank 1's gradient only; every rank skips and backs off together."""
    def fn(rank):
        model = net()
        scaler = GradScaler(init_scale=8.0, growth_interval=2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        history = []
        for step in range(4):
            opt.zero_grad()
            before = [p.detach().clone() for p in model.parameters()]
            scaler.scale(model(torch.ones(2, 5)).sum()).backward()
            if step == 1 and rank == 1:
                model[2].bias.grad[0] = float("inf")
            scaler.step(opt)
            scaler.update()
            moved = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
            history.append((moved, scaler.get_scale()))
        return history

    res = (hvd_world if coordinated else run_world)(3, fn)
    assert res[0] == res[1] == res[2] == [(True, 8.0), (False, 4.0), (True, 4.0), (True, 8.0)]


def test_master_weights_step_in_float32():
    def run():
        low = net(torch.bfloat16)
        ref = net(torch.bfloat16)
        masters_ref = [p.detach().float() for p in ref.parameters()]
        opt = MasterWeights(torch.optim.SGD(low.parameters(), lr=1e-3, momentum=0.9))
        ref_opt = torch.optim.SGD(masters_ref, lr=1e-3, momentum=0.9)
        scaler = GradScaler(init_scale=2.0**8)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        for step in range(5):
            opt.zero_grad()
            x = torch.full((3, 5), 0.1 * (step + 1), dtype=torch.bfloat16)
            scaler.scale(low(x).float().square().mean()).backward()
            grads = [p.grad.float() / 2.0**8 for p in low.parameters()]
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(opt.master_params(), 1e9)
            scaler.step(opt)
            scaler.update()
            for m, g in zip(masters_ref, grads):
                m.grad = g
            ref_opt.step()
            sched.step()
            for group in ref_opt.param_groups:
                group["lr"] = opt.param_groups[0]["lr"]
        assert all(m.dtype == torch.float32 for m in opt.master_params())
        assert all(p.dtype == torch.bfloat16 for p in low.parameters())
        for (p, m), r in zip(opt.pairs, masters_ref):
            assert torch.equal(m, r) and torch.equal(p, m.to(torch.bfloat16))
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.25)
        return opt

    opt = one_rank(run)
    # The checkpoint holds the float32 masters, not the model's rounded copies.
    sd = opt.state_dict()
    other = MasterWeights(torch.optim.SGD(net(torch.bfloat16).parameters(), lr=1e-3, momentum=0.9))
    other.load_state_dict(sd)
    for (p, m), (q, n) in zip(opt.pairs, other.pairs):
        assert torch.equal(m, n) and torch.equal(p, q)
    assert other.state_dict()["optimizer"]["state"].keys() == sd["optimizer"]["state"].keys()


def test_master_weights_needs_a_fresh_optimizer():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 5)).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="before its first step"):
        MasterWeights(opt)
    mixed = MasterWeights(torch.optim.SGD(net().parameters(), lr=0.1))
    assert mixed.pairs == []  # float32 parameters are their own masters
