"""The bookkeeping of sufficient factors on DistributedOptimizer's fused path (no communication; the
reductions themselves run with real processes in ``tests/workers/hvd_cases_factors.py``): modes, which
layers are found, the vote and the decision, and the global hook's lifetime."""
from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from ringlet.torch.fused_factors import FusedFactors, parse_mode


def _hooks() -> int:
    return len(torch.nn.modules.module._global_forward_hooks)


def _factors(model: nn.Module, mode: str = "on", size: int = 2) -> FusedFactors:
    params = list(model.parameters())
    return FusedFactors(params, {p: n for n, p in model.named_parameters()}, mode, size)


@pytest.mark.parametrize("value,mode", [(True, "on"), (False, "off"), ("auto", "auto"), ("on", "on"), ("off", "off")])
def test_modes(value, mode):
    assert parse_mode(value) == mode


@pytest.mark.parametrize("value", ["yes", 1, None, "ON"])
def test_bad_mode_is_refused(value):
    with pytest.raises(ValueError, match="sufficient_factors"):
        parse_mode(value)


@pytest.mark.parametrize("mode,size,active", [("on", 2, True), ("auto", 2, True), ("off", 4, False), ("on", 1, False),
                                              ("auto", 1, False)])
def test_active_with_ranks_to_gather_from(mode, size, active):
    before = _hooks()
    f = _factors(nn.Linear(8, 8), mode, size)
    assert f.active is active
    assert _hooks() == before + active
    f.stop_discovery()
    assert _hooks() == before


def test_vote_and_decide():
    model = nn.Sequential(nn.Linear(32, 24), nn.Tanh(), nn.Linear(24, 3))
    f = _factors(model)
    model(torch.randn(4, 32)).sum().backward()
    mine = f.vote(True, 2)
    # [stepping, worth per parameter (4), found per parameter (4), 1]: only the first weight is worth it
    assert mine.tolist() == [1, 1, 0, 0, 0, 1, 0, 1, 0, 1]
    f.decide(mine * 2)  # two ranks voted alike
    assert [layer.name for layer in f.chosen.values()] == ["0.weight"]
    assert f.in_use() is f.chosen and f.chosen[id(model[0].weight)].enabled  # "on": no trial


def test_a_joined_rank_votes_only_found():
    model = nn.Sequential(nn.Linear(32, 24))
    f = _factors(model)
    model(torch.randn(4, 32))
    assert f.vote(False, 2).tolist() == [0, 0, 0, 1, 0, 1]


def test_a_layer_some_rank_never_ran_is_not_chosen():
    model = nn.Sequential(nn.Linear(32, 24))
    f = _factors(model)
    model(torch.randn(4, 32))
    votes = f.vote(True, 2)
    votes[3] = 1  # found on this rank only, of two
    votes[0], votes[1], votes[-1] = 2, 2, 2
    f.decide(votes)
    assert not f.chosen and not f.in_use()


def test_a_weight_in_two_modules_is_not_found():
    model = nn.Sequential(nn.Linear(32, 24))
    twin = nn.Linear(32, 24)
    twin.weight = model[0].weight
    f = _factors(model)
    x = torch.randn(4, 32)
    model(x)
    twin(x)
    assert f.vote(True, 2).tolist() == [1, 0, 0, 0, 0, 1]


def test_rows_of_a_forward_without_grad_do_not_count():
    model = nn.Sequential(nn.Linear(32, 24))
    f = _factors(model)
    with torch.no_grad():
        model(torch.randn(4, 32))
    assert f.vote(True, 2).tolist() == [1, 0, 0, 0, 0, 1]


def test_auto_trial_alternates_and_decides_on_summed_times():
    model = nn.Sequential(nn.Linear(32, 24))
    f = _factors(model, "auto")
    model(torch.randn(4, 32)).sum().backward()
    f.decide(f.vote(True, 2) * 2)
    sums = []
    f.start_trial(lambda xs: sums.append(xs) or [2 * x for x in xs])
    used = []
    while f.tuner is not None:
        used.append(bool(f.in_use()))
        f.step_ended()
    assert used[:2] == [False, False] and True in used and used.count(True) <= used.count(False)
    assert len(sums) >= 1 and f.decision is not None
    assert bool(f.chosen) == f.decision.choice.endswith("+factors")


