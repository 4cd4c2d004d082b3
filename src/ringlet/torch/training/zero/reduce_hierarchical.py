"""Hierarchical sharding (ZeRO++'s hierarchical partition): shard within a host, replicate across hosts.

The shard group of a rank is the ranks of its host; its replica group the ranks with the same local
index on every host. A bucket is sharded over ``shard_size`` = ranks per host, so the parameters'
all-gather, which every step and (stage 3) every forward waits for, crosses only the fast link inside a
host. Gradients: a reduce-scatter (sum) within the host, then an all-reduce (sum) of the block across
hosts, with the group's ``algorithm`` (``"auto"``: the cost model's choice where one is installed),
divided by ``world``. Every replica of a block ends with bitwise the same values (ringlet's
all-reduces, compressed ones too, give every member the same bits), so the replicas' optimizer steps
keep their shards identical.

With ``compression`` the all-reduce across hosts (the slow link) is compressed
(:meth:`~ringlet.torch.comm.Comm.allreduce_compressed_`, the compressor's own strategy; its state, error
feedback's residuals included, in the bucket's ``state`` under ``"cross"``); the reduce-scatter inside a
host stays exact. Compressors with their own schedule (PowerSGD) are refused, as by
:class:`~ringlet.torch.training.zero.reduce_compressed.CompressedReducer`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

import ringlet
from ringlet.types import ReduceOp

from ...comm import Comm, CommFuture
from .reduce_compressed import compressor_for_buckets, needs_state

__all__ = ["HierarchicalReducer", "Hosts"]


@dataclass(frozen=True)
class Hosts:
    """The members of a group (global ranks, in group order) by host: ``hosts[h]`` lists host ``h``'s
    members (hosts in order of their first member), the same number on every host."""

    hosts: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(ranks: Sequence[int], host_of: Sequence[Hashable]) -> "Hosts":
        """Group ``ranks`` by ``host_of`` (one label per member, in member order). ``ValueError`` when the
        lengths differ or the hosts hold different numbers of members."""
        if len(host_of) != len(ranks):
            raise ValueError(f"host_of names {len(host_of)} hosts but the group has {len(ranks)} ranks: give one "
                             "host label per rank, in group order")
        by_host: dict = {}
        for r, h in zip(ranks, host_of):
            by_host.setdefault(h, []).append(r)
        sizes = {h: len(rs) for h, rs in by_host.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"hierarchical sharding needs the same number of ranks on every host, got {sizes} "
                             "(ranks per host label)")
        return Hosts(tuple(tuple(rs) for rs in by_host.values()))

    @property
    def per_host(self) -> int:
        return len(self.hosts[0])

    def replicas(self) -> tuple[tuple[int, ...], ...]:
        """The replica groups: local index ``i``'s ranks on every host, in host order."""
        return tuple(tuple(h[i] for h in self.hosts) for i in range(self.per_host))


