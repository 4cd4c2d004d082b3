"""The order of ZeRO stage 3's all-gathers in one pass (a forward or a backward), and its prefetch.

Every rank must issue the same all-gathers in the same order (they run on ringlet's core queue in
submission order). A :class:`Walk` therefore decides from nothing but the *plan* — the units gathered in
the previous forward, in order (reversed for a backward) — and the sequence of units the pass asks for,
never from timing (whether a gather has finished): ranks that run the same graph make the same
decisions.

A pass asks for unit ``u`` (:meth:`Walk.advance`): the cursor moves past ``u``'s next occurrence in the
plan; units the plan expected before it and that were prefetched are returned, to be freed (skipped).
An ask that the plan does not foresee leaves the cursor where it is (the unit is gathered on demand).
:meth:`Walk.next_prefetch` names the one unit to gather ahead: the first unit of the plan from the
cursor on that is not gathered and not finished — only while no other prefetched unit waits, so at most
one unit is ever gathered ahead of the computation.
"""
from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["Walk"]


class Walk:
    """One pass over ``plan`` (unit indices); ``prefetch``: whether to gather ahead. ``events`` records
    the units asked for, in order (the next forward's plan)."""

    def __init__(self, plan: Sequence[int], prefetch: bool):
        self.plan = list(plan)
        self.prefetch = prefetch
        self.cursor = 0
        self.events: list[int] = []
        self.ahead: set[int] = set()

    def advance(self, unit: int) -> list[int]:
        """Record that the pass needs ``unit`` now; return the prefetched units the pass skipped over."""
        self.events.append(unit)
        self.ahead.discard(unit)
        try:
            j = self.plan.index(unit, self.cursor)
        except ValueError:
            return []
        skipped = [u for u in self.plan[self.cursor:j] if u in self.ahead]
        self.ahead.difference_update(skipped)
        self.cursor = j + 1
        return skipped

    def next_prefetch(self, available: Callable[[int], bool]) -> int | None:
        """The unit to gather ahead now (``available(u)``: not gathered and not finished), or None; the
        caller gathers it and it counts as ahead until asked for or skipped."""
        if not self.prefetch or self.ahead:
            return None
        for j in range(self.cursor, len(self.plan)):
            u = self.plan[j]
            if available(u):
                self.ahead.add(u)
                return u
        return None

    def drop(self, unit: int) -> None:
        """``unit`` is no longer gathered ahead (freed for another reason)."""
        self.ahead.discard(unit)
