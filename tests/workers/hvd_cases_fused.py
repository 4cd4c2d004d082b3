"""Cases of the Horovod-API job (see ``hvd_training_worker.py``) for how ``DistributedOptimizer``'s gradients
travel: as ordered, fused all-reduces (the default, :mod:`ringlet.torch.ordered_grads`) or matched by name
(``RINGLET_HVD_GRADIENTS=named``, through the coordinator).

- the named path still trains like single-process training (plain, accumulation, fp16);
- uneven data: rank ``first`` steps least, each other rank ``j`` steps ``j + 2`` times, then every rank
  calls ``join()``; on every step the ranks still stepping get the average over all ranks with the joined
  ranks' gradients as zeros (Horovod's join semantics), ``join()`` returns the last rank to join, and
  afterwards the ranks train together again with full results; once per rank joining first;
- every rank joins at once, with no step in between;
- a rank whose parameters differ from the others' gets an error on the first step, not a hang.
"""
from __future__ import annotations

import os
import zlib
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

import ringlet.torch as hvd

from hvd_cases_training import run_equivalence  # noqa: E402

MAX_WORLD = 4
CASES: list = []


def gradients(how: str):
    """``RINGLET_HVD_GRADIENTS=how`` while the block runs."""
    return mock.patch.dict(os.environ, {"RINGLET_HVD_GRADIENTS": how})


def _named(**kw):
    def fn():
        with gradients("named"):
            run_equivalence(**kw)
    return fn


CASES += [("named_plain", _named()), ("named_accumulate_2", _named(bpps=2)),
          ("named_fp16", _named(compression=hvd.Compression.fp16, tol=2e-3))]


def _data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(zlib.crc32(f"fused|{rank}|{step}".encode()))
    return (torch.randint(-4, 5, (4, 6), generator=g).float() / 4,
            torch.randint(-4, 5, (4, 3), generator=g).float() / 4)


def _model() -> nn.Module:
    g = torch.Generator().manual_seed(7)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-4, 5, p.shape, generator=g).float() / 4)
    return model


def _local_grads(model: nn.Module, rank: int, step: int) -> list[torch.Tensor]:
    model.zero_grad()
    x, y = _data(rank, step)
    F.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def _check_step(model: nn.Module, opt, step: int, stepping: list[int]) -> None:
    """One step (lr 0: the parameters stay, so every rank can compute every rank's gradient locally)."""
    n, r = hvd.size(), hvd.rank()
    ref = _model()
    want = [sum(gs) / n for gs in zip(*(_local_grads(ref, j, step) for j in stepping))]
    opt.zero_grad()
    x, y = _data(r, step)
    F.mse_loss(model(x), y).backward()
    opt.synchronize()
    for i, (p, w) in enumerate(zip(model.parameters(), want)):
        if not torch.allclose(p.grad, w, atol=1e-6):
            raise AssertionError(f"step {step} with ranks {stepping} stepping: parameter {i} has gradient "
                                 f"{p.grad.reshape(-1)[:4].tolist()}, want {w.reshape(-1)[:4].tolist()}")
    with opt.skip_synchronize():
        opt.step()


def _join_case(first: int):
    def fn():
        n, r = hvd.size(), hvd.rank()
        if first >= n:
            return
        model = _model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                       named_parameters=model.named_parameters())
        steps = [1 if j == first else j + 2 for j in range(n)]
        for s in range(steps[r]):
            _check_step(model, opt, s, [j for j in range(n) if steps[j] > s])
        last = hvd.join()
        want_last = max(range(n), key=lambda j: (steps[j], j)) if n > 1 else 0
        if last != want_last:
            raise AssertionError(f"join() returned {last}, want {want_last} (steps per rank {steps})")
        for s in range(2):  # together again: full membership
            _check_step(model, opt, 100 + s, list(range(n)))

    return fn


CASES += [(f"fused_join_first{first}", _join_case(first)) for first in range(MAX_WORLD)]


def fused_join_at_once():
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters())
    hvd.join()
    _check_step(model, opt, 200, list(range(hvd.size())))


def fused_layout_mismatch():
    """The last rank's model has one more output: its first fused all-reduce must raise on every rank."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        return
    model = nn.Linear(6, 4 if r == n - 1 else 3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters())
    model(torch.ones(2, 6)).sum().backward()
    try:
        opt.synchronize()
    except Exception as exc:  # noqa: BLE001 - the error is the expected outcome
        text = str(exc)
        if "shape" not in text.lower() and "mismatch" not in text.lower():
            raise AssertionError(f"unclear error for differing parameters: {type(exc).__name__}: {exc}") from exc
        return
    raise AssertionError("differing parameters across ranks were reduced without an error")


CASES += [("fused_join_at_once", fused_join_at_once), ("fused_layout_mismatch", fused_layout_mismatch)]
