"""The options of :class:`~ringlet.torch.training.zero.optimizer.ZeroOptimizer`, and the rule that picks a
partition for an optimizer class."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .layout import Even, Partition, WholeParameters

__all__ = ["ZeroOptions", "ELEMENTWISE", "partition_for"]

# torch.optim classes whose update of an element reads only that element's gradient, value and state (and
# per-parameter scalars such as the step count): any contiguous cut of a parameter steps exactly as the
# whole. Exact classes: a subclass may override that.
ELEMENTWISE: tuple[type, ...] = tuple(
    getattr(torch.optim, name) for name in ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop",
                                            "Adagrad", "Adadelta", "ASGD", "Rprop") if hasattr(torch.optim, name))

_MIB = 1 << 20


@dataclass(frozen=True)
class ZeroOptions:
    """How :class:`ZeroOptimizer` shards and communicates.

    * ``bucket_bytes`` (default 25 MiB, as DDP's ``bucket_cap_mb``): the most bytes (model dtype) of one
      flat bucket — the unit of every reduce-scatter and all-gather, and of stage 2's working buffers.
      Large enough that one collective's fixed cost is small beside its transfer, small enough that the
      buffers in flight (see ``max_inflight``) stay a small share of the model; equal to DDP's so that the
      two communicate at the same granularity. A larger parameter gets a bucket of its own.
    * ``partition``: a :class:`~.layout.Partition`; None picks :class:`~.layout.Even` for the torch.optim
      classes that update every element on its own (:data:`ELEMENTWISE`: SGD, Adam, AdamW, Adamax, NAdam,
      RAdam, RMSprop, Adagrad, Adadelta, ASGD, Rprop) and :class:`~.layout.WholeParameters` for any other
      class. An explicit ``Even()`` with another class is the user's promise that the class is elementwise.
    * ``reducer``: the object that moves the buckets (:class:`~.reduce.Reducer` interface); None builds
      ``Reducer(Comm(group))``.
    * ``group``: a :class:`ringlet.Group`, a ``ringlet.torch`` ProcessSet, or None (the world): the ranks
      that train together (the initial broadcast runs over it; the default reducer shards over it).
    * ``reduce_dtype``: the dtype gradients travel in; None keeps the parameters' dtype, ``torch.float32``
      reduces low-precision gradients in float32 (the cast buffers count as working buffers).
    * ``prefetch``: stage 3 only: gather the next unit's parameters while the current one computes.
    * ``max_inflight`` (stage 2 and 3): the most bucket reduce-scatters launched and not yet folded into the
      gradient shards; launching one more first waits for the oldest. ``>= 1``.
    """

    bucket_bytes: int = 25 * _MIB
    partition: Partition | None = None
    reducer: Any = None
    group: Any = None
    reduce_dtype: torch.dtype | None = None
    prefetch: bool = True
    max_inflight: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.bucket_bytes, bool) or not isinstance(self.bucket_bytes, int) or self.bucket_bytes < 1:
            raise ValueError(f"ZeroOptions.bucket_bytes must be a positive int, got {self.bucket_bytes!r}")
        if self.partition is not None and not isinstance(self.partition, Partition):
            raise TypeError(f"ZeroOptions.partition must be a zero.layout.Partition (Even() or WholeParameters()) "
                            f"or None, got {type(self.partition).__name__}")
        if self.reduce_dtype is not None and (not isinstance(self.reduce_dtype, torch.dtype)
                                              or not self.reduce_dtype.is_floating_point):
            raise TypeError(f"ZeroOptions.reduce_dtype must be a floating torch.dtype or None, got {self.reduce_dtype!r}")
        if isinstance(self.max_inflight, bool) or not isinstance(self.max_inflight, int) or self.max_inflight < 1:
            raise ValueError(f"ZeroOptions.max_inflight must be an int >= 1, got {self.max_inflight!r}")
        if self.reducer is not None:
            missing = [a for a in ("world", "shard_size", "shard_rank", "reduce_scatter_", "allgather_")
                       if not hasattr(self.reducer, a)]
            if missing:
                raise TypeError(f"ZeroOptions.reducer lacks {missing} (see zero.reduce.Reducer's contract)")


def partition_for(optimizer_class: type, options: ZeroOptions) -> Partition:
    """The partition ``options`` asks for, or the default for ``optimizer_class`` (see :class:`ZeroOptions`)."""
    if options.partition is not None:
        return options.partition
    return Even() if optimizer_class in ELEMENTWISE else WholeParameters()
