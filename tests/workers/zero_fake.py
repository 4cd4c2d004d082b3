"""A reference sharder for the checkpoint tests: the ZeRO checkpoint interface of ``zero/state.py``
(``stage``, ``world``, ``shard_rank``, ``shard_state()``, ``load_shard_state(fetch)``, ``param_groups``)
and nothing more, on top of ``zero/layout.py``.

:class:`RefZero` takes a plain model and a real ``torch.optim`` optimizer over its parameters (possibly
with state already) and keeps, for the pieces ``Layout.bucketed(...).pieces(rank)`` gives this rank,
float32 master copies and an optimizer of the same class over them, whose state is the unsharded one
sliced to the piece. "Training" (:meth:`RefZero.step`) is a deterministic update: every element's
gradient is an exact function of its own master value, its index and the step, the inner optimizer steps
the pieces, and the parameters are refreshed by an all-gather of the shards (as ZeRO stage 1 does) —
so a run's result does not depend on the world size and can be compared exactly.
"""
from __future__ import annotations

import torch

from ringlet.torch.training.zero.layout import Layout
from ringlet.torch.training.zero.state import PieceState, ShardState


def fake_gradient(master: torch.Tensor, start: int, step: int) -> torch.Tensor:
    """The gradient of elements ``start ..`` of a parameter whose master values are ``master``: exact
    element-wise arithmetic, so any cut of the parameter gives the same values."""
    idx = torch.arange(start, start + master.numel(), dtype=torch.float32)
    return master * 0.5 - torch.remainder(idx, 7.0) * 0.125 + step * 0.0625


class RefZero:
    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, world: int, rank: int, *,
                 stage: int = 1, bucket_bytes: int = 64):
        self.module, self.world, self.shard_rank, self.stage = module, world, rank, stage
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        group_of = {id(p): g for g, group in enumerate(optimizer.param_groups) for p in group["params"]}
        named = list(reversed(named))  # backward order, as ZeRO buckets them
        self.params = dict(named)
        self.layout = Layout.bucketed(named, [group_of[id(p)] for _, p in named], world, bucket_bytes)
        self.pieces = self.layout.pieces(rank)
        self.masters = [self.params[pc.slot.name].detach().reshape(-1)[pc.start:pc.end].float().clone()
                        for pc in self.pieces]
        groups = []
        for g, group in enumerate(optimizer.param_groups):
            mine = [m for pc, m in zip(self.pieces, self.masters) if self.layout.buckets[pc.bucket].group == g]
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": mine})
        self.inner = type(optimizer)(groups)
        for pc, m in zip(self.pieces, self.masters):
            full = optimizer.state.get(self.params[pc.slot.name], {})
            self.inner.state[m] = {k: _slice(k, v, pc) for k, v in full.items()}

    @property
    def param_groups(self):
        return self.inner.param_groups

    def _group(self, pc) -> int:
        return self.layout.buckets[pc.bucket].group

    def shard_state(self) -> ShardState:
        pieces = []
        for pc, m in zip(self.pieces, self.masters):
            state = {k: v.clone() if torch.is_tensor(v) else v for k, v in self.inner.state.get(m, {}).items()}
            p = self.params[pc.slot.name]
            pieces.append(PieceState(pc.slot.name, tuple(p.shape), p.dtype, self._group(pc), pc.start, pc.end,
                                     m.detach().clone(), state))
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.inner.param_groups]
        return ShardState(self.stage, self.world, self.shard_rank, pieces, groups, {"kind": "RefZero"})

    def load_shard_state(self, fetch) -> None:
        for pc, m in zip(self.pieces, self.masters):
            master, state = fetch(pc.slot.name, pc.start, pc.end)
            assert master.dtype == torch.float32 and master.shape == (pc.numel,), (pc, master.shape)
            with torch.no_grad():
                m.copy_(master)
            self.inner.state[m] = state
        self.refresh()

    @torch.no_grad()
    def step(self, step: int) -> None:
        for pc, m in zip(self.pieces, self.masters):
            m.grad = fake_gradient(m.detach(), pc.start, step)
        self.inner.step()
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Every parameter from the masters: this rank's shard into a flat bucket, all-gathered."""
        for b in self.layout.buckets:
            flat = torch.zeros(b.numel, dtype=b.dtype)
            lo, _ = b.shard(self.shard_rank)
            for pc, m in zip(self.pieces, self.masters):
                if pc.bucket == b.index:
                    flat[lo + pc.shard_start: lo + pc.shard_start + pc.numel] = m.to(b.dtype)
            if self.world > 1:
                from ringlet.torch.comm import Comm

                Comm().allgather_flat_(flat, b.counts, f"ref.{b.index}").wait()
            for s in b.slots:
                self.params[s.name].copy_(flat[s.offset:s.offset + s.numel].view(s.shape))


def _slice(key: str, value, pc):
    """The unsharded state ``value`` for piece ``pc``: per-element tensors (the parameter's shape; ``step``
    is always per parameter) sliced to 1-D, anything else copied."""
    if torch.is_tensor(value) and key != "step" and tuple(value.shape) == pc.slot.shape:
        return value.detach().reshape(-1)[pc.start:pc.end].clone()
    return value.clone() if torch.is_tensor(value) else value
