"""DistributedOptimizer's gradients as ordered, fused all-reduces (ringlet.torch.ordered_grads), ranks as
threads: buffers per wire dtype, join() with uneven steps on 1-4 ranks, join() with two live optimizers
stepped in turn, and the name-matched path chosen by RINGLET_HVD_GRADIENTS=named.

Real processes: tests/workers/hvd_cases_fused.py.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ringlet.torch as hvd
from hvd_world import hvd_world
from ringlet.torch.ordered_grads import FusedGradients


def test_buckets_hold_the_wire_dtype_and_gradients_come_back_in_theirs():
    """Horovod's Compression.fp16 is the buckets' wire dtype: float32 and float64 gradients travel as
    float16 (one bucket per parameter dtype) and come back in their own dtype, in the same tensor."""
    p = 2

    def fn(rank):
        m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2).double())
        with torch.no_grad():
            for q in m.parameters():
                q.fill_(0.5)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters(),
                                       compression=hvd.Compression.fp16)
        x = torch.full((2, 3), float(rank + 1))
        m[1](m[0](x).double()).sum().backward()
        before = [q.grad for q in m.parameters()]
        opt.synchronize()
        assert all(q.grad is b for q, b in zip(m.parameters(), before))
        assert isinstance(opt._ordered, FusedGradients)
        return ({b.buffer.dtype for b in opt._ordered.active.buckets}, len(opt._ordered.active.buckets),
                [(q.grad.dtype, q.grad.clone()) for q in m.parameters()])

    res = hvd_world(p, fn)
    dtypes, n, grads = res[0]
    assert dtypes == {torch.float16} and n == 2
    assert [d for d, _ in grads] == [torch.float32] * 2 + [torch.float64] * 2
    for (_, a), (_, b) in zip(grads, res[1][2]):
        assert torch.equal(a, b)


def _model(seed: int = 3) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randint(-2, 3, p.shape, generator=g).float() / 2)
    return m


def _grads(m: nn.Module, rank: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randint(-2, 3, (4, 3), generator=g).float(), torch.randint(-2, 3, (4, 2), generator=g).float()
    m.zero_grad()
    F.mse_loss(m(x), y).backward()
    return [p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_reduced_gradients_take_the_fused_buffer_without_a_copy(set_to_none):
    """As in Horovod, ``.grad`` keeps its identity and takes the reduced memory: here a view of the fused
    buffer, which is reused step after step. A gradient the caller keeps from an earlier step (with
    ``zero_grad(set_to_none=True)``) is not overwritten: the buffer it holds is left to it."""
    p = 2

    def fn(rank):
        m = _model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters())
        ptrs, kept = [], None
        for step in range(5):
            want = [sum(gs) / p for gs in zip(*(_grads(_model(), j, step) for j in range(p)))]
            g = torch.Generator().manual_seed(1000 * step + rank)
            x, y = torch.randint(-2, 3, (4, 3), generator=g).float(), torch.randint(-2, 3, (4, 2), generator=g).float()
            m.zero_grad(set_to_none=set_to_none)
            F.mse_loss(m(x), y).backward()
            before = [q.grad for q in m.parameters()]
            opt.synchronize()
            assert all(q.grad is b for q, b in zip(m.parameters(), before))
            del before
            for q, w in zip(m.parameters(), want):
                torch.testing.assert_close(q.grad, w, rtol=0, atol=1e-6)
            ptrs.append(opt._ordered.active.buckets[0].buffer.data_ptr())
            if step == 2 and set_to_none:
                kept = [(q.grad, q.grad.clone()) for q in m.parameters()]
            with opt.skip_synchronize():
                opt.step()
        if kept is not None:
            assert all(torch.equal(a, b) for a, b in kept)
        return ptrs

    for ptrs in hvd_world(p, fn):
        assert ptrs[0] == ptrs[1] == ptrs[2]       # reused while only the lent gradients hold it
        if set_to_none:
            assert ptrs[3] != ptrs[2]              # step 2's gradients are kept by the caller
        else:
            assert ptrs[3] == ptrs[2] == ptrs[4]   # the caller's references are .grad itself


def _step(m, opt, rank: int, step: int, stepping: list[int], n: int, seed: int = 3) -> None:
    """One step at lr 0; the reduced gradients must be the sum over the stepping ranks / n."""
    want = [sum(gs) / n for gs in zip(*(_grads(_model(seed), j, step) for j in stepping))]
    _grads(m, rank, step)
    opt.synchronize()
    for p, w in zip(m.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=1e-6)
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_join_with_uneven_steps(p):
    def fn(rank):
        m = _model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters())
        steps = [rank + 1 for rank in range(p)]  # rank 0 joins first, the last rank last
        for s in range(steps[rank]):
            _step(m, opt, rank, s, [j for j in range(p) if steps[j] > s], p)
        last = hvd.join()
        _step(m, opt, rank, 50, list(range(p)), p)  # together again
        return last

    assert hvd_world(p, fn) == [p - 1] * p


def test_join_serves_the_optimizer_the_others_step():
    """Two optimizers stepped in turn; rank 0 joins first and must mirror both in the others' order."""
    p = 3

    def fn(rank):
        m1, m2 = _model(3), _model(5)
        o1 = hvd.DistributedOptimizer(torch.optim.SGD(m1.parameters(), lr=0.0), named_parameters=m1.named_parameters())
        o2 = hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.0), named_parameters=m2.named_parameters())
        steps = [1, 3, 3]
        for s in range(steps[rank]):
            stepping = [j for j in range(p) if steps[j] > s]
            _step(m1, o1, rank, s, stepping, p, seed=3)
            _step(m2, o2, rank, 10 + s, stepping, p, seed=5)
            if s % 2 == 1:
                _step(m2, o2, rank, 20 + s, stepping, p, seed=5)  # o2 stepped twice: the joined rank must follow
        return hvd.join()

    last = hvd_world(p, fn)
    assert last in ([1, 1, 1], [2, 2, 2])  # ranks 1 and 2 join at about the same time: either is last