def test_worth_and_the_rank_count_follow_the_group_size_now():
    model = nn.Sequential(nn.Linear(32, 24))
    f = _factors(model, size=2)
    model(torch.randn(4, 32))
    assert f.vote(True, 8).tolist() == [1, 0, 0, 1, 0, 1]  # 8·4·56 > 32·24: not worth it on 8 ranks
    votes = f.vote(True, 3) * 3  # three ranks now (an elastic reset grew the group)
    f.decide(votes)
    assert len(f.chosen) == 1


def test_hook_goes_with_the_optimizer():
    before = _hooks()
    f = _factors(nn.Linear(8, 8))
    assert _hooks() == before + 1
    del f
    gc.collect()
    nn.Linear(2, 2)(torch.randn(1, 2))  # the next forward finds the owner gone
    assert _hooks() == before


# ---- through DistributedOptimizer, ranks as threads (real processes: tests/workers/hvd_cases_factors.py)
def _net(seed: int = 5) -> nn.Module:
    """The same weights on every call (from a generator of its own: ranks are threads here, and the
    default generator is shared between them)."""
    g = torch.Generator().manual_seed(seed)
    m = nn.Sequential(nn.Linear(32, 24), nn.Tanh(), nn.Linear(24, 3))
    with torch.no_grad():
        for q in m.parameters():
            q.copy_(torch.randn(q.shape, generator=g) * 0.2)
    return m


def _backward(m: nn.Module, rank: int, step: int) -> None:
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(4, 32, generator=g), torch.randn(4, 3, generator=g)
    torch.nn.functional.mse_loss(m(x), y).backward()


def _average(p: int, step: int) -> list[torch.Tensor]:
    grads = []
    for j in range(p):
        m = _net()
        _backward(m, j, step)
        grads.append([q.grad for q in m.parameters()])
    return [sum(gs) / p for gs in zip(*grads)]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_factored_weight_reuses_its_average_unless_the_caller_keeps_it(set_to_none):
    """The factored weight's ``.grad`` takes the average's memory; the next step writes its average there
    again while only ``.grad`` holds it, and never into a gradient the caller kept."""
    import ringlet.torch as hvd
    from hvd_world import hvd_world

    p = 2

    def fn(rank):
        m = _net()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters(),
                                       sufficient_factors=True)
        ptrs, kept = [], None
        for step in range(6):
            m.zero_grad(set_to_none=set_to_none)
            _backward(m, rank, step)
            opt.synchronize()
            for q, w in zip(m.parameters(), _average(p, step)):
                torch.testing.assert_close(q.grad, w, rtol=1e-5, atol=1e-6)
            ptrs.append(m[0].weight.grad.data_ptr())
            if step == 3:
                kept = (m[0].weight.grad, m[0].weight.grad.clone())
            with opt.skip_synchronize():
                opt.step()
        if set_to_none:  # else the caller's reference is .grad itself, zeroed by zero_grad as in torch
            assert torch.equal(*kept)
        assert opt._ordered.ctx.factored == 5
        return ptrs

    for ptrs in hvd_world(p, fn):
        assert ptrs[1] == ptrs[2] == ptrs[3]  # step 0 was dense; the average's memory is reused
        if set_to_none:
            assert ptrs[4] != ptrs[3]  # the caller kept step 3's gradient
        else:
            assert ptrs[4] == ptrs[5] == ptrs[3]


def test_a_new_session_votes_again():
    """After ``hvd.shutdown()`` and ``hvd.init()`` (as an elastic reset does) the optimizer starts dense,
    votes at the end of the new session's first step and factors again."""
    import ringlet.torch as hvd
    from conftest import run_world

    p = 2

    def fn(rank):
        hvd.init()
        m = _net()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters(),
                                       sufficient_factors=True)
        seen = []
        for session in range(2):
            if session:
                hvd.shutdown()
                hvd.init()
            for step in range(3):
                m.zero_grad()
                _backward(m, rank, step)
                opt.synchronize()
                for q, w in zip(m.parameters(), _average(p, step)):
                    torch.testing.assert_close(q.grad, w, rtol=1e-5, atol=1e-6)
                seen.append(len(opt._ordered.factors.chosen))
                with opt.skip_synchronize():
                    opt.step()
        hvd.shutdown()
        return seen

    for seen in run_world(p, fn):
        assert seen == [1, 1, 1, 1, 1, 1]  # chosen after each session's first step
