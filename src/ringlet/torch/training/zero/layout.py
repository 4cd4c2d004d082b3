"""Where every element of the model state lives under ZeRO: parameters grouped into flat buckets, each
bucket split into one contiguous shard per rank.

A **bucket** is the unit of communication: the flattened parameters of one dtype and one optimizer
param group, concatenated in the order given (backward order for stages 1 and 2, one bucket per module
unit for stage 3). A bucket of ``n`` elements is cut into ``p`` contiguous shards, rank ``r`` owning
``counts[r]`` elements from ``starts[r]``: the reduce-scatter of a bucket's gradients leaves each rank its
shard summed, the all-gather of the shards rebuilds the bucket. A parameter may straddle two shards; the
part one rank owns is a :class:`Piece` (an element range of the flattened parameter).

Partitions (strategy objects, one per way of cutting):

* :class:`Even` — ``n // p`` elements each, the first ``n % p`` ranks one more (exact memory balance;
  correct for optimizers that update every element on its own: SGD, Adam, AdamW, ...);
* :class:`WholeParameters` — cuts only at parameter edges (each rank owns whole parameters, contiguous,
  balanced greedily), for optimizers that look at a whole parameter at once (norms, factored moments).

Everything here is arithmetic on sizes: identical on every rank given the same parameters, so ranks
agree without talking. Checkpoints describe state by parameter name and element range (:class:`Piece`),
which does not depend on the world size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["Slot", "Piece", "Bucket", "Layout", "Partition", "Even", "WholeParameters"]


@dataclass(frozen=True, slots=True)
class Slot:
    """One parameter in a bucket: its ``name`` (as in ``module.named_parameters()``), ``index`` in the
    flat list of parameters the layout was built from, ``shape``, ``numel`` and ``offset`` in the bucket."""

    name: str
    index: int
    shape: tuple[int, ...]
    numel: int
    offset: int


@dataclass(frozen=True, slots=True)
class Piece:
    """Elements ``[start, end)`` of the flattened parameter ``slot``, owned by one rank; they sit at
    ``flat_start`` in the bucket ``bucket`` and at ``shard_start`` in that rank's shard of it."""

    slot: Slot
    bucket: int
    start: int
    end: int
    shard_start: int

    @property
    def numel(self) -> int:
        return self.end - self.start

    @property
    def flat_start(self) -> int:
        return self.slot.offset + self.start


class Partition:
    """How a bucket is cut into per-rank shards: :meth:`counts` gives the shard sizes in rank order."""

    def counts(self, slots: Sequence[Slot], world: int) -> tuple[int, ...]:
        raise NotImplementedError


