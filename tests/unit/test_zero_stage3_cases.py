"""ZeRO stage 3's cases, written once: the in-process tests (test_zero_stage3.py) run them on ranks as
threads, a real-process worker can run them under ``ringlet run`` (each takes the current ringlet
runtime's world). A case never raises for a wrong value: it returns the list of what failed, so a check
that fails on one rank does not leave the others waiting in a collective.

Models (:data:`MODELS`): ``mlp`` (three linear units), ``tiny`` (units of 1 and 2 elements: fewer than
ranks), ``tied`` (embedding and output head share a weight), ``nested`` (a module with its own parameter
around a child), ``unused`` (a unit whose module ignores its parameters, a unit with one unused and one
empty parameter, a unit of zero elements), ``twice`` (a module called twice in one forward),
``attention`` (``nn.MultiheadAttention``: reads its ``out_proj``'s parameters without calling it),
``peeks`` (a parent reads a child's parameters). Values are small multiples of 1/4,
inputs small integers, so forwards and gradients are exact in float32.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ringlet.torch.comm import Comm
from ringlet.torch.training.zero import Layout
from ringlet.torch.training.zero.reduce import Reducer
from ringlet.torch.training.zero.stage3 import ShardedParameters, units_of
from ringlet.torch.training.zero.stage3_unit import FREE

TOL = 1e-6


class Scaled(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(n))
        self.inner = nn.Linear(n, n)

    def forward(self, x):
        return self.inner(x) * self.scale


class Ignores(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * 2


class Partly(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.ones(3))
        self.b = nn.Parameter(torch.ones(2))
        self.e = nn.Parameter(torch.ones(0))

    def forward(self, x):
        return x * self.a.sum() + self.e.sum()


class Empty(nn.Module):
    """A unit of zero elements."""

    def __init__(self):
        super().__init__()
        self.e = nn.Parameter(torch.ones(0))

    def forward(self, x):
        return x + self.e.sum()


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(5, 4)
        self.block = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.block(torch.relu(self.block(self.pre(x)))))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 4)
        self.mid = nn.Linear(4, 4)
        self.head = nn.Linear(4, 11)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.relu(self.mid(self.emb(ids)))).sum(1)


class Attention(nn.Module):
    """nn.MultiheadAttention reads ``out_proj.weight`` without calling ``out_proj``."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(5, 8)
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        h = self.proj(x).view(-1, 2, 4)
        return self.out(self.attn(h, h, h)[0].reshape(-1, 8))


class Peeks(nn.Module):
    """Reads a child's parameter without calling the child."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 3)
        self.b = nn.Linear(5, 3)

    def forward(self, x):
        return self.b(x) * self.a.weight.sum(0)[:3] + self.a.bias


def _mlp():
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3), nn.Linear(3, 2))


def _tiny():
    return nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 1), nn.Linear(1, 2, bias=False), nn.Linear(2, 1))


MODELS = {
    "mlp": _mlp,
    "tiny": _tiny,
    "tied": Tied,
    "nested": lambda: nn.Sequential(nn.Linear(5, 3), Scaled(3), nn.Linear(3, 2)),
    "unused": lambda: nn.Sequential(nn.Linear(5, 3), Ignores(), Partly(), Empty(), nn.Linear(3, 2)),
    "twice": Twice,
    "attention": Attention,
    "peeks": Peeks,
}


def make_model(name: str, seed: int = 0) -> nn.Module:
    """The model ``name`` with exact values (multiples of 1/4 in [-1/2, 1/2]), the same for a seed."""
    torch.manual_seed(seed)
    model = MODELS[name]()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-2, 3, p.shape, generator=g).to(p.dtype) / 4)
    return model


def batch(name: str, rank: int, step: int) -> torch.Tensor:
    """Rank ``rank``'s input of step ``step`` (small integers; token ids for ``tied``)."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    if name == "tied":
        return torch.randint(0, 11, (3, 2), generator=g)
    width = 1 if name == "tiny" else 5
    return torch.randint(-3, 4, (4, width), generator=g).float()


class Blocks:
    """The stand-in for the optimizer's gradient path: reduce-scatters every unit gradient through the
    reducer (average) and sums this rank's blocks; counts the calls."""

    def __init__(self, layout: Layout, reducer):
        self.layout, self.reducer = layout, reducer
        rank = reducer.shard_rank
        self.blocks = [torch.zeros(b.counts[rank]) for b in layout.buckets]
        self.calls: list[int] = []

    def __call__(self, bucket: int, flat: torch.Tensor) -> None:
        self.calls.append(bucket)
        counts = self.layout.buckets[bucket].counts
        self.blocks[bucket] += self.reducer.reduce_scatter_(flat, counts, f"g{bucket}").wait()


