"""The pieces that priority scheduling sends (:class:`~ringlet.torch.training.priority.Priority`).

A dense bucket is cut by :func:`plan_bucket`: its parameters, in bucket order, are packed into pieces of
at most ``partition_bytes``; a parameter larger than that gets pieces of its own, ``ceil(bytes /
partition_bytes)`` of nearly equal size. Any other bucket (compressed, or a weight averaged from
sufficient factors) is one whole piece. Pieces are numbered in launch order (bucket by bucket, each
bucket's front to back of its buffer); a higher number means a higher priority, because the layout is
the order in which backward produces gradients and the next forward needs them the other way round.

Every piece that ends where a parameter ends *carries* the control vector of
:mod:`~ringlet.torch.training.piece_round` (2 numbers per piece of the layout) right behind it, in a gap
of the bucket's buffer that no parameter occupies (:func:`spacing` places the parameters around the gaps
when the bucket set is built), so a piece and its vector go out in one all-reduce of one contiguous view
with nothing copied. The pieces inside a parameter carry none. Everything here depends on the bucket
layout and ``partition_bytes`` only, so it is the same on every rank. Empty buckets and parameters get
no piece.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .reduction import DenseReduction

if TYPE_CHECKING:
    import torch

    from .buckets import Bucket, BucketSet

__all__ = ["Piece", "PieceLayout", "piece_layout", "plan_bucket", "spacing", "split_even"]

Plan = list[tuple[int, int, bool]]  # (first element, end element, carries the control vector)


class Piece:
    """Elements ``[lo, hi)`` of ``bucket``'s buffer (``whole``: the bucket as its own reduction sends it),
    followed by the control vector in ``[hi, hi + 2n)`` when ``carries``. ``slots``: the bucket's
    parameter indices that overlap the piece; ``nbytes``: the bytes of gradient it averages;
    ``validated``: the algorithms it was sent with (the first send checks its shape across ranks)."""

    __slots__ = ("index", "bucket", "lo", "hi", "whole", "carries", "slots", "nbytes", "validated")

    def __init__(self, index: int, bucket: Bucket, lo: int, hi: int, whole: bool, carries: bool, slots: list[int]):
        self.index = index
        self.bucket = bucket
        self.lo, self.hi = lo, hi
        self.whole = whole
        self.carries = carries
        self.slots = slots
        size = bucket.buffer.element_size()
        self.nbytes = (hi - lo) * size if not whole else sum(p.numel() * p.element_size() for p in bucket.params)
        self.validated: set[str] = set()


class PieceLayout:
    """The pieces of one bucket set: ``pieces`` in launch order; ``of_slot[b][j]``: the pieces that
    parameter ``j`` of bucket ``b`` overlaps; ``of_bucket[b]``: bucket ``b``'s pieces."""

    __slots__ = ("buckets", "pieces", "of_slot", "of_bucket", "checked")

    def __init__(self, buckets: list[Bucket], pieces: list[Piece]):
        self.buckets = buckets
        self.pieces = pieces
        self.of_slot: list[list[list[int]]] = [[[] for _ in b.params] for b in buckets]
        self.of_bucket: list[list[int]] = [[] for _ in buckets]
        for q in pieces:
            self.of_bucket[q.bucket.index].append(q.index)
            for j in q.slots:
                self.of_slot[q.bucket.index][j].append(q.index)
        self.checked = False  # the first agreement of this layout checks the control vector across ranks


def split_even(n: int, k: int) -> list[tuple[int, int]]:
    """``[0, n)`` as ``k`` contiguous ranges whose lengths differ by at most one (``k >= 1``)."""
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def plan_bucket(sizes: list[int], itemsize: int, partition: int) -> Plan:
    """The pieces of a dense bucket whose parameters have ``sizes`` elements, in elements of the
    parameters laid one after the other (see the module doc)."""
    out: Plan = []
    start = off = acc = 0
    for n in sizes:
        nbytes = n * itemsize
        if nbytes > partition:
            if off > start:
                out.append((start, off, True))
            k = min(n, -(-nbytes // partition))
            out += [(off + a, off + b, i == k - 1) for i, (a, b) in enumerate(split_even(n, k))]
            off += n
            start, acc = off, 0
            continue
        if acc and acc + nbytes > partition:
            out.append((start, off, True))
            start, acc = off, 0
        acc += nbytes
        off += n
    if off > start:
        out.append((start, off, True))
    return out


def _is_dense(reduction) -> bool:
    return type(reduction) is DenseReduction


def _plans(layout: list[list[torch.nn.Parameter]], reductions: list, partition: int) -> tuple[list, int]:
    """Per bucket its plan (None for a whole piece or nothing), and the number of pieces in all."""
    plans, n = [], 0
    for ps, red in zip(layout, reductions):
        if _is_dense(red):
            plan = plan_bucket([p.numel() for p in ps], ps[0].element_size(), partition)
            plans.append(plan)
            n += len(plan)
        else:
            plans.append(None)
            n += 1 if any(p.numel() for p in ps) else 0
    return plans, n


def _gapped(plan: Plan, gap: int) -> list[tuple[int, int]]:
    """Each piece's ``[lo, hi)`` in the buffer with a gap of ``gap`` elements after every carrying piece."""
    out, shift = [], 0
    for lo, hi, carries in plan:
        out.append((lo + shift, hi + shift))
        shift += gap if carries else 0
    return out


def spacing(layout: list[list[torch.nn.Parameter]], reductions: list, partition: int) -> list:
    """Per bucket, ``(offsets, numel)`` of a buffer with the gaps of the module doc (dense buckets), or
    None (the others); the ``spacing`` argument of :class:`~ringlet.torch.training.buckets.BucketSet`."""
    plans, n = _plans(layout, reductions, partition)
    out = []
    for ps, plan in zip(layout, plans):
        if plan is None:
            out.append(None)
            continue
        ends = [hi for _, hi, carries in plan if carries]
        offsets, off, passed = [], 0, 0
        for p in ps:
            while passed < len(ends) and ends[passed] <= off:
                passed += 1
            offsets.append(off + 2 * n * passed)
            off += p.numel()
        out.append((offsets, off + 2 * n * len(ends)))
    return out


def piece_layout(bucket_set: BucketSet, partition_bytes: int) -> PieceLayout:
    """The pieces of ``bucket_set``, built with :func:`spacing` for the same ``partition_bytes``
    (``RuntimeError`` when its buffers are not)."""
    buckets = bucket_set.buckets
    plans, n = _plans([b.params for b in buckets], [b.reduction for b in buckets], partition_bytes)
    expected = spacing([b.params for b in buckets], [b.reduction for b in buckets], partition_bytes)
    pieces: list[Piece] = []
    for b, plan, space in zip(buckets, plans, expected):
        sizes = [p.numel() for p in b.params]
        if plan is None:
            slots = [j for j, k in enumerate(sizes) if k > 0]
            if slots:
                pieces.append(Piece(len(pieces), b, 0, 0, True, False, slots))
            continue
        if b.offsets != space[0] or b.buffer.numel() != space[1]:
            raise RuntimeError(f"bucket {b.index} was not built for priority scheduling with these pieces")
        starts = [sum(sizes[:j]) for j in range(len(sizes))]
        for (lo, hi, carries), (glo, ghi) in zip(plan, _gapped(plan, 2 * n)):
            slots = [j for j, s in enumerate(starts) if s < hi and s + sizes[j] > lo]
            pieces.append(Piece(len(pieces), b, glo, ghi, False, carries, slots))
    return PieceLayout(list(buckets), pieces)
