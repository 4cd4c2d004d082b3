"""Non-training cases of the Horovod-API job (see ``hvd_training_worker.py``): gradients of the
differentiable collectives (each against the spec's rule, computed locally from every rank's seeded
data), broadcast_parameters / broadcast_optimizer_state / broadcast_object / allgather_object, and
SyncBatchNorm against BatchNorm on the concatenated batch.
"""
from __future__ import annotations

import copy
import warnings
import zlib

import torch
from torch import nn

import ringlet.torch as hvd
from ringlet.torch import mpi_ops

from hvd_cases_training import seeded  # noqa: E402 - sibling module

CASES: list = []


def case(fn):
    CASES.append((fn.__name__, fn))
    return fn


def ints(key: str, shape, lo: int = -3, hi: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    return torch.randint(lo, hi, shape, generator=g).float()


def check(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 0.0) -> None:
    got, want = got.detach(), want.detach()
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
    d = float((got - want).abs().max()) if got.numel() else 0.0
    if not d <= tol * max(1.0, float(want.abs().max()) if want.numel() else 1.0):
        raise AssertionError(f"{what}: differs by {d:.3g}\ngot  {got.flatten()[:8].tolist()}\n"
                             f"want {want.flatten()[:8].tolist()}")


def leaf(key: str, shape) -> torch.Tensor:
    return ints(key, shape).requires_grad_()


# ---- autograd ------------------------------------------------------------------------------------
@case
def grad_allreduce():
    n, r = hvd.size(), hvd.rank()
    for op, pre, post in ((hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 2.0, 0.5), (hvd.Average, 0.5, 4.0)):
        tag = f"ar{op}{pre}{post}"
        x = leaf(f"{tag}x{r}", (3, 2))
        y = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post, name=tag)
        xs = sum(ints(f"{tag}x{j}", (3, 2)) for j in range(n))
        scale = pre * post / (n if op == hvd.Average else 1)
        check(y, xs * scale, f"{tag} forward", 1e-6)
        (y * ints(f"{tag}w{r}", (3, 2))).sum().backward()
        ws = sum(ints(f"{tag}w{j}", (3, 2)) for j in range(n))
        check(x.grad, ws * scale, f"{tag} gradient", 1e-6)


@case
def grad_allreduce_fp16_compression():
    n, r = hvd.size(), hvd.rank()
    x = leaf(f"arc{r}", (5,))
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    if y.dtype != torch.float32:
        raise AssertionError(f"fp16 compression did not restore the dtype: {y.dtype}")
    check(y, sum(ints(f"arc{j}", (5,)) for j in range(n)), "compressed forward")
    y.sum().backward()
    check(x.grad, torch.full((5,), float(n)), "compressed gradient")


@case
def grad_grouped_allreduce():
    n, r = hvd.size(), hvd.rank()
    xs = [leaf(f"gar{i}x{r}", (i + 2,)) for i in range(3)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum, name="gar")
    sum(((y * ints(f"gar{i}w{r}", (i + 2,))).sum() for i, y in enumerate(ys))).backward()
    for i, x in enumerate(xs):
        check(ys[i], sum(ints(f"gar{i}x{j}", (i + 2,)) for j in range(n)), f"tensor {i} forward")
        check(x.grad, sum(ints(f"gar{i}w{j}", (i + 2,)) for j in range(n)), f"tensor {i} gradient")


@case
def grad_allgather_ragged():
    n, r = hvd.size(), hvd.rank()
    x = leaf(f"ag{r}", (r + 1, 2))
    y = hvd.allgather(x)
    check(y, torch.cat([ints(f"ag{j}", (j + 1, 2)) for j in range(n)]), "forward")
    rows = n * (n + 1) // 2
    (y * ints(f"agw{r}", (rows, 2))).sum().backward()
    wavg = sum(ints(f"agw{j}", (rows, 2)) for j in range(n)) / n
    off = r * (r + 1) // 2
    check(x.grad, wavg[off:off + r + 1], "gradient", 1e-6)


