"""Process sets: named subsets of ranks that collectives can run over (Horovod's ``ProcessSet``).

Each registered set maps to a ringlet :class:`~ringlet.group.Group`; the global set (id 0) is the world.
Registering and removing are collective: every rank calls them in the same order. The coordinator
performs both inside a negotiation round, so a rank never blocks in group creation while a peer
waits for it in a round.
"""
from __future__ import annotations

import threading
from typing import Sequence

from .context import context, control, current


class ProcessSet:
    """A set of global ranks. ``process_set_id`` is assigned when registered (the global set: 0)."""

    def __init__(self, ranks_or_comm: Sequence[int] | None = None):
        if ranks_or_comm is not None and hasattr(ranks_or_comm, "Get_group"):
            raise ValueError("ProcessSet from an MPI communicator is not supported; pass a list of ranks.")
        self.ranks: list[int] | None = (sorted(set(int(r) for r in ranks_or_comm))
                                        if ranks_or_comm is not None else None)
        self.process_set_id: int | None = None

    def _group(self):
        ctx = context()
        if self.process_set_id is None:
            raise ValueError("This process set has not been registered; call hvd.add_process_set(...) on every rank.")
        return ctx.process_sets.group(self.process_set_id)

    def size(self) -> int:
        """Number of ranks in the set."""
        return self._group().size

    def rank(self) -> int:
        """This process's rank within the set (``ValueError`` when not a member)."""
        return self._group().rank_of(context().rt.rank)

    def included(self) -> bool:
        """True when this process belongs to the set."""
        return context().rt.rank in self._group()

    def __eq__(self, other) -> bool:
        return (isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id
                and self.ranks == other.ranks)

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self.ranks or ())))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """The world; its ranks follow whatever context is current."""

    def __init__(self):
        super().__init__(None)
        self.process_set_id = 0

    @property
    def ranks(self):  # noqa: D401 - property mirrors the attribute of other sets
        ctx = current()
        return list(range(ctx.rt.size)) if ctx is not None else None

    @ranks.setter
    def ranks(self, value) -> None:
        pass


global_process_set = _GlobalProcessSet()


class Registry:
    """Per-context map from process set id to ringlet group; ids are assigned identically on all ranks."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._lock = threading.Lock()
        self._groups = {0: ctx.world}
        self._next_id = 1

    def group(self, ps_id: int):
        with self._lock:
            g = self._groups.get(ps_id)
        if g is None:
            raise ValueError(f"Process set {ps_id} is not registered (removed, or from another init).")
        return g

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._groups)

    def _register(self, ranks: tuple[int, ...]) -> int:
        """Called by the coordinator in its round: every rank runs this in the same order."""
        g = self._ctx.rt.new_group(ranks)
        with self._lock:
            ps_id = self._next_id
            self._next_id += 1
            self._groups[ps_id] = g
        return ps_id

    def _unregister(self, ps_id: int) -> None:
        with self._lock:
            self._groups.pop(ps_id, None)


def _resolve(process_set) -> tuple[int, object]:
    """(id, group) of a ProcessSet argument, validating that it is registered."""

    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, got {type(process_set).__name__}.")
    if process_set.process_set_id is None:
        raise ValueError("This process set has not been registered; call hvd.add_process_set(...) on every rank.")
    return process_set.process_set_id, context().process_sets.group(process_set.process_set_id)


def add_process_set(process_set) -> ProcessSet:
    """Register a process set (a :class:`ProcessSet` or a list of ranks) on every rank and return it.

    Collective: every rank calls it with the same ranks, in the same order (ranks outside the set too).
    Allowed at any time (as with ``init(process_sets="dynamic")``). A set whose ranks equal an existing
    one (even the global set) gets its own id; re-adding an already registered object raises ``ValueError``.
    """
    ctx = context()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.ranks is None or not ps.ranks:
        raise ValueError("A process set needs at least one rank.")
    if ps.process_set_id is not None:
        raise ValueError(f"Process set {ps} is already registered.")
    bad = [r for r in ps.ranks if not 0 <= r < ctx.rt.size]
    if bad:
        raise ValueError(f"Process set ranks {bad} are outside the world of size {ctx.rt.size}.")
    ps.process_set_id = control("add_process_set", list(ps.ranks))
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` on every rank (collective). The global set cannot be removed.

    Returns True when the set was removed.
    """
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, got {type(process_set).__name__}.")
    if process_set.process_set_id == 0:
        raise ValueError("The global process set cannot be removed.")
    if process_set.process_set_id is None:
        return False
    control("remove_process_set", [process_set.process_set_id])
    process_set.process_set_id = None
    return True


__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]
