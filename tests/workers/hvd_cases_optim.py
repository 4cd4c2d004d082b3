"""Optimizer cases of the Horovod-API job (see ``hvd_training_worker.py``).

``broadcast_optimizer_state`` for every ``torch.optim.Optimizer`` subclass of the installed torch (with
and without momentum-like options): the root's optimizer has stepped, or was loaded from a checkpoint,
while the others are fresh (empty state) and have other hyperparameters; or every rank is fresh. Each
rank rebuilds the root's optimizer locally as the reference: after the broadcast every rank's
``state_dict()`` must equal it, the parameters must be unchanged, parameters that require grad must have
zero gradients where the optimizer was initialised (``requires_grad=False`` ones keep ``None``), and one
more step with the same gradients must give the same parameters as the reference's step. Also
``SparseAdam`` through ``DistributedOptimizer(sparse_as_dense=True)`` against single-process training,
and the text of the step()-after-synchronize() warning.
"""
from __future__ import annotations

import copy
import inspect
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import ringlet.torch as hvd

from hvd_cases_training import MICRO, STEPS, assert_trained_equal, fresh, quarters, seeded  # noqa: E402

ROOT = 0
# Every optimizer class of torch.optim, with and without its momentum-like options; LBFGS must raise.
CONFIGS = {
    "SGD": [{}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.1}],
    "Adam": [{}, {"amsgrad": True, "weight_decay": 0.1}],
    "AdamW": [{}, {"amsgrad": True}],
    "Adamax": [{}],
    "NAdam": [{}, {"decoupled_weight_decay": True, "weight_decay": 0.1}],
    "RAdam": [{}, {"decoupled_weight_decay": True, "weight_decay": 0.1}],
    "RMSprop": [{}, {"momentum": 0.9, "centered": True}],
    "Rprop": [{}],
    "Adagrad": [{}, {"lr_decay": 0.1, "initial_accumulator_value": 0.5}],
    "Adadelta": [{}, {"weight_decay": 0.1}],
    "ASGD": [{}, {"t0": 0.0}],
    "Adafactor": [{}, {"beta2_decay": -0.5, "weight_decay": 0.1}],
    "Muon": [{}, {"momentum": 0.9, "nesterov": False}],
    "SparseAdam": [{}, {"betas": (0.5, 0.9)}],
    "LBFGS": [{}],
}
SCENARIOS = ("root_stepped", "root_from_checkpoint", "all_fresh")
CASES: list = []


def optimizer_classes() -> list[str]:
    return sorted(n for n, c in vars(torch.optim).items()
                  if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer)


def _model(cls: str) -> nn.Module:
    if cls == "SparseAdam":
        return seeded(nn.Embedding(6, 3, sparse=True), 11)
    if cls == "Muon":  # two-dimensional parameters only
        return seeded(nn.Sequential(nn.Linear(4, 3, bias=False), nn.Linear(3, 2, bias=False)), 11)
    return seeded(nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)), 11)


def _build(cls: str, kw: dict, lr: float):
    """(model, frozen parameter, optimizer): the frozen parameter (requires_grad=False) is in a second
    param group."""
    model = _model(cls)
    frozen = nn.Parameter(torch.ones(2, 2), requires_grad=False)
    groups = [{"params": list(model.parameters())}, {"params": [frozen], "lr": lr / 2}]
    return model, frozen, getattr(torch.optim, cls)(groups, lr=lr, **kw)


def _set_grads(model: nn.Module, cls: str, key: str) -> None:
    for i, p in enumerate(model.parameters()):
        g = quarters(f"{key}.{i}", tuple(p.shape))
        if cls == "SparseAdam":
            g[::2] = 0  # some rows without gradient
            g = g.to_sparse(1)
        p.grad = g


def _stepped(cls: str, kw: dict, steps: int = 2):
    model, frozen, opt = _build(cls, kw, lr=0.01)
    for s in range(steps):
        _set_grads(model, cls, f"train{s}")
        opt.step()
    return model, frozen, opt


def _root_reference(cls: str, kw: dict, scenario: str):
    if scenario == "all_fresh":
        return _build(cls, kw, lr=0.01)
    return _stepped(cls, kw)


def _mine(cls: str, kw: dict, scenario: str):
    """This rank's optimizer before the broadcast."""
    if hvd.rank() != ROOT:
        return _build(cls, kw, lr=0.05 * (hvd.rank() + 1))
    if scenario == "root_from_checkpoint":
        trained_model, _, trained = _stepped(cls, kw)
        model, frozen, opt = _build(cls, kw, lr=0.01)
        model.load_state_dict(trained_model.state_dict())
        opt.load_state_dict(copy.deepcopy(trained.state_dict()))
        return model, frozen, opt
    return _root_reference(cls, kw, scenario)


def _state_problem(got: dict, want: dict) -> str | None:
    if got["param_groups"] != want["param_groups"]:
        return f"param_groups {got['param_groups']} != {want['param_groups']}"
    gs, ws = got["state"], want["state"]
    if sorted(gs) != sorted(ws):
        return f"state for parameters {sorted(gs)}, want {sorted(ws)}"
    for k, entry in ws.items():
        if sorted(map(str, gs[k])) != sorted(map(str, entry)):
            return f"state[{k}] keys {sorted(map(str, gs[k]))}, want {sorted(map(str, entry))}"
        for key, v in entry.items():
            g = gs[k][key]
            if isinstance(v, torch.Tensor):
                if not isinstance(g, torch.Tensor) or g.dtype != v.dtype or not torch.equal(g, v):
                    return f"state[{k}][{key}] = {g!r}, want {v!r}"
            elif g != v:
                return f"state[{k}][{key}] = {g!r}, want {v!r}"
    return None