@case
def grad_grouped_allgather():
    n, r = hvd.size(), hvd.rank()
    xs = [leaf(f"gag{i}x{r}", (r + 1 + i, 3)) for i in range(2)]
    ys = hvd.grouped_allgather(xs)
    total = [sum(j + 1 + i for j in range(n)) for i in range(2)]
    sum((y * ints(f"gag{i}w{r}", (total[i], 3))).sum() for i, y in enumerate(ys)).backward()
    for i, x in enumerate(xs):
        wavg = sum(ints(f"gag{i}w{j}", (total[i], 3)) for j in range(n)) / n
        off = sum(j + 1 + i for j in range(r))
        check(x.grad, wavg[off:off + r + 1 + i], f"tensor {i} gradient", 1e-6)


@case
def grad_broadcast():
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    x = leaf(f"bc{r}", (4,))
    y = hvd.broadcast(x, root, name="bcg")
    check(y, ints(f"bc{root}", (4,)), "forward")
    (y * ints(f"bcw{r}", (4,))).sum().backward()
    want = sum(ints(f"bcw{j}", (4,)) for j in range(n)) / n if r == root else torch.zeros(4)
    check(x.grad, want, "gradient", 1e-6)


def _splits(src: int, n: int) -> list[int]:
    return [(src + dst) % 3 + 1 for dst in range(n)]


@case
def grad_alltoall_splits():
    n, r = hvd.size(), hvd.rank()
    x = leaf(f"a2a{r}", (sum(_splits(r, n)), 2))
    out, received = hvd.alltoall(x, splits=_splits(r, n))
    want_recv = [_splits(j, n)[r] for j in range(n)]
    if [int(v) for v in received] != want_recv:
        raise AssertionError(f"received splits {received}, want {want_recv}")
    parts = []
    for j in range(n):
        lo = sum(_splits(j, n)[:r])
        parts.append(ints(f"a2a{j}", (sum(_splits(j, n)), 2))[lo:lo + want_recv[j]])
    check(out, torch.cat(parts), "forward")
    (out * ints(f"a2aw{r}", (sum(want_recv), 2))).sum().backward()
    # Row block sent to rank j comes back from j's weights at the offset of this rank's block in j's output.
    grads = []
    for j in range(n):
        recv_j = [_splits(i, n)[j] for i in range(n)]
        lo = sum(recv_j[:r])
        grads.append(ints(f"a2aw{j}", (sum(recv_j), 2))[lo:lo + _splits(r, n)[j]])
    check(x.grad, torch.cat(grads), "gradient")


@case
def grad_alltoall_equal():
    n, r = hvd.size(), hvd.rank()
    x = leaf(f"a2e{r}", (2 * n, 3))
    out = hvd.alltoall(x)
    if isinstance(out, tuple):
        raise AssertionError("alltoall without splits returned a tuple")
    (out * ints(f"a2ew{r}", (2 * n, 3))).sum().backward()
    want = torch.cat([ints(f"a2ew{j}", (2 * n, 3))[2 * r:2 * r + 2] for j in range(n)])
    check(x.grad, want, "gradient")


def _rows(total: int, n: int, r: int) -> tuple[int, int]:
    base, extra = divmod(total, n)
    lo = r * base + min(r, extra)
    return lo, base + (1 if r < extra else 0)


@case
def grad_reducescatter():
    n, r = hvd.size(), hvd.rank()
    total = 2 * n + 1
    for op in (hvd.Sum, hvd.Average):
        x = leaf(f"rs{op}x{r}", (total, 2))
        y = hvd.reducescatter(x, op=op)
        lo, cnt = _rows(total, n, r)
        xs = sum(ints(f"rs{op}x{j}", (total, 2)) for j in range(n)) / (n if op == hvd.Average else 1)
        check(y, xs[lo:lo + cnt], f"op {op} forward", 1e-6)
        (y * ints(f"rs{op}w{r}", (cnt, 2))).sum().backward()
        gathered = torch.cat([ints(f"rs{op}w{j}", (_rows(total, n, j)[1], 2)) for j in range(n)])
        check(x.grad, gathered * (n if op == hvd.Sum else 1), f"op {op} gradient")


