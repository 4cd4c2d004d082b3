"""Mixture-of-experts cases shared by the in-process tests (``tests/unit/test_moe.py``) and the real-process
worker (``moe_worker.py``): a single-process reference written independently of ringlet's layer (a loop
over tokens and choices), the models, and checks that return the differences they found.

The reference holds all ``E`` experts, taken from ``MoE(..., ep_size=1)`` built with the same seed (so
the seeded construction is checked too: global expert ``g`` must be the same module on every layout).
Each rank's routing is its own (capacity counts this rank's tokens), so rank ``r``'s reference output is
the reference applied to rank ``r``'s batch; an expert's gradient without a wrapper is the sum over its
expert-parallel group's ranks, with :func:`ringlet.torch.moe_parallel` the mean over all ranks.
"""
from __future__ import annotations

import contextlib
import math

import torch

import ringlet
from ringlet.torch import MoE

H, E, T = 6, 8, 12  # hidden size, experts, tokens per rank (as a [3, 4, H] batch)
AUX = 0.1           # aux loss coefficient in the losses


def expert_module() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(H, 10), torch.nn.Tanh(), torch.nn.Linear(10, H))


class Net(torch.nn.Module):
    """A dense layer, then an MoE layer inside a residual connection."""

    def __init__(self, ep_size, k, capacity_factor, seed=3, pre_seed=None, group=None):
        super().__init__()
        self.pre = torch.nn.Linear(H, H)
        # Default: differs per rank until a wrapper broadcasts it.
        g = torch.Generator().manual_seed(100 + ringlet.rank() if pre_seed is None else pre_seed)
        with torch.no_grad():
            for p in self.pre.parameters():
                p.copy_(torch.rand(p.shape, generator=g) - 0.5)
        self.moe = MoE(H, expert_module(), E, ep_size=ep_size, k=k, capacity_factor=capacity_factor,
                       min_capacity=1, seed=seed, group=group)

    def forward(self, x):
        h = torch.tanh(self.pre(x))
        y, aux = self.moe(h)
        return h + y, aux


