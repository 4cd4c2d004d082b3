"""The one place where an algorithm is chosen, for every collective that has more than one.

Front ends pass what the caller asked for (a name, or ``"auto"``); :func:`requested` applies the
process-wide override (``RINGLET_ALGORITHM``) and validates names; :func:`allreduce` and
:func:`allgather` turn a request into the algorithm that runs. Choices depend only on arguments that
are identical on every member (group size, host layout, byte count, the transport's capabilities), so
every member picks the same algorithm without communicating. The cost-model tuner replaces the size
rule of :func:`allreduce` here.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algorithms import ALIASES, ALLREDUCE, NATIVE, allreduce_names

AUTO = "auto"
ALLGATHER_ALGORITHMS = ("ring", "direct")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the transport offers beside point-to-point: ``native_small`` — its own all-reduce beats
    ringlet's schedules on small messages."""

    native_small: bool = False

    @staticmethod
    def of(transport) -> "Capabilities":
        return Capabilities(bool(getattr(transport, "native_small", False)))


# Rounds cost tens of microseconds (MPI, shm) to milliseconds (Gloo): below these sizes fewer rounds
# win over fewer bytes. Recursive doubling has half the rounds of halving-doubling but sends the whole
# vector each round.
RECURSIVE_DOUBLING_BELOW = 32 << 10
HALVING_DOUBLING_BELOW = 64 << 10
NATIVE_SMALL_BELOW = 64 << 10
HIERARCHICAL_FROM = 1 << 20


def requested(name: str | None, override: str = AUTO) -> str:
    """The canonical name of a requested all-reduce algorithm: ``"auto"`` takes ``override`` (the
    process-wide ``RINGLET_ALGORITHM``) when that is set. ``ValueError`` for unknown names."""
    name = (name or AUTO).strip().lower()
    if name == AUTO and override not in ("", AUTO):
        name = override.strip().lower()
    name = ALIASES.get(name, name)
    if name != AUTO and name != NATIVE and name not in ALLREDUCE:
        raise ValueError(f"Unknown algorithm {name!r}; choose one of auto, " + ", ".join(allreduce_names()) + ".")
    return name


def schedule_rule(p: int, nbytes: int, host_of: tuple[int, ...]) -> str:
    """The size rule among ringlet's own schedules."""
    hosts = len(set(host_of))
    if nbytes < RECURSIVE_DOUBLING_BELOW:
        return "recursive_doubling"
    if nbytes < HALVING_DOUBLING_BELOW:
        return "halving_doubling"
    if 1 < hosts < p and nbytes >= HIERARCHICAL_FROM:
        return "hierarchical"
    return "ring"


def allreduce(name: str, p: int, nbytes: int, host_of: tuple[int, ...], caps: Capabilities) -> str:
    """The all-reduce algorithm to run for request ``name`` (already :func:`requested`): a forced name
    is kept; ``"auto"`` hands small messages to the backend's own all-reduce where it is faster
    (``caps.native_small``) and otherwise follows :func:`schedule_rule`. A caller whose backend declines
    the native all-reduce for a dtype asks again with ``caps.native_small`` off."""
    if name != AUTO:
        return name
    if caps.native_small and nbytes < NATIVE_SMALL_BELOW:
        return NATIVE
    return schedule_rule(p, nbytes, host_of)


def allgather(name: str | None) -> str:
    """The all-gather algorithm for request ``name`` (``"ring"`` by default). ``ValueError`` when unknown."""
    name = (name or "ring").strip().lower()
    if name == AUTO:
        return "ring"
    if name not in ALLGATHER_ALGORITHMS:
        raise ValueError(f"unknown all-gather algorithm {name!r}; choose from {sorted(ALLGATHER_ALGORITHMS)}")
    return name