@case
def grad_grouped_reducescatter():
    n, r = hvd.size(), hvd.rank()
    xs = [leaf(f"grs{i}x{r}", (n + i, 2)) for i in range(2)]
    ys = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    sum((y * ints(f"grs{i}w{r}", tuple(y.shape))).sum() for i, y in enumerate(ys)).backward()
    for i, x in enumerate(xs):
        gathered = torch.cat([ints(f"grs{i}w{j}", (_rows(n + i, n, j)[1], 2)) for j in range(n)])
        check(x.grad, gathered * n, f"tensor {i} gradient")


@case
def average_and_op_errors_then_next_op():
    try:
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)
        raise AssertionError("average= with op= did not raise ValueError")
    except ValueError:
        pass
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = hvd.allreduce(torch.ones(2), average=False, name="deprecated_average")
    if not any(issubclass(w.category, DeprecationWarning) for w in caught):
        raise AssertionError("average= gave no DeprecationWarning")
    check(y, torch.full((2,), float(hvd.size())), "average=False sums")


# ---- functions -----------------------------------------------------------------------------------
def _model(seed: int) -> nn.Module:
    return seeded(nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 2)), seed)


@case
def broadcast_parameters_forms():
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    for form in ("state_dict", "named_list", "tensor_list"):
        model = _model(r)
        want = _model(root)
        model[1].num_batches_tracked.fill_(r)
        want[1].num_batches_tracked.fill_(root)
        if form == "state_dict":
            hvd.broadcast_parameters(model.state_dict(), root_rank=root)
            pairs = zip(model.state_dict().values(), want.state_dict().values())
        elif form == "named_list":
            hvd.broadcast_parameters(list(model.named_parameters()), root_rank=root)
            pairs = zip(model.parameters(), want.parameters())
        else:
            hvd.broadcast_parameters(list(model.parameters()), root_rank=root)
            pairs = zip(model.parameters(), want.parameters())
        for i, (got, exp) in enumerate(pairs):
            check(got.detach(), exp.detach(), f"{form} entry {i}")


def _trained_adam(seed: int, lr: float, steps: int):
    model = _model(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.8, 0.9))
    for s in range(steps):
        opt.zero_grad()
        model(ints(f"adam{seed}.{s}", (6, 4))).square().mean().backward()
        opt.step()
    return model, opt


@case
def broadcast_optimizer_state_adam():
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    # The root has trained (state present); other ranks have a fresh optimizer (empty state).
    model, opt = _trained_adam(r, lr=0.01 * (r + 1), steps=3 if r == root else 0)
    _, want = _trained_adam(root, lr=0.01 * (root + 1), steps=3)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    if opt.param_groups[0]["lr"] != want.param_groups[0]["lr"] or opt.param_groups[0]["betas"] != (0.8, 0.9):
        raise AssertionError(f"options not broadcast: {opt.param_groups[0]}")
    got_sd, want_sd = opt.state_dict()["state"], want.state_dict()["state"]
    if sorted(got_sd) != sorted(want_sd):
        raise AssertionError(f"state keys {sorted(got_sd)} vs {sorted(want_sd)}")
    for k in want_sd:
        for key, v in want_sd[k].items():
            check(torch.as_tensor(got_sd[k][key]).float(), torch.as_tensor(v).float(), f"state[{k}][{key}]", 1e-7)


@case
def broadcast_optimizer_state_distributed_sgd():
    n, r = hvd.size(), hvd.rank()
    model = _model(0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.5),
                                   named_parameters=model.named_parameters())
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    if opt.param_groups[0]["lr"] != 0.1:
        raise AssertionError(f"lr {opt.param_groups[0]['lr']} after broadcast, want 0.1")
    for p, b in zip(model.parameters(), before):
        check(p.detach(), b, "a zero-gradient initialising step changed a parameter")
        if p.grad is None or p.grad.count_nonzero() != 0:
            raise AssertionError(f"the initialising step left gradient {p.grad!r}, want zeros (as Horovod)")
    if len(opt.state) != len(before):
        raise AssertionError(f"{len(opt.state)} state entries after broadcast, want {len(before)}")