def build(name: str, prefetch: bool = True, reducer=None, by_group: bool = False):
    """Model ``name`` under stage 3 on the current runtime: (model, ShardedParameters, Blocks, layout).
    ``by_group``: biases in another param group than weights, so that every module's unit is split in
    two buckets."""
    model = make_model(name)
    reducer = reducer or Reducer(Comm())
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [int(by_group and n.endswith("bias")) for n, _ in named]
    layout = Layout.units(named, groups, reducer.shard_size, units_of(model, named, groups))
    blocks = Blocks(layout, reducer)
    return model, ShardedParameters(model, named, layout, reducer, blocks, prefetch=prefetch), blocks, layout


def expected_blocks(name: str, layout: Layout, rank: int, world: int, steps) -> list[torch.Tensor]:
    """This rank's block of every bucket of the plain model's gradient, averaged over ranks, summed over
    the (rank-independent) list of ``steps`` (forward+backward each, accumulated)."""
    total = None
    for r in range(world):
        ref = make_model(name)
        for s in steps:
            ref(batch(name, r, s)).sum().backward()
        grads = dict(ref.named_parameters())
        flat = [torch.cat([_grad(grads[sl.name]).reshape(-1) for sl in b.slots]) for b in layout.buckets]
        total = flat if total is None else [t + f for t, f in zip(total, flat)]
    out = []
    for b, t in zip(layout.buckets, total):
        lo, hi = b.shard(rank)
        out.append(t[lo:hi] / world)
    return out


def _grad(p: torch.Tensor) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def _released(sp: ShardedParameters) -> list[str]:
    bad = [u.name for u in sp.units if u.state != FREE or u.flat.untyped_storage().nbytes() != 0]
    bad += [f"{u.name} parameter data" for u in sp.units if any(p.numel() for p in u.params)]
    if sp.memory()["gathered"] != 0:
        bad.append(f"{sp.memory()['gathered']} bytes gathered")
    return bad


def case_equivalence(rank: int, world: int, name: str, prefetch: bool, accumulate: int = 1,
                     by_group: bool = False) -> list[str]:
    """Two steps (``accumulate`` forward+backward each): outputs bitwise the plain model's, the blocks
    the reduce-scatter of the plain model's gradients, each unit's gradient handed at most once per
    backward, every buffer freed after each forward and backward, the peak within the declared bound,
    the shards of the right size; also an eval forward."""
    fails: list[str] = []
    model, sp, blocks, layout = build(name, prefetch, by_group=by_group)
    ref = make_model(name)
    shard_bytes = sum(b.counts[rank] for b in layout.buckets) * 4
    if sp.memory()["shards"] != shard_bytes:
        fails.append(f"shards hold {sp.memory()['shards']} bytes, expected {shard_bytes}")
    for step in range(2):
        seen = []
        for micro in range(accumulate):
            s = step * accumulate + micro
            seen.append(s)
            x = batch(name, rank, s)
            y = model(x)
            if not torch.equal(y, ref(x)):
                fails.append(f"step {s}: output differs from the plain model")
            fails += [f"after forward {s}: {b} still gathered" for b in _released(sp)]
            del blocks.calls[:]
            y.sum().backward()
            fails += [f"after backward {s}: {b} still gathered" for b in _released(sp)]
            if len(set(blocks.calls)) != len(blocks.calls):
                fails.append(f"backward {s}: a unit's gradient handed twice: {blocks.calls}")
        want = expected_blocks(name, layout, rank, world, seen)
        for b, (got, exp) in enumerate(zip(blocks.blocks, want)):
            if not torch.allclose(got, exp, rtol=TOL, atol=TOL):
                fails.append(f"step {step} bucket {b}: block differs by {(got - exp).abs().max()}")
            got.zero_()
    with torch.no_grad():
        model.eval(), ref.eval()
        x = batch(name, rank, 99)
        if not torch.equal(model(x), ref(x)):
            fails.append("eval forward differs")
    fails += [f"after eval: {b} still gathered" for b in _released(sp)]
    if sp.memory()["peak_gathered"] > sp.bound_bytes() and name in ("mlp", "tiny", "unused"):
        fails.append(f"peak {sp.memory()['peak_gathered']} bytes above the bound {sp.bound_bytes()}")
    sp.close()
    return fails
