"""Cases of the Horovod-API job (see ``hvd_training_worker.py``) for sufficient factors on
``DistributedOptimizer``'s fused path (:mod:`ringlet.torch.fused_factors`):

- with ``sufficient_factors=True`` the large layer's weight is factored from the second step on and every
  gradient equals the average of the ranks' local gradients (rounding apart), with and without
  accumulation over two backward passes;
- ``"auto"`` (the default) times steps with and without factors, every step correct meanwhile, and all
  ranks keep the same choice; a bad value is a ``ValueError``;
- a weight used outside its layer fails the guard: that step's result is still the average (the ranks
  fall back to the dense all-reduce together) and the weight stays dense afterwards;
- a weight shared by two ``nn.Linear`` modules is never factored;
- ``join()`` with uneven steps while a weight is factored: the ranks still stepping get the average with
  the joined ranks' gradients as zeros, and afterwards the ranks train together again; once per rank
  joining first; and a rank that joins before its first forward keeps every weight dense.
"""
from __future__ import annotations

import zlib

import torch
import torch.nn.functional as F
from torch import nn

import ringlet.torch as hvd

MAX_WORLD = 4
CASES: list = []
IN, HIDDEN, OUT, ROWS = 32, 24, 3, 4  # the first layer qualifies on up to 4 ranks: 4·4·56 < 32·24


def _data(rank: int, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(zlib.crc32(f"factors|{rank}|{step}|{micro}".encode()))
    return torch.randn(ROWS, IN, generator=g), torch.randn(ROWS, OUT, generator=g)


def _model() -> nn.Module:
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))


def _loss(model: nn.Module, rank: int, step: int, micro: int, outside: bool) -> torch.Tensor:
    x, y = _data(rank, step, micro)
    loss = F.mse_loss(model(x), y)
    if outside:  # the first weight also used outside its layer: its factors miss this term
        loss = loss + 0.01 * model[0].weight.square().sum()
    return loss


def _local_grads(rank: int, step: int, passes: int, outside: bool) -> list[torch.Tensor]:
    ref = _model()
    for micro in range(passes):
        _loss(ref, rank, step, micro, outside).backward()
    return [p.grad.clone() for p in ref.parameters()]


def _step(model, opt, step: int, stepping: list[int], passes: int = 1, outside: bool = False) -> None:
    """One step (lr 0: the parameters stay, so every rank can compute every rank's gradient locally);
    the ranks not in ``stepping`` have joined (zeros)."""
    n, r = hvd.size(), hvd.rank()
    want = [sum(gs) / n for gs in zip(*(_local_grads(j, step, passes, outside) for j in stepping))]
    opt.zero_grad()
    for micro in range(passes):
        _loss(model, r, step, micro, outside).backward()
    opt.synchronize()
    for i, (p, w) in enumerate(zip(model.parameters(), want)):
        if not torch.allclose(p.grad, w, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"step {step}, ranks {stepping} stepping: parameter {i} differs from the "
                                 f"average by {(p.grad - w).abs().max().item():.3g}")
    with opt.skip_synchronize():
        opt.step()


def _optimizer(model, **kw):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                    named_parameters=model.named_parameters(), **kw)


def _factored(opt) -> list[str]:
    f = opt._ordered.factors if opt._ordered is not None else None
    return [] if f is None else sorted(layer.name for layer in f.chosen.values())


def _expect(what: str, got, want) -> None:
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def _plain(passes: int):
    def fn():
        if hvd.size() == 1:
            return
        model = _model()
        opt = _optimizer(model, sufficient_factors=True, backward_passes_per_step=passes)
        for s in range(4):
            _step(model, opt, s, list(range(hvd.size())), passes)
            _expect(f"factored weights after step {s}", _factored(opt), ["0.weight"])
        _expect("reductions from factors", opt._ordered.ctx.factored, 3)
    return fn


CASES += [("factors_match_average", _plain(1)), ("factors_accumulate_2", _plain(2))]