class HierarchicalReducer:
    """A :class:`~ringlet.torch.training.zero.reduce.Reducer` that shards within a host and replicates
    across hosts (see the module doc).

    ``comm_or_group``: the data-parallel group — a :class:`~ringlet.torch.comm.Comm`, a
    :class:`ringlet.Group` or None (the world). ``host_of``: the host of each of its members, in member
    order (None: the job's layout, from the hostnames ringlet exchanged at start-up); tests on one machine
    pass one, e.g. ``(0, 0, 1, 1)``. ``compression``: None or a compressor for the all-reduce across hosts.
    ``algorithm``: that all-reduce's algorithm. ``world`` is the group's size; ``shard_size`` the ranks
    per host; ``shard_rank`` this rank's local index.

    Construction creates one group per host and one per local index (:func:`ringlet.new_group`): every
    rank of the job must construct its reducers with the same arguments in the same order (a rank outside
    ``comm_or_group`` gets ``ValueError`` once the groups are made). Needs
    ringlet's core queue: ``TypeError``, before any group is made, for a Comm whose scheduler is the
    name-matched coordinator. ``ValueError`` for unequal hosts, a ``host_of`` of the wrong length, and the
    compressors :func:`~ringlet.torch.training.zero.reduce_compressed.compressor_for_buckets` refuses.
    """

    def __init__(self, comm_or_group=None, *, host_of: Sequence[Hashable] | None = None, compression=None,
                 algorithm: str = "auto"):
        self.compressor = None if compression is None else compressor_for_buckets(compression)
        self.comm = comm_or_group if isinstance(comm_or_group, Comm) else Comm(comm_or_group, algorithm)
        if self.comm.coordinated:
            raise TypeError("HierarchicalReducer runs on ringlet's core queue, over sub-groups of its own; pass a "
                            "Comm with the ordered scheduler (the default), not the name-matched one")
        ranks = self.comm.ranks
        layout = Hosts.of(ranks, _job_host_of(ranks) if host_of is None else tuple(host_of))
        me = ringlet.rank()
        host_groups = [ringlet.new_group(h) for h in layout.hosts]
        replica_groups = [ringlet.new_group(r) for r in layout.replicas()]
        if me not in ranks:  # after the groups: members and non-members made the same ones
            raise ValueError(f"rank {me} is not a member of the reducer's group (ranks {list(ranks)})")
        self.hosts = layout
        self.host = Comm(next(g for g in host_groups if me in g), algorithm)
        self.cross = Comm(next(g for g in replica_groups if me in g), algorithm)
        self.world = self.comm.size
        self.shard_size = layout.per_host
        self.shard_rank = self.host.ranks.index(me)

    def reduce_scatter_(self, flat: torch.Tensor, counts: Sequence[int], name: str, state: dict | None = None,
                        *, check: bool = False) -> CommFuture:
        """This rank's block of ``flat`` (a view, in ``flat``'s dtype) holding the average over ``world``
        ranks; ``flat`` is scratch afterwards. One job on the core queue: the reduce-scatter within the
        host, the all-reduce across hosts, the division."""
        self._check_counts(flat, counts)
        if self.compressor is not None:
            needs_state(self.compressor, state)
        host, cross, comp, world = self.host, self.cross, self.compressor, self.world

        def job() -> torch.Tensor:
            block = host.reduce_scatter_flat_(flat, counts, ReduceOp.SUM, name, check=check).wait()
            if cross.size > 1:
                if comp is None:
                    cross.allreduce_(block, ReduceOp.SUM, name, check=check).wait()
                else:
                    sub = None if state is None else state.setdefault("cross", {})
                    cross.allreduce_compressed_(block, comp, sub, name, average=False, check=check).wait()
            return block.div_(world) if world > 1 else block

        return host.submit(job)

    def allgather_(self, flat: torch.Tensor, counts: Sequence[int], name: str, *, check: bool = False) -> CommFuture:
        """Fill ``flat`` with every shard's block, gathered within the host only."""
        self._check_counts(flat, counts)
        return self.host.allgather_flat_(flat, counts, name, check=check)

    def _check_counts(self, flat: torch.Tensor, counts: Sequence[int]) -> None:
        """``ValueError`` unless ``counts`` cut ``flat`` into one block per rank of the host."""
        if len(counts) != self.shard_size or sum(counts) != flat.numel() or min(counts, default=0) < 0:
            raise ValueError(f"counts {list(counts)} do not cut {flat.numel()} elements into {self.shard_size} "
                             "blocks (one per rank of a host)")

    def __repr__(self) -> str:
        return (f"HierarchicalReducer(world={self.world}, hosts={len(self.hosts.hosts)}, shard_size={self.shard_size}, "
                f"compression={self.compressor!r})")


def _job_host_of(ranks: Sequence[int]) -> tuple[int, ...]:
    """The host index of each of ``ranks`` in the job's layout."""
    from ringlet import collectives

    world = collectives.runtime().world
    return tuple(world.host_of[r] for r in ranks)