@case
def broadcast_and_allgather_objects():
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    obj = {"epoch": 7, "name": "ringlet", "nested": [1.5, (2, 3)], "t": torch.arange(3)} if r == root else None
    got = hvd.broadcast_object(obj, root_rank=root)
    if got["epoch"] != 7 or got["nested"] != [1.5, (2, 3)] or not torch.equal(got["t"], torch.arange(3)):
        raise AssertionError(f"broadcast_object returned {got!r}")
    named = hvd.broadcast_object("x" * (r + 1), root_rank=0, name="named_obj")
    if named != "x":
        raise AssertionError(f"named broadcast_object returned {named!r}")
    gathered = hvd.allgather_object({"rank": r, "items": list(range(r))})
    if gathered != [{"rank": j, "items": list(range(j))} for j in range(n)]:
        raise AssertionError(f"allgather_object returned {gathered!r}")


# ---- SyncBatchNorm -------------------------------------------------------------------------------
def _bn_case(dims: int, key: str) -> None:
    n, r = hvd.size(), hvd.rank()
    c = 3
    shape_of = (lambda b: (b, c)) if dims == 1 else (lambda b: (b, c, 2, 3))
    sizes = [2 + j for j in range(n)]  # different batch sizes per rank
    xs = [ints(f"{key}x{j}", shape_of(sizes[j])) for j in range(n)]
    ws = [ints(f"{key}w{j}", shape_of(sizes[j])) for j in range(n)]
    sbn = hvd.SyncBatchNorm(c, momentum=0.3)
    ref = nn.BatchNorm1d(c, momentum=0.3) if dims == 1 else nn.BatchNorm2d(c, momentum=0.3)
    with torch.no_grad():
        for m in (sbn, ref):
            m.weight.copy_(torch.tensor([1.0, -2.0, 0.5]))
            m.bias.copy_(torch.tensor([0.25, 0.0, -1.0]))
    lo = sum(sizes[:r])
    for it in range(2):  # twice: the second pass also checks the updated running statistics are used right
        x = xs[r].clone().requires_grad_()
        y = sbn(x)
        (y * ws[r]).sum().backward()
        xr = torch.cat(xs).requires_grad_()
        yr = ref(xr)
        (yr * torch.cat(ws)).sum().backward()
        check(y.detach(), yr.detach()[lo:lo + sizes[r]], f"iteration {it} output", 1e-6)
        check(x.grad, xr.grad[lo:lo + sizes[r]], f"iteration {it} input gradient", 1e-5)
        gw = mpi_ops.allreduce(sbn.weight.grad, op=hvd.Sum)
        gb = mpi_ops.allreduce(sbn.bias.grad, op=hvd.Sum)
        check(gw, ref.weight.grad, f"iteration {it} summed weight gradient", 1e-5)
        check(gb, ref.bias.grad, f"iteration {it} summed bias gradient", 1e-5)
        check(sbn.running_mean, ref.running_mean, f"iteration {it} running mean", 1e-6)
        check(sbn.running_var, ref.running_var, f"iteration {it} running var", 1e-6)
        for m in (sbn, ref):
            m.zero_grad()
    sbn.eval()
    ref.eval()
    check(sbn(xs[r]), ref(torch.cat(xs))[lo:lo + sizes[r]].detach(), "eval output", 1e-6)


@case
def sync_batch_norm_1d():
    _bn_case(1, "sbn1")


@case
def sync_batch_norm_2d():
    _bn_case(2, "sbn2")


@case
def sync_batch_norm_in_training():
    """A model with SyncBatchNorm under DistributedOptimizer equals the BatchNorm model trained on the
    concatenated batch."""
    n, r = hvd.size(), hvd.rank()
    model = seeded(nn.Sequential(nn.Linear(4, 6), hvd.SyncBatchNorm(6), nn.Tanh(), nn.Linear(6, 1)), 3)
    ref = seeded(nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 1)), 3)
    start = copy.deepcopy(ref)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(3):
        x, y = ints(f"sbt{step}", (4 * n, 4)) / 4, ints(f"sbty{step}", (4 * n, 1)) / 4
        opt.zero_grad()
        ((model(x[4 * r:4 * r + 4]) - y[4 * r:4 * r + 4]) ** 2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        ((ref(x) - y) ** 2).mean().backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        check(p.detach(), q.detach(), f"parameter {name}", 1e-6)
    check(model[1].running_var, ref[1].running_var, "running var", 1e-6)
    if max(float((p - q).abs().max()) for p, q in zip(ref.parameters(), start.parameters())) < 1e-3:
        raise AssertionError("training did not move the parameters")
