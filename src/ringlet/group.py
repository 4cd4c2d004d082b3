"""Groups of ranks: the world and sub-groups. A collective's schedule runs over group ranks
``0..size-1``; the group maps them to transport (global) ranks."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Group:
    """An ordered set of global ranks. ``id`` is assigned in creation order, identical on every rank.
    ``tag_slot``: the group's share of the message tags (:func:`ringlet.engine.channel.tag_base`); groups
    that have fewer than two members in common never exchange messages on the same pair of ranks, and
    may share a slot."""

    id: int
    ranks: tuple[int, ...]
    host_of: tuple[int, ...]  # host index of each member, in member order
    tag_slot: int = 0
    size: int = field(init=False, compare=False, repr=False)  # len(ranks)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", len(self.ranks))

    def rank_of(self, global_rank: int) -> int:
        """Group rank of ``global_rank``; ``ValueError`` when it is not a member."""
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise ValueError(f"Rank {global_rank} is not a member of group {self.id} (ranks {list(self.ranks)}).") from None

    def __contains__(self, global_rank: int) -> bool:
        return global_rank in self.ranks

    @property
    def hosts(self) -> int:
        return len(set(self.host_of))
