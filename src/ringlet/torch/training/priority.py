"""The priority-scheduling strategy of :class:`~ringlet.torch.training.ddp.DistributedDataParallel`.

``DistributedDataParallel(module, priority=Priority(partition_bytes=...))`` replaces first-in-first-out
bucket launches by pieces sent front layers first (:mod:`~ringlet.torch.training.piece_round` says how
every rank agrees on the order), and makes :meth:`DistributedDataParallel.overlap_optimizer` available,
which lets those pieces overlap the next forward pass. Without the option (the default) buckets are
launched in index order as they fill, as before.
"""
from __future__ import annotations

from dataclasses import dataclass

from ringlet.sizes import parse_size

__all__ = ["Priority"]


@dataclass(frozen=True, slots=True)
class Priority:
    """Send the gradients of the front layers first, in pieces of at most ``partition_bytes``.

    A dense bucket is cut into ``ceil(bytes / partition_bytes)`` pieces of nearly equal size; a
    compressed bucket or a weight averaged from sufficient factors is one piece. Pieces are ranked by
    their place in the bucket layout: the layout follows the order in which backward produces gradients
    (the last layers first), so the piece produced last (the first layers') ranks highest. Whenever
    the communication thread is free it sends the highest-ranked piece that was ready on every rank when
    the last dense piece went out, so a front piece that becomes ready waits behind at most the dense
    piece in flight and the one chosen after it (and behind whole pieces chosen before it was ready).

    ``partition_bytes``: a positive number of bytes, or a size such as ``"1M"`` / ``"512K"``.
    ``TypeError`` for another type (a bool included), ``ValueError`` for a size that is not positive.
    """

    partition_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        value = self.partition_bytes
        if isinstance(value, str):
            try:
                value = parse_size(value)
            except ValueError:
                raise ValueError(f"Priority: partition_bytes {self.partition_bytes!r} is not a size such as "
                                 "'1M' or '65536'") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"Priority: partition_bytes must be an int or a size string, got "
                            f"{type(self.partition_bytes).__name__}")
        if value <= 0:
            raise ValueError(f"Priority: partition_bytes must be positive, got {self.partition_bytes!r}")
        object.__setattr__(self, "partition_bytes", value)