class Even(Partition):
    """``n // p`` elements per rank, the first ``n % p`` ranks one more."""

    def counts(self, slots: Sequence[Slot], world: int) -> tuple[int, ...]:
        n = sum(s.numel for s in slots)
        return tuple(n // world + (1 if r < n % world else 0) for r in range(world))

    def __repr__(self) -> str:
        return "Even()"


class WholeParameters(Partition):
    """Cuts at parameter edges only: rank ``r`` takes parameters in order until its share reaches the
    ``(r+1)/p`` point of the bucket (a parameter goes to the rank whose share its middle falls in)."""

    def counts(self, slots: Sequence[Slot], world: int) -> tuple[int, ...]:
        n = sum(s.numel for s in slots)
        counts = [0] * world
        for s in slots:
            middle = s.offset + s.numel / 2
            r = min(world - 1, int(middle * world // n)) if n else 0
            counts[r] += s.numel
        return tuple(counts)

    def __repr__(self) -> str:
        return "WholeParameters()"


@dataclass(frozen=True)
class Bucket:
    """One flat bucket: ``slots`` in order, of ``dtype``, in optimizer param group ``group``; ``counts``
    and ``starts``: every rank's shard size and offset."""

    index: int
    dtype: torch.dtype
    group: int
    slots: tuple[Slot, ...]
    counts: tuple[int, ...]

    @property
    def numel(self) -> int:
        return sum(s.numel for s in self.slots)

    @property
    def starts(self) -> tuple[int, ...]:
        out, acc = [], 0
        for c in self.counts:
            out.append(acc)
            acc += c
        return tuple(out)

    def shard(self, rank: int) -> tuple[int, int]:
        """``(start, end)`` of ``rank``'s shard in the bucket."""
        start = self.starts[rank]
        return start, start + self.counts[rank]

    def pieces(self, rank: int) -> list[Piece]:
        """The parts of parameters that ``rank``'s shard holds, in bucket order."""
        lo, hi = self.shard(rank)
        out = []
        for s in self.slots:
            a, b = max(lo, s.offset), min(hi, s.offset + s.numel)
            if a < b:
                out.append(Piece(s, self.index, a - s.offset, b - s.offset, a - lo))
        return out


@dataclass(frozen=True)
class Layout:
    """Every bucket of a model under ZeRO for ``world`` ranks. Build with :meth:`bucketed` (stages 1, 2)
    or :meth:`units` (stage 3)."""

    world: int
    buckets: tuple[Bucket, ...]
    partition: Partition

    @staticmethod
    def bucketed(named: Sequence[tuple[str, torch.Tensor]], groups: Sequence[int], world: int, bucket_bytes: int,
                 partition: Partition | None = None) -> "Layout":
        """Buckets of at most ``bucket_bytes`` (a larger parameter gets a bucket of its own), filled in the
        order of ``named``, never mixing dtypes or param groups (``groups[i]``: the param group of
        ``named[i]``). ``ValueError`` for ``world < 1``, ``bucket_bytes < 1`` or mismatched lengths."""
        _check(named, groups, world)
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        runs: list[list[int]] = []
        open_: dict[tuple, tuple[list[int], int]] = {}
        for i, (_, t) in enumerate(named):
            key = (t.dtype, groups[i])
            size = t.numel() * t.element_size()
            members, used = open_.get(key, (None, 0))
            if members is None or (used + size > bucket_bytes and members):
                members, used = [], 0
                runs.append(members)
            members.append(i)
            open_[key] = (members, used + size)
        return _layout(named, groups, world, runs, partition or Even())

    @staticmethod
    def units(named: Sequence[tuple[str, torch.Tensor]], groups: Sequence[int], world: int,
              units: Sequence[Sequence[int]], partition: Partition | None = None) -> "Layout":
        """One bucket per unit (``units[u]``: indices into ``named``, one dtype and param group each; every
        index in exactly one unit). ``ValueError`` otherwise."""
        _check(named, groups, world)
        seen = sorted(i for u in units for i in u)
        if seen != list(range(len(named))):
            raise ValueError("every parameter must be in exactly one unit")
        for u in units:
            if len({(named[i][1].dtype, groups[i]) for i in u}) > 1:
                raise ValueError(f"a unit mixes dtypes or param groups: {[named[i][0] for i in u]}")
        return _layout(named, groups, world, [list(u) for u in units if u], partition or Even())

    def pieces(self, rank: int) -> list[Piece]:
        """Every piece ``rank`` owns, bucket by bucket."""
        return [p for b in self.buckets for p in b.pieces(rank)]

    def shard_numel(self, rank: int) -> int:
        return sum(b.counts[rank] for b in self.buckets)


def _check(named, groups, world) -> None:
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if len(groups) != len(named):
        raise ValueError(f"{len(named)} parameters but {len(groups)} group indices")


def _layout(named, groups, world: int, runs: list[list[int]], partition: Partition) -> Layout:
    buckets = []
    for b, members in enumerate(runs):
        slots, offset = [], 0
        for i in members:
            name, t = named[i]
            slots.append(Slot(name, i, tuple(t.shape), t.numel(), offset))
            offset += t.numel()
        t0 = named[members[0]][1]
        buckets.append(Bucket(b, t0.dtype, groups[members[0]], tuple(slots), partition.counts(slots, world)))
    return Layout(world, tuple(buckets), partition)
