"""broadcast_parameters / broadcast_optimizer_state / broadcast_object / allgather_object: argument errors
and behaviour on one rank and on ranks as threads (real processes: tests/multiproc/test_hvd_training.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import ringlet.torch as hvd
from hvd_world import hvd_world


@pytest.fixture
def hvd1():
    hvd.init()
    yield
    hvd.shutdown()


@pytest.mark.parametrize("params", [torch.zeros(2), (torch.zeros(2),), "weights", None])
def test_broadcast_parameters_rejects_other_containers(hvd1, params):
    with pytest.raises(ValueError, match="invalid params"):
        hvd.broadcast_parameters(params, root_rank=0)
    hvd.broadcast_parameters([torch.zeros(2)], root_rank=0)  # the next call works


def test_broadcast_parameters_rejects_non_tensor_entries(hvd1):
    with pytest.raises(ValueError, match="not a tensor"):
        hvd.broadcast_parameters({"a": torch.zeros(1), "b": 3}, root_rank=0)


def test_broadcast_optimizer_state_refuses_lbfgs(hvd1):
    p = nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="LBFGS"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS([p]), root_rank=0)


@pytest.mark.parametrize("cls, kw", [(torch.optim.Adam, {"weight_decay": 0.0}), (torch.optim.AdamW, {}),
                                     (torch.optim.SGD, {"momentum": 0.9, "weight_decay": 0.1})])
def test_broadcast_optimizer_state_initialises_empty_state_without_moving_parameters(hvd1, cls, kw):
    p = nn.Parameter(torch.arange(3.0))
    frozen = nn.Parameter(torch.ones(2), requires_grad=False)
    opt = cls([p, frozen], lr=0.1, **kw)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert len(opt.state[p]) > 0 and frozen not in opt.state
    assert torch.equal(p.detach(), torch.arange(3.0))
    assert torch.equal(p.grad, torch.zeros(3)) and frozen.grad is None  # Horovod leaves zero gradients


def test_broadcast_optimizer_state_initialises_sparse_adam(hvd1):
    emb = nn.Embedding(4, 2, sparse=True)
    before = emb.weight.detach().clone()
    opt = torch.optim.SparseAdam(emb.parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert set(opt.state[emb.weight]) == {"step", "exp_avg", "exp_avg_sq"}
    assert torch.equal(emb.weight.detach(), before) and emb.weight.grad.is_sparse


def test_objects_on_one_rank(hvd1):
    obj = {"a": [1, 2], "b": torch.ones(2)}
    assert hvd.broadcast_object(obj) is obj
    (back,) = hvd.allgather_object(obj)
    assert back["a"] == [1, 2] and torch.equal(back["b"], torch.ones(2))


def test_objects_and_parameters_between_ranks():
    def body(r):
        obj = hvd.broadcast_object({"from": r} if r == 1 else None, root_rank=1, name="cfg")
        everyone = hvd.allgather_object(("rank", r, "x" * r))
        params = {"w": torch.full((2, 2), float(r)), "b": torch.full((3,), float(r))}
        hvd.broadcast_parameters(params, root_rank=2)
        return obj, everyone, params

    for obj, everyone, params in hvd_world(3, body):
        assert obj == {"from": 1}
        assert everyone == [("rank", j, "x" * j) for j in range(3)]
        assert torch.equal(params["w"], torch.full((2, 2), 2.0)) and torch.equal(params["b"], torch.full((3,), 2.0))


def test_optimizer_state_follows_the_root_even_with_different_shapes_of_state():
    def body(r):
        p = nn.Parameter(torch.ones(4))
        opt = torch.optim.SGD([p], lr=0.1 * (r + 1), momentum=0.9)
        if r == 0:
            opt.state[p]["momentum_buffer"] = torch.arange(4.0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        return opt.param_groups[0]["lr"], opt.state[p]["momentum_buffer"]

    for lr, buf in hvd_world(2, body):
        assert lr == 0.1 and torch.equal(buf, torch.arange(4.0))
