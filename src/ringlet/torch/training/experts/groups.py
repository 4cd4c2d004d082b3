"""The groups of a mixture-of-experts layer: expert-parallel groups (the ranks that split the experts
among them and exchange tokens) and expert-data-parallel groups (the replicas of the same experts).

A span of ``n`` ranks (``group``, default the world) with ``ep_size`` dividing ``n``:

* expert-parallel group ``i``: span ranks ``[i * ep_size, (i + 1) * ep_size)`` (consecutive, so that a
  group tends to sit on one host, where all-to-all is cheapest);
* expert-data-parallel group ``j``: span ranks ``j, j + ep_size, j + 2 * ep_size, ...`` (``n / ep_size``
  replicas of the experts ``j * L .. (j + 1) * L - 1``).

Every rank creates every group (``ringlet.new_group``), expert-parallel ones first, in that order, once
per runtime, span and ``ep_size`` (layers share them): identical on every rank, as ``new_group`` needs.
A group that would have one member is None; one that equals the span is the span itself.
"""
from __future__ import annotations

import dataclasses
import threading
import weakref

from ringlet import collectives as _core
from ringlet.group import Group

__all__ = ["ExpertGroups", "expert_groups"]


@dataclasses.dataclass(frozen=True)
class ExpertGroups:
    """``ep_size`` ranks share the experts; this rank is ``ep_rank`` among them. ``ep_group``: the
    expert-parallel group (None when ``ep_size`` is 1: nothing is exchanged); ``dp_group``: the
    expert-data-parallel group (None when the experts have one replica); ``span``: the ranks the layer
    spans (None: the world, or ringlet not initialised); ``span_size``: their number."""

    ep_size: int
    ep_rank: int
    ep_group: Group | None
    dp_group: Group | None
    span: Group | None
    span_size: int

    @property
    def dp_size(self) -> int:
        """Replicas of each expert: ``span_size / ep_size``."""
        return self.span_size // self.ep_size


_cache: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _initialized() -> bool:
    try:
        _core.runtime()
    except ValueError:
        return False
    return True


def expert_groups(ep_size: int | None, group: Group | None = None) -> ExpertGroups | None:
    """The groups of a layer spanning ``group`` (a :class:`ringlet.Group`; None: the world) with
    ``ep_size`` ranks per expert-parallel group (None: the whole span). Without ringlet initialised only
    ``ep_size`` None or 1 is possible (one process holds every expert). On a rank outside ``group`` it
    creates the groups all the same and returns None: ranks outside a layer's group call it where the
    members construct the layer, so that every rank creates the same groups in the same order.
    ``ValueError``: ``ep_size`` not a positive integer or not dividing the span, ``group`` not a Group."""
    if ep_size is not None and (isinstance(ep_size, bool) or not isinstance(ep_size, int) or ep_size < 1):
        raise ValueError(f"ep_size must be a positive integer or None, got {ep_size!r}.")
    if group is not None and not isinstance(group, Group):
        raise ValueError(f"group must be a ringlet.Group or None, got {type(group).__name__}.")
    if not _initialized():
        if group is not None or ep_size not in (None, 1):
            raise ValueError("MoE with ep_size > 1 or a group needs ringlet initialised (ringlet.init()) first.")
        return ExpertGroups(1, 0, None, None, None, 1)
    rt = _core.runtime()
    span_group = rt.world if group is None else group
    n = span_group.size
    ep = n if ep_size is None else ep_size
    if n % ep:
        raise ValueError(f"ep_size {ep} does not divide the {n} ranks of the MoE group.")
    key = (span_group.ranks, ep)
    with _lock:  # guards the cache only: creating groups may wait for the other ranks
        made = _cache.setdefault(rt, {}).get(key)
    if made is None:
        made = _create(rt, span_group, ep)
        with _lock:
            _cache[rt][key] = made
    eps, dps = made
    if rt.rank not in span_group:
        return None
    me = span_group.rank_of(rt.rank)
    return ExpertGroups(ep, me % ep, eps[me // ep], dps[me % ep], group, n)


def _create(rt, span: Group, ep: int) -> tuple[list, list]:
    """Every expert-parallel group, then every expert-data-parallel group, in index order."""
    n, ranks = span.size, span.ranks

    def make(members: tuple[int, ...]):
        if len(members) == 1:
            return None
        return span if len(members) == n else rt.new_group(members)

    eps = [make(ranks[i * ep:(i + 1) * ep]) for i in range(n // ep)]
    dps = [make(ranks[j::ep]) for j in range(ep)]
    return eps, dps
