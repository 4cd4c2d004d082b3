"""DistributedOptimizer: construction, every error the spec lists, single-rank behaviour, and (ranks as
threads) misuse during training and the BACKWARD spans / step marks it writes to the timeline.

Training equivalence with real processes: tests/multiproc/test_hvd_training.py.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ringlet.torch as hvd
from ringlet import timeline
from hvd_world import hvd_world


@pytest.fixture
def hvd1():
    hvd.init()
    yield
    hvd.shutdown()


def model(seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return m


def batch(key: int, rows: int = 4):
    g = torch.Generator().manual_seed(key)
    return torch.randint(-2, 3, (rows, 3), generator=g).float(), torch.randint(-2, 3, (rows, 2), generator=g).float()


def test_returns_a_subclass_of_the_users_optimizer_sharing_its_state(hvd1):
    m = model()
    base = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x, y = batch(1)
    F.mse_loss(m(x), y).backward()
    base.step()
    opt = hvd.DistributedOptimizer(base, named_parameters=m.named_parameters())
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    assert opt.param_groups is base.param_groups
    assert all("momentum_buffer" in opt.state[p] for p in m.parameters())
    assert opt._parameter_names == {p: n for n, p in m.named_parameters()}


def test_default_names_are_per_param_group_and_index(hvd1):
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD([{"params": m[0].parameters()},
                                                    {"params": m[2].parameters(), "lr": 0.5}], lr=0.1))
    assert list(opt._parameter_names.values()) == ["allreduce.noname.0.0", "allreduce.noname.0.1",
                                                   "allreduce.noname.1.0", "allreduce.noname.1.1"]


@pytest.mark.parametrize("kwargs, message", [
    ({"backward_passes_per_step": 0}, "backward_passes_per_step"),
    ({"backward_passes_per_step": -2}, "backward_passes_per_step"),
    ({"op": hvd.Sum, "gradient_predivide_factor": 2.0}, "gradient_predivide_factor"),
    ({"groups": 0}, "groups"),
    ({"groups": "two"}, "groups"),
    ({"groups": [[torch.zeros(1)]]}, "not a parameter"),
    ({"groups": [[3]]}, "torch.Tensor"),
])
def test_invalid_arguments_raise_value_error(hvd1, kwargs, message):
    m = model()
    with pytest.raises(ValueError, match=message):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                 **kwargs)


def test_duplicate_missing_and_malformed_names_raise_value_error(hvd1):
    m = model()
    named = list(m.named_parameters())
    sgd = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="unique.*0.weight"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("0.weight", p) for _, p in named])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(sgd, named_parameters=named[:-1])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(sgd, named_parameters=[p for _, p in named])
    with pytest.raises(ValueError, match="only appear once"):
        hvd.DistributedOptimizer(sgd, groups=[[named[0][1]], [named[0][1]]])


def test_adasum_is_a_clear_not_implemented_error(hvd1):
    m = model()
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), op=hvd.Adasum)


def test_num_groups_is_deprecated_for_groups(hvd1):
    m = model()
    with pytest.warns(DeprecationWarning, match="groups"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), num_groups=2)


def test_set_backward_passes_per_step_validates(hvd1):
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))
    opt.set_backward_passes_per_step(4)
    assert opt.backward_passes_per_step == 4
    with pytest.raises(ValueError):
        opt.set_backward_passes_per_step(0)


def test_single_rank_trains_exactly_like_the_plain_optimizer(hvd1):
    m, ref = model(), model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters(), lr=0.05), named_parameters=m.named_parameters(),
                                   backward_passes_per_step=2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.05)
    for step in range(3):
        x, y = batch(step)
        for o, net in ((opt, m), (ref_opt, ref)):
            o.zero_grad()
            F.mse_loss(net(x), y).backward()
            o.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p, q)


def test_step_after_synchronize_warns_once_and_skip_synchronize_does_not(hvd1):
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        assert not caught
        for _ in range(3):
            opt.synchronize()
            opt.step()
    # Horovod's wording, which scripts and tests match on.
    assert len([w for w in caught if "optimizer.step() called without optimizer.skip_synchronize()"
                in str(w.message)]) == 1


def test_misuse_during_training_raises_assertion_error_and_training_recovers():
    def body(r):
        m = model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                       named_parameters=m.named_parameters())
        x, y = batch(10 + r)
        F.mse_loss(m(x), y).backward()
        with pytest.raises(AssertionError, match="zero_grad"):
            opt.zero_grad()
        with pytest.raises(AssertionError, match="backward_passes_per_step"):
            F.mse_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.step()
        # The extra pass was added into a gradient already being reduced, so parameters may now differ
        # between ranks (as in Horovod); what must hold is that reductions work again.
        return [p.grad.clone() for p in m.parameters()]

    a, b = hvd_world(2, body)
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_accumulation_counts_passes_and_zero_grad_between_them_is_refused():
    def body(r):
        m = model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), backward_passes_per_step=2)
        x, y = batch(20 + r)
        F.mse_loss(m(x), y).backward()
        with pytest.raises(AssertionError, match="zero_grad"):
            opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.step()
        return [p.detach().clone() for p in m.parameters()]

    a, b = hvd_world(2, body)
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_one_backward_span_and_one_step_mark_per_step(tmp_path):
    # "{rank}": written whatever rank the process-wide timeline thinks it has (threads share it here).
    timeline.start_timeline(str(tmp_path / "trace{rank}.json"))
    try:
        def body(r):
            m = model()
            opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))
            for step in range(3):
                opt.zero_grad()
                x, y = batch(step)
                F.mse_loss(m(x), y).backward()
                opt.step()

        hvd_world(2, body)
    finally:
        timeline.stop_timeline()
    (path,) = tmp_path.glob("trace*.json")
    events = timeline.read_events(str(path))
    # Both thread-ranks write into the one process-wide timeline: 2 ranks x 3 steps.
    spans = [e for e in events if e.get("name") == "BACKWARD" and e.get("ph") == "X"]
    steps = [e for e in events if e.get("name") == "step" and e.get("ph") == "i"]
    assert len(spans) == 6 and len(steps) == 6
    assert all(e["dur"] >= 0 for e in spans)