def batch(rank: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randn(3, 4, H, generator=g), torch.randn(3, 4, H, generator=g)


def reference_moe(x, gate, experts, k, capacity_factor, min_capacity=1):
    """Loop reference: ``(output, aux_loss, dropped)`` of the MoE contract on ``x`` with all experts."""
    rows = x.reshape(-1, H)
    tokens = rows.shape[0]
    cap = max(min_capacity, math.ceil(capacity_factor * tokens * k / len(experts)))
    probs = torch.softmax(gate(rows).float(), dim=-1)
    top_p, top_i = probs.topk(k, dim=-1)
    w = top_p if k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
    used, dropped = [0] * len(experts), 0
    out = [torch.zeros(H) for _ in range(tokens)]
    for c in range(k):  # first choices of every token take their slots before any second choice
        for t in range(tokens):
            e = int(top_i[t, c])
            if used[e] >= cap:
                dropped += 1
                continue
            used[e] += 1
            out[t] = out[t] + w[t, c] * experts[e](rows[t:t + 1])[0]
    first = torch.stack([(top_i[:, 0] == i).float().mean() for i in range(len(experts))])
    aux = len(experts) * (first * probs.mean(dim=0)).sum()
    return torch.stack(out).reshape(x.shape), aux, dropped


def reference_net(net: Net) -> tuple[torch.nn.Module, torch.nn.Module, list[torch.nn.Module]]:
    """``(pre, gate, experts)``: deep copies of ``net``'s dense layer and all ``E`` experts built with
    ``ep_size=1`` and the same seed (with the current dense weights)."""
    import copy

    full = MoE(H, expert_module(), E, ep_size=1, seed=3)
    full.gate.load_state_dict(net.moe.gate.state_dict())
    return copy.deepcopy(net.pre), full.gate, list(full.experts)


def reference_loss(ref, rank, k, cf, step=0):
    pre, gate, experts = ref
    x, c = batch(rank, step)
    h = torch.tanh(pre(x))
    y, aux, dropped = reference_moe(h, gate, experts, k, cf)
    return ((h + y) * c).sum() + AUX * aux, h + y, aux, dropped


def local_loss(net, rank, step=0):
    x, c = batch(rank, step)
    out, aux = net(x)
    return (out * c).sum() + AUX * aux, out, aux


def diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """Largest absolute difference; a missing gradient counts as zeros (an expert no token reached)."""
    if a is None or b is None:
        a, b = (a if a is not None else torch.zeros_like(b)), (b if b is not None else torch.zeros_like(a))
    return float((a.detach() - b.detach()).abs().max()) if a.numel() else 0.0


def check_unwrapped(ep: int, k: int, cf: float, tol: float = 1e-5) -> list[str]:
    """Output, aux loss, dropped count, gate and expert gradients of an unwrapped layer against the
    reference; the failures found."""
    rank, world = ringlet.rank(), ringlet.size()
    net = Net(ep, k, cf, pre_seed=100)  # the same dense layer on every rank: the group's losses are comparable
    loss, out, aux = local_loss(net, rank)
    loss.backward()
    ref = reference_net(net)
    errs = []
    r_loss, r_out, r_aux, r_dropped = reference_loss(ref, rank, k, cf)
    r_loss.backward()
    if diff(out, r_out) > tol or diff(aux, r_aux) > tol:
        errs.append(f"ep {ep} k {k} cf {cf}: output off by {diff(out, r_out):.2e}, aux by {diff(aux, r_aux):.2e}")
    if net.moe.stats["dropped"] != r_dropped:
        errs.append(f"ep {ep} k {k} cf {cf}: dropped {net.moe.stats['dropped']}, reference {r_dropped}")
    if diff(net.moe.gate.weight.grad, ref[1].weight.grad) > tol:
        errs.append(f"ep {ep} k {k} cf {cf}: gate grad off by {diff(net.moe.gate.weight.grad, ref[1].weight.grad):.2e}")
    # Expert grads: the sum over the ranks of this expert-parallel group (their tokens reach our experts).
    group0 = rank - rank % ep
    for m in ref:
        for p in (m.parameters() if isinstance(m, torch.nn.Module) else (q for e in m for q in e.parameters())):
            p.grad = None
    for s in range(group0, group0 + ep):
        reference_loss(ref, s, k, cf)[0].backward()
    for i, e in enumerate(net.moe.experts):
        g = net.moe.ep_rank * net.moe.num_local + i
        for p, q in zip(e.parameters(), ref[2][g].parameters()):
            if diff(p.grad, q.grad) > tol:
                errs.append(f"ep {ep} k {k} cf {cf}: expert {g} grad off by {diff(p.grad, q.grad):.2e}")
    return errs


def reference_train(ref, world, k, cf, steps, lr, accumulate=False):
    """SGD steps of the reference on the mean loss over all ranks' batches (with ``accumulate``, plus
    that of the batches of step ``100 + step``)."""
    params = [p for m in (ref[0], ref[1], *ref[2]) for p in m.parameters()]
    for step in range(steps):
        for p in params:
            p.grad = None
        batches = [step, 100 + step] if accumulate else [step]
        (sum(reference_loss(ref, r, k, cf, b)[0] for r in range(world) for b in batches) / world).backward()
        with torch.no_grad():
            for p in params:
                if p.grad is not None:  # an expert no token reached
                    p -= lr * p.grad


def check_training(ep: int, k: int, cf: float, steps: int = 2, lr: float = 0.05, tol: float = 1e-5,
                   zero_stage: int | None = None, accumulate: bool = False, group=None) -> list[str]:
    """``steps`` SGD steps under :func:`ringlet.torch.moe_parallel` (or :func:`moe_zero_optimizers` with
    ``zero_stage``) against the reference on all ranks' batches; the failures found. ``accumulate``: each
    step first accumulates the gradient of another batch (under ``no_sync()`` with DDP). ``group``: the
    span of the layers (None: the world); ranks and batches are counted within it."""
    from ringlet.torch import moe_parallel, moe_zero_optimizers

    rank, world = (ringlet.rank(), ringlet.size()) if group is None else (group.rank_of(ringlet.rank()), group.size)
    net = Net(ep, k, cf, group=group)
    if zero_stage is None:
        model = moe_parallel(net, bucket_cap_mb=0.0005)
        opts = [torch.optim.SGD(net.parameters(), lr=lr)]
    else:
        model, opts = net, list(moe_zero_optimizers(torch.optim.SGD, net, stage=zero_stage, lr=lr))
    ref = reference_net(net)  # after the wrapper's broadcast: rank 0's dense layer
    for step in range(steps):
        if accumulate:
            with model.no_sync() if zero_stage is None else contextlib.nullcontext():
                local_loss(model, rank, 100 + step)[0].backward()
        local_loss(model, rank, step)[0].backward()
        for o in opts:
            o.step()
            o.zero_grad()
    reference_train(ref, world, k, cf, steps, lr, accumulate)
    errs = []
    for name, a, b in [("pre", net.pre, ref[0]), ("gate", net.moe.gate, ref[1])] + \
            [(f"expert {net.moe.ep_rank * net.moe.num_local + i}", e, ref[2][net.moe.ep_rank * net.moe.num_local + i])
             for i, e in enumerate(net.moe.experts)]:
        d = max(diff(p, q) for p, q in zip(a.parameters(), b.parameters()))
        if d > tol:
            errs.append(f"ep {ep} k {k} zero {zero_stage}: {name} off by {d:.2e} after {steps} steps")
    return errs
