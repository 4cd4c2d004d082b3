"""The pieces that priority scheduling sends (:class:`~ringlet.torch.training.priority.Priority`).

:func:`piece_layout` cuts the buckets of one :class:`~ringlet.torch.training.buckets.BucketSet` into
pieces: a dense bucket into ``ceil(bytes / partition_bytes)`` contiguous ranges of its flat buffer of
nearly equal size, any other bucket (compressed, or a weight averaged from sufficient factors) into one
whole piece. Pieces are numbered in launch order (bucket by bucket, each bucket's ranges front to back of
its buffer); a higher number means a higher priority, because the layout is the order in which backward
produces gradients and the next forward needs them the other way round. The layout depends on the bucket
set and ``partition_bytes`` only, so it is the same on every rank. Empty buckets and parameters get no
piece (nothing to send).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .reduction import DenseReduction

if TYPE_CHECKING:
    from .buckets import Bucket, BucketSet

__all__ = ["Piece", "PieceLayout", "piece_layout", "split_even"]


class Piece:
    """Elements ``[lo, hi)`` of ``bucket``'s flat buffer (``whole``: the bucket as its own reduction
    sends it). ``slots``: the bucket's parameter indices that overlap the piece; ``nbytes``: the bytes of
    gradient it averages; ``validated``: the algorithms this piece was sent with at least once (the first send checks its shape across ranks)."""

    __slots__ = ("index", "bucket", "lo", "hi", "whole", "slots", "nbytes", "validated")

    def __init__(self, index: int, bucket: Bucket, lo: int, hi: int, whole: bool, slots: list[int]):
        self.index = index
        self.bucket = bucket
        self.lo, self.hi = lo, hi
        self.whole = whole
        self.slots = slots
        size = bucket.buffer.element_size()
        self.nbytes = (hi - lo) * size if not whole else sum(p.numel() * p.element_size() for p in bucket.params)
        self.validated: set[str] = set()


class PieceLayout:
    """The pieces of one bucket set: ``pieces`` in launch order; ``of_slot[b][j]``: the pieces that
    parameter ``j`` of bucket ``b`` overlaps; ``of_bucket[b]``: bucket ``b``'s pieces; ``max_numel``:
    the largest dense piece (elements), for the staging buffer."""

    __slots__ = ("buckets", "pieces", "of_slot", "of_bucket", "max_numel", "checked")

    def __init__(self, buckets: list[Bucket], pieces: list[Piece]):
        self.buckets = buckets
        self.pieces = pieces
        self.of_slot: list[list[list[int]]] = [[[] for _ in b.params] for b in buckets]
        self.of_bucket: list[list[int]] = [[] for _ in buckets]
        for q in pieces:
            self.of_bucket[q.bucket.index].append(q.index)
            for j in q.slots:
                self.of_slot[q.bucket.index][j].append(q.index)
        self.max_numel = max((q.hi - q.lo for q in pieces if not q.whole), default=0)
        self.checked = False  # the first agreement of this layout checks the control vector across ranks


def split_even(n: int, k: int) -> list[tuple[int, int]]:
    """``[0, n)`` as ``k`` contiguous ranges whose lengths differ by at most one (``k >= 1``)."""
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def piece_layout(bucket_set: BucketSet, partition_bytes: int) -> PieceLayout:
    """The pieces of ``bucket_set`` (see the module doc)."""
    pieces: list[Piece] = []
    for b in bucket_set.buckets:
        sizes = [p.numel() for p in b.params]
        if type(b.reduction) is not DenseReduction:
            slots = [j for j, n in enumerate(sizes) if n > 0]
            if slots:
                pieces.append(Piece(len(pieces), b, 0, 0, True, slots))
            continue
        numel = sum(sizes)
        if numel == 0:
            continue
        nbytes = numel * b.buffer.element_size()
        k = min(numel, -(-nbytes // partition_bytes))
        for lo, hi in split_even(numel, k):
            slots = [j for j, off in enumerate(b.offsets) if off < hi and off + sizes[j] > lo]
            pieces.append(Piece(len(pieces), b, lo, hi, False, slots))
    return PieceLayout(list(bucket_set.buckets), pieces)