def test_named_path_on_request(monkeypatch):
    monkeypatch.setenv("RINGLET_HVD_GRADIENTS", "named")

    def fn(rank):
        m = _model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters())
        assert opt._ordered.comm.coordinated  # every reduction matched by name
        _step(m, opt, rank, 0, [0, 1], 2)
        return True

    assert hvd_world(2, fn) == [True, True]


def test_join_after_an_optimizer_of_a_smaller_process_set():
    """An optimizer of process set {0, 1} exists on its members only: the world optimizer built after it
    must still carry the same number on every rank, or the joined rank could not tell which one steps."""
    p = 3

    def fn(rank):
        ps = hvd.add_process_set([0, 1])
        if rank in (0, 1):
            m0 = _model(7)
            hvd.DistributedOptimizer(torch.optim.SGD(m0.parameters(), lr=0.0), named_parameters=m0.named_parameters(),
                                     process_set=ps)
        m = _model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters())
        steps = [2, 2, 1]  # rank 2, which lacks the smaller set's optimizer, joins first
        for s in range(steps[rank]):
            _step(m, opt, rank, s, [j for j in range(p) if steps[j] > s], p)
        last = hvd.join()
        hvd.remove_process_set(ps)
        return last

    assert hvd_world(p, fn) in ([0, 0, 0], [1, 1, 1])  # ranks 0 and 1 join at about the same time


class _Sparse(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 3, sparse=True)
        self.lin = nn.Linear(3, 2)
        with torch.no_grad():
            self.emb.weight.fill_(0.5)
            self.lin.weight.fill_(0.25)
            self.lin.bias.zero_()

    def forward(self, idx):
        return self.lin(self.emb(idx))


def _sparse_step(rank: int, groups_of=None, **kw):
    m = _Sparse()
    if groups_of is not None:
        kw["groups"] = groups_of(m)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters(), **kw)
    m(torch.tensor([rank, 3])).sum().backward()
    opt.synchronize()
    return m, opt


def test_sparse_gradients_beside_the_buckets_and_with_groups_and_other_ops():
    """A sparse gradient is reduced by name beside the buckets (fused and name-matched paths alike); in a
    group, or with a ringlet compressor, it is refused with what to do instead."""
    def fn(rank):
        m, opt = _sparse_step(rank)
        fused = (m.emb.weight.grad.to_dense().clone(), m.lin.weight.grad.clone())
        m, opt = _sparse_step(rank, op=hvd.Max, sparse_as_dense=True)
        assert opt._ordered.comm.coordinated and m.emb.weight.grad.is_sparse
        top = m.lin.weight.grad.clone()
        m, opt = _sparse_step(rank, lambda net: [[net.lin.weight, net.lin.bias]])
        grouped = m.lin.weight.grad.clone()
        with pytest.raises(ValueError, match="in a\\s+group"):
            _sparse_step(rank, lambda net: [[net.emb.weight, net.lin.weight]])
        with pytest.raises(ValueError, match="sparse_as_dense=True"):
            _sparse_step(rank, compression="fp16")
        return fused, top, grouped

    res = hvd_world(2, fn)
    (emb, lin), top, grouped = res[0]
    assert torch.equal(emb, res[1][0][0]) and torch.equal(lin, res[1][0][1])
    assert emb[0].abs().sum() > 0 and emb[1].abs().sum() > 0 and emb[2].abs().sum() == 0
    assert torch.equal(top, res[1][1]) and torch.equal(grouped, lin)


def test_a_lone_gradient_is_reduced_in_place():
    """A bucket of one parameter (here a weight over the first bucket's 1 MiB cap) all-reduces the gradient
    autograd made, in place: nothing is copied into a bucket buffer."""
    def fn(rank):
        m = nn.Linear(600, 500, bias=False)
        with torch.no_grad():
            m.weight.fill_(0.01)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters())
        m(torch.full((2, 600), float(rank + 1))).sum().backward()
        ptr = m.weight.grad.data_ptr()
        opt.synchronize()
        lone = [b for b in opt._ordered.active.buckets if b.params == [m.weight]]
        return ptr == m.weight.grad.data_ptr() == lone[0].buffer.data_ptr(), m.weight.grad[0, 0].item()

    res = hvd_world(2, fn)
    assert all(ok for ok, _ in res)
    assert res[0][1] == res[1][1] == pytest.approx(3.0)  # (2 * 1 + 2 * 2) / 2 rows summed, averaged