def _grad_problem(model: nn.Module, frozen: torch.Tensor, initialised: bool) -> str | None:
    if frozen.grad is not None:
        return "a parameter with requires_grad=False got a gradient"
    for i, p in enumerate(model.parameters()):
        g = p.grad.to_dense() if p.grad is not None and p.grad.is_sparse else p.grad
        if initialised and (g is None or g.shape != p.shape or g.count_nonzero() != 0):
            return f"parameter {i} has gradient {p.grad!r}, want zeros"
    return None


def _state_case(cls: str, kw: dict, scenario: str):
    """Every rank makes the same collective calls whatever it finds; the checks raise at the end (a rank
    that stopped early would leave the others waiting)."""
    def fn():
        what = f"{cls}({kw}) {scenario}"
        if cls == "LBFGS":
            try:
                hvd.broadcast_optimizer_state(_build(cls, kw, 0.01)[2], root_rank=ROOT)
            except ValueError:
                return
            raise AssertionError("LBFGS: no ValueError")
        model, frozen, opt = _mine(cls, kw, scenario)
        ref_model, _, ref = _root_reference(cls, kw, scenario)
        before = [p.detach().clone() for p in model.parameters()]
        initialised = len(opt.state) == 0
        hvd.broadcast_optimizer_state(opt, root_rank=ROOT)
        problems = [f"broadcast_optimizer_state changed parameter {i}"
                    for i, (p, b) in enumerate(zip(model.parameters(), before)) if not torch.equal(p.detach(), b)]
        problems.append(_grad_problem(model, frozen, initialised))
        if scenario == "all_fresh":  # the reference would have to repeat the initialisation: compare ranks
            states = hvd.allgather_object(opt.state_dict(), name=f"optstate.{what}")
            problems.append(_state_problem(states[hvd.rank()], states[ROOT]))
        else:
            problems.append(_state_problem(opt.state_dict(), ref.state_dict()))
            hvd.broadcast_parameters(model.state_dict(), root_rank=ROOT)
            for m in (model, ref_model):
                _set_grads(m, cls, "next")
            opt.step()
            ref.step()
            problems += [f"the step after the broadcast differs from the root's (parameter {i})"
                         for i, (p, q) in enumerate(zip(model.parameters(), ref_model.parameters()))
                         if not torch.equal(p.detach(), q.detach())]
        problems = [p for p in problems if p]
        if problems:
            raise AssertionError(f"{what}: " + "; ".join(problems))

    return fn


def every_optimizer_class_is_covered():
    missing = sorted(set(optimizer_classes()) - set(CONFIGS))
    if missing:
        raise AssertionError(f"torch.optim classes without a broadcast_optimizer_state case: {missing}")


CASES.append(("every_optimizer_class_is_covered", every_optimizer_class_is_covered))
CASES += [(f"broadcast_optimizer_state_{cls}_{i}_{scenario}", _state_case(cls, kw, scenario))
          for cls, kws in CONFIGS.items() for i, kw in enumerate(kws) for scenario in SCENARIOS
          if hasattr(torch.optim, cls)]


def _sparse_adam_case(groups):
    def fn():
        n, r = hvd.size(), hvd.rank()
        model = seeded(nn.Embedding(10, 4, sparse=True), 5)
        ref = copy.deepcopy(model)
        start = copy.deepcopy(model)
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(model.parameters(), lr=0.05),
                                       named_parameters=model.named_parameters(), sparse_as_dense=True,
                                       groups=groups)
        ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.05)
        for step in range(STEPS):
            g = torch.Generator().manual_seed(300 + step)
            idx = torch.randint(0, 10, (MICRO * n, 3), generator=g)
            y = quarters(f"sa{step}", (MICRO * n, 4))
            opt.zero_grad()
            sl = slice(r * MICRO, (r + 1) * MICRO)
            F.mse_loss(model(idx[sl]).sum(1), y[sl]).backward()
            opt.synchronize()
            if not model.weight.grad.is_sparse:
                raise AssertionError("sparse_as_dense: the reduced gradient did not become sparse again")
            with opt.skip_synchronize():
                opt.step()
            ref_opt.zero_grad()
            F.mse_loss(ref(idx).sum(1), y).backward()
            ref_opt.step()
        assert_trained_equal(model, ref, start)

    return fn


CASES += [("sparse_adam_sparse_as_dense", _sparse_adam_case(None)),
          ("sparse_adam_sparse_as_dense_grouped", _sparse_adam_case(1))]


def step_after_synchronize_warning_text():
    """step() after synchronize() outside skip_synchronize() warns with Horovod's text, once."""
    model = fresh()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    x, y = quarters("wx", (MICRO, 6)) + hvd.rank(), quarters("wy", (MICRO, 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.synchronize()
            opt.step()
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
    text = "optimizer.step() called without optimizer.skip_synchronize()"
    hits = [w for w in caught if text in str(w.message)]
    if len(hits) != 1:
        raise AssertionError(f"want one warning containing {text!r}, got {[str(w.message) for w in caught]}")


CASES.append(("step_after_synchronize_warning_text", step_after_synchronize_warning_text))
