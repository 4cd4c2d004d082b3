"""The bucket layout of :class:`~ringlet.torch.training.ddp.DistributedDataParallel`.

Which parameters share a bucket, in which order buckets launch, the one rebuild in gradient-arrival
order, and when a bucket's memory may be written again:

* :func:`assign_buckets` / :func:`layout_buckets`: reverse registration order (about the order backward
  produces gradients), one dtype and device per bucket, a bucket closed once it holds the cap (a smaller
  cap for the first one closed); a weight reduced from factors gets a bucket of its own;
* :class:`BucketSet`: the buckets of one layout, each with its reduction strategy, and every parameter's
  place (bucket, slot, flat index); :class:`BucketSets`: the dense set and, once layers were chosen for
  sufficient factors, the factored set, one of them active;
* :class:`ArrivalOrder`: the order in which the first reduced backward delivered the gradients;
* :meth:`Bucket.reclaim`, :func:`is_view_of`, :func:`tensors_sharing`: a buffer lent as ``.grad`` is
  written again only when nothing but those ``.grad`` views holds it.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..comm import CommFuture

# A bucket's reduction strategy: any object with the interface of ringlet.torch.training.reduction's
# Reduction protocol (named here only as a type alias, so that this module does not import that one).
Reduction = Any

__all__ = ["Bucket", "BucketSet", "BucketSets", "ArrivalOrder", "assign_buckets", "layout_buckets", "is_view_of",
           "take_into", "tensors_sharing"]


class Bucket:
    """Parameters reduced together by one strategy (``reduction``). ``buffer``: the flat gradients for a
    dense bucket (``slot(j)`` is parameter ``j``'s part, at ``offsets[j]``: one after the other unless
    ``offsets`` and ``numel`` are given, as priority scheduling does to leave room between its pieces),
    empty for a factored one (``buffer``: one the caller owns, such as torch DDP's bucket for a comm hook,
    instead of the reduction's ``new_buffer``); ``start``: the flat index of the first parameter in its
    :class:`BucketSet`."""

    __slots__ = ("index", "params", "offsets", "start", "reduction", "buffer", "pending", "work", "t_launch",
                 "validated", "algo", "lent")

    def __init__(self, index: int, params: list[torch.nn.Parameter], reduction: Reduction, start: int,
                 offsets: list[int] | None = None, numel: int | None = None, *, buffer: torch.Tensor | None = None):
        self.index = index
        self.params = params
        self.start = start
        self.offsets: list[int] = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        if offsets is not None:
            self.offsets, n = list(offsets), numel
        self.reduction = reduction
        self.buffer = reduction.new_buffer(params, n) if buffer is None else buffer
        self.pending = len(params)
        self.work: CommFuture | None = None
        self.t_launch = 0.0
        # The first reduction with each algorithm checks the bucket's shape, dtype and algorithm across
        # ranks; the layout never changes afterwards, so later ones skip that exchange.
        self.validated: set[str] = set()
        self.algo = ""
        self.lent = False  # some .grad is (or was) a view of buffer

    def slot(self, i: int) -> torch.Tensor:
        p = self.params[i]
        return self.buffer[self.offsets[i]:self.offsets[i] + p.numel()]

    def reclaim(self) -> bool:
        """Give the bucket a fresh buffer when memory it lent as ``.grad`` is held by anything besides
        those views (then its old values stay with whoever holds them); True when it did."""
        if not self.lent:
            return False
        attached = sum(1 for j, p in enumerate(self.params)
                       if p.grad is not None and not p.grad.is_sparse and is_view_of(p.grad, self.slot(j)))
        refs = tensors_sharing(self.buffer)
        if refs is None or refs > 1 + attached:
            self.buffer = torch.empty_like(self.buffer)  # every slot is written before the launch
            self.lent = False
            return True
        return False


def assign_buckets(params: list[torch.nn.Parameter], cap_bytes: int, first_cap_bytes: int) -> list[list[int]]:
    """Indices of ``params`` per bucket: reverse registration order, one dtype/device per bucket, a bucket
    closed once it holds ``cap_bytes`` (``first_cap_bytes`` for the first bucket closed)."""
    closed: list[list[int]] = []
    open_: dict[tuple, list[int]] = {}
    size: dict[tuple, int] = {}
    for i in reversed(range(len(params))):
        p = params[i]
        key = (p.dtype, p.device)
        open_.setdefault(key, []).append(i)
        size[key] = size.get(key, 0) + p.numel() * p.element_size()
        if size[key] >= (first_cap_bytes if not closed else cap_bytes):
            closed.append(open_.pop(key))
            size[key] = 0
    closed.extend(b for b in open_.values() if b)
    # Launch order = order in which backward is expected to fill them (first member in reverse order).
    closed.sort(key=lambda b: -b[0])
    return closed


def layout_buckets(params: list[torch.nn.Parameter], factored: Collection[int], cap_bytes: int,
                   first_cap_bytes: int) -> list[list[torch.nn.Parameter]]:
    """Buckets of ``params`` filled from the end of the list (the end is expected first in backward), in
    launch order; each weight whose id is in ``factored`` gets a bucket of its own, launched when its
    turn comes (a bucket is ready when its member nearest the front of ``params`` is)."""
    dense = [p for p in params if id(p) not in factored]
    entries = [[dense[i] for i in idx] for idx in assign_buckets(dense, cap_bytes, first_cap_bytes)]
    if factored:
        pos = {id(p): i for i, p in enumerate(params)}
        entries += [[p] for p in params if id(p) in factored]
        entries.sort(key=lambda ps: min(pos[id(p)] for p in ps), reverse=True)
    return entries


class BucketSet:
    """The buckets of one layout, in launch order, each with the strategy ``reduction_for`` gives its
    parameters; ``where``: id(param) -> (bucket, slot, flat index); ``params``: in flat-index order.
    ``spacing(layout, reductions)``: per bucket, ``(offsets, numel)`` of its buffer or None for the
    parameters one after the other (default: None for every bucket)."""

    __slots__ = ("buckets", "where", "params")

    def __init__(self, layout: list[list[torch.nn.Parameter]],
                 reduction_for: Callable[[list[torch.nn.Parameter]], Reduction], spacing: Callable | None = None):
        self.buckets: list[Bucket] = []
        self.where: dict[int, tuple[Bucket, int, int]] = {}
        reductions = [reduction_for(ps) for ps in layout]
        spaces = spacing(layout, reductions) if spacing is not None else [None] * len(layout)
        for k, (ps, red, space) in enumerate(zip(layout, reductions, spaces)):
            b = Bucket(k, ps, red, len(self.where), *(space or ()))
            self.buckets.append(b)
            for j, p in enumerate(ps):
                self.where[id(p)] = (b, j, len(self.where))
        self.params = [p for b in self.buckets for p in b.params]

    def same_layout(self, layout: list[list[torch.nn.Parameter]]) -> bool:
        return [[id(p) for p in ps] for ps in layout] == [[id(p) for p in b.params] for b in self.buckets]


class BucketSets:
    """The dense bucket set, and (once layers were chosen) the factored one; ``active`` is the set the
    current step reduces with. Sets switch only between steps."""

    __slots__ = ("dense", "factored", "active", "factors_on")

    def __init__(self, dense: BucketSet):
        self.dense: BucketSet | None = dense
        self.factored: BucketSet | None = None
        self.active = dense
        self.factors_on = False  # the active set is the factored one

    def replace(self, dense: BucketSet | None, factored: BucketSet | None) -> None:
        """New sets (a rebuild); the dense one becomes active, the factored one when there is no dense
        one (the dense reduction lost its trial). ``ValueError`` for no set at all."""
        if dense is None and factored is None:
            raise ValueError("BucketSets.replace needs a dense or a factored bucket set")
        self.dense, self.factored = dense, factored
        self.active, self.factors_on = (dense, False) if dense is not None else (factored, True)

    def activate(self, factors: bool) -> bool:
        """Make the factored (``factors``, when there is one) or the dense set active; True when that
        switched sets."""
        factors = factors and self.factored is not None
        if factors == self.factors_on:
            return False
        self.active = self.factored if factors else self.dense
        self.factors_on = factors
        return True

    def drop_factored(self) -> None:
        """The factored set is no longer wanted (it stays active until :meth:`activate` switches)."""
        self.factored = None

    def drop_dense(self) -> None:
        """The dense set is no longer wanted (it stays active until :meth:`activate` switches)."""
        self.dense = None


class ArrivalOrder:
    """Parameter indices in the order the first completed reduced backward delivered their gradients;
    :meth:`take` hands that order over once, for the rebuild."""

    __slots__ = ("_order", "_complete")

    def __init__(self):
        self._order: list[int] | None = []
        self._complete = False

    def start(self) -> None:
        """A reduced backward is about to run: an earlier one that failed half-way must not count."""
        if self._order is not None and not self._complete:
            self._order = []

    def record(self, i: int) -> None:
        if self._order is not None and not self._complete:
            self._order.append(i)

    def complete(self) -> None:
        self._complete = True

    @property
    def due(self) -> bool:
        """A reduced backward completed and its order was not taken yet."""
        return self._complete and self._order is not None

    def take(self, n: int) -> list[int]:
        """All ``n`` indices: the arrival order, then those that got no gradient in reverse order."""
        arrival, self._order = list(dict.fromkeys(self._order or [])), None
        seen = set(arrival)
        return arrival + [i for i in reversed(range(n)) if i not in seen]


def is_view_of(grad: torch.Tensor, slot: torch.Tensor) -> bool:
    """Whether ``grad`` is exactly the (contiguous) memory of ``slot``."""
    return (grad.data_ptr() == slot.data_ptr() and grad.numel() == slot.numel() and grad.is_contiguous()
            and grad.dtype == slot.dtype and grad.device == slot.device)


def take_into(grad: torch.Tensor, result: torch.Tensor) -> bool:
    """``grad`` becomes ``result``: as Horovod does, by pointing ``grad`` (the same tensor object, so
    references to ``.grad`` see the average) at ``result``'s memory; a copy only where dtype, shape or
    device differ. True when ``grad`` now shares ``result``'s memory."""
    if result.data_ptr() == grad.data_ptr() and result.shape == grad.shape and result.stride() == grad.stride():
        return True  # reduced in place
    if result.dtype == grad.dtype and result.shape == grad.shape and result.device == grad.device:
        with torch.no_grad():
            grad.set_(result)
        return True
    grad.copy_(result)
    return False


def tensors_sharing(t: torch.Tensor) -> int | None:
    """How many tensors (``t`` included) hold ``t``'s memory; None when this torch build cannot tell."""
    try:
        # The storage object made for the question holds one reference itself.
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata) - 1
    except (AttributeError, RuntimeError, TypeError):
        return None