def factors_auto_trial():
    """``"auto"`` (the default) times steps with and without factors and keeps the faster: every step's
    gradients are the average meanwhile, and the choice is the same on every rank."""
    if hvd.size() == 1:
        return
    model = _model()
    opt = _optimizer(model)
    factors = opt._ordered.factors
    for s in range(50):
        _step(model, opt, s, list(range(hvd.size())))
        if factors.decision is not None:
            break
    if factors.decision is None:
        raise AssertionError("no decision after 50 steps")
    _expect("factored weights after the trial", _factored(opt),
            ["0.weight"] if factors.decision.choice.endswith("+factors") else [])
    verdict = torch.tensor([float(len(_factored(opt))), float(s)])
    _expect("the same choice at the same step on every rank", hvd.allreduce(verdict, op=hvd.Max).tolist(),
            verdict.tolist())
    for t in range(2):
        _step(model, opt, 100 + t, list(range(hvd.size())))
    try:
        _optimizer(_model(), sufficient_factors="maybe")
    except ValueError as exc:
        if "sufficient_factors" not in str(exc):
            raise AssertionError(f"unclear error: {exc}") from exc
    else:
        raise AssertionError("sufficient_factors='maybe' was accepted")


def factors_guard_falls_back():
    if hvd.size() == 1:
        return
    model = _model()
    opt = _optimizer(model, sufficient_factors=True)
    n = list(range(hvd.size()))
    _step(model, opt, 0, n)
    _step(model, opt, 1, n)
    _expect("factored before the weight is used outside its layer", _factored(opt), ["0.weight"])
    _step(model, opt, 2, n, outside=True)  # the guard fails on every rank: dense average
    _expect("fallbacks", opt._ordered.ctx.fallbacks, 1)
    _expect("factored after a fallback", _factored(opt), [])
    _step(model, opt, 3, n, outside=True)
    _step(model, opt, 4, n)


def factors_tied_weight_stays_dense():
    if hvd.size() == 1:
        return
    model = _model()
    tied = nn.Linear(IN, HIDDEN)
    tied.weight = model[0].weight
    opt = _optimizer(model, sufficient_factors=True)
    for s in range(3):
        opt.zero_grad()
        x, y = _data(hvd.rank(), s)
        (F.mse_loss(model(x), y) + tied(x).sum() * 1e-3).backward()
        opt.step()
    _expect("factored weights when one weight serves two layers", _factored(opt), [])


CASES += [("factors_auto_trial", factors_auto_trial), ("factors_guard_falls_back", factors_guard_falls_back),
          ("factors_tied_weight_stays_dense", factors_tied_weight_stays_dense)]


def _join_case(first: int):
    def fn():
        n, r = hvd.size(), hvd.rank()
        if first >= n or n == 1:
            return
        model = _model()
        opt = _optimizer(model, sufficient_factors=True)
        steps = [2 if j == first else j + 4 for j in range(n)]
        for s in range(steps[r]):
            _step(model, opt, s, [j for j in range(n) if steps[j] > s])
        _expect("factored weights", _factored(opt), ["0.weight"])
        hvd.join()
        for s in range(2):  # together again
            _step(model, opt, 100 + s, list(range(n)))
        _expect("factored weights after join", _factored(opt), ["0.weight"])
    return fn


def factors_join_before_first_forward():
    """The last rank joins at once: it never ran the layers, so nothing is factored, on every rank."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        return
    model = _model()
    opt = _optimizer(model, sufficient_factors=True)
    if r != n - 1:
        for s in range(3):
            _step(model, opt, s, list(range(n - 1)))
    hvd.join()
    _expect("factored weights", _factored(opt), [])
    _step(model, opt, 50, list(range(n)))


CASES += [(f"factors_join_first{first}", _join_case(first)) for first in range(MAX_WORLD)]
CASES += [("factors_join_before_first_forward", factors_join_before_first_forward)]
