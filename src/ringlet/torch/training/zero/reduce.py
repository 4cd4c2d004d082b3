"""How ZeRO's buckets travel: the reduce-scatter of gradients and the all-gather of parameters, over the
group that shares the shards.

A :class:`Reducer` is the one object the stages call for communication. Its contract:

* ``shard_size`` / ``shard_rank``: the group a bucket is sharded over and this rank's place in it (a
  :class:`~ringlet.torch.training.zero.layout.Layout` is built for ``world=shard_size``);
* ``world``: every rank that trains on its own data (averages divide by it);
* :meth:`Reducer.reduce_scatter_` — the value of the returned future is this rank's block of ``flat``
  (``counts[shard_rank]`` elements after the lower ranks' blocks), holding the average over ``world``
  ranks of their ``flat``; ``flat`` is scratch afterwards. ``state`` is the bucket's own dict, the same
  one every step (error-feedback residuals live there);
* :meth:`Reducer.allgather_` — fills ``flat`` with every shard's block (this rank's block must hold its
  data); the value is ``flat``.

Both run on ringlet's core queue in submission order: every rank must call them for the same buckets in
the same order. :class:`Reducer` itself shards over the whole data-parallel group and sends buffers as
they are; :class:`~ringlet.torch.training.zero.reduce_compressed.CompressedReducer` sends the gradients'
blocks compressed, and :class:`~ringlet.torch.training.zero.reduce_hierarchical.HierarchicalReducer`
shards within a host and replicates across hosts (docs/zero.md, "Reducers: how the buckets travel").
"""
from __future__ import annotations

from typing import Sequence

import torch

from ringlet.types import ReduceOp

from ...comm import Comm, CommFuture

__all__ = ["Reducer"]


class Reducer:
    """Shards over every rank of ``comm`` (a :class:`~ringlet.torch.comm.Comm`); uncompressed."""

    def __init__(self, comm: Comm):
        self.comm = comm
        self.world = comm.size
        self.shard_size = comm.size
        self.shard_rank = comm.ranks.index(_my_rank())

    def reduce_scatter_(self, flat: torch.Tensor, counts: Sequence[int], name: str, state: dict | None = None,
                        *, check: bool = False) -> CommFuture:
        return self.comm.reduce_scatter_flat_(flat, counts, ReduceOp.AVG, name, check=check)

    def allgather_(self, flat: torch.Tensor, counts: Sequence[int], name: str, *, check: bool = False) -> CommFuture:
        return self.comm.allgather_flat_(flat, counts, name, check=check, algorithm="auto")


def _my_rank() -> int:
    import ringlet

    return ringlet.rank()
