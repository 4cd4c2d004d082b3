"""The one place where an algorithm is chosen, for every collective that has more than one.

Front ends pass what the caller asked for (a name, or ``"auto"``); :func:`requested` applies the
process-wide override (``RINGLET_ALGORITHM``) and validates names; :func:`allreduce_choice` (and its
name-only form :func:`allreduce`), :func:`allgather` and :func:`allgather_choice`, :func:`alltoall` and
:func:`alltoall_choice` turn a request into what runs. Choices depend only on arguments that are identical on every member (group size, host layout,
byte count, the transport's capabilities, and the cost :class:`Model` when there is one, which every
rank builds from the same constants), so every member picks the same algorithm without communicating.

The engine does not import this module: it is handed a :class:`Selector` (the runtime holds one,
``Runtime.selector``, and puts it on every :class:`~ringlet.engine.channel.Channel`). Without a model
``"auto"`` follows a size rule (:func:`schedule_rule`). With one (``ringlet.init`` builds the selector
from the calibration profile; :mod:`ringlet.tuning.adaptive` replaces the model's constants while
training runs) ``"auto"`` takes the algorithm **and segment size** of least predicted time
(:mod:`ringlet.tuning.cost`); a forced algorithm keeps its name and gets the model's segment size. The
backend's own all-reduce (``"native"``) keeps its capability rule: it has no schedule to predict.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algorithms import ALIASES, ALLREDUCE, AUTO, NATIVE, allreduce_names
from ..algorithms import direct as _direct
from ..algorithms import ring as _ring
from .alltoall_select import alltoall, alltoall_choice, alltoall_rule
from .model import Choice, Model

__all__ = ["AUTO", "Capabilities", "Choice", "Model", "Selector", "requested", "schedule_rule", "allreduce",
           "allreduce_choice", "allgather", "allgather_choice", "alltoall", "alltoall_rule", "alltoall_choice"]

ALLGATHER_ALGORITHMS = ("ring", "direct")
ALLGATHER_BUILDERS = {"ring": _ring.allgather, "direct": _direct.allgather}


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What selection needs of the transport's abilities: ``native_small`` — its own all-reduce beats
    ringlet's schedules on small messages. Any object with that attribute serves (the transport's own
    record, ``transport.capabilities``, included)."""

    native_small: bool = False

    @staticmethod
    def of(transport) -> "Capabilities":
        """The selection-relevant part of ``transport.capabilities``."""
        return Capabilities(bool(transport.capabilities.native_small))


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
    if name == AUTO and (override == AUTO or not override):  # the common call, answered at once
        return AUTO
    if name is not None and not isinstance(name, str):
        raise ValueError(f"algorithm must be a name (str), got {name!r}.")
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


def allreduce_choice(name: str, p: int, nbytes: int, host_of: tuple[int, ...], caps: Capabilities,
                     model: Model | None = None, itemsize: int = 4) -> Choice:
    """What runs for all-reduce request ``name`` (already :func:`requested`) of ``nbytes`` bytes of
    ``itemsize``-byte elements over ``p`` ranks on hosts ``host_of``.

    A forced name is kept (with ``model``, at the model's best segment size for it); ``"auto"`` hands
    small messages to the backend's own all-reduce where it is faster (``caps.native_small``), then
    takes ``model``'s best (algorithm, segment size), or without a model :func:`schedule_rule` at the
    channel's segment size (``segment_bytes`` None). A caller whose backend declines the native
    all-reduce for a dtype asks again with ``caps.native_small`` off."""
    if name == NATIVE:
        return Choice(NATIVE)
    if name != AUTO:
        return Choice(name) if model is None else model.choose(nbytes, host_of, itemsize, algorithm=name)
    if caps.native_small and nbytes < NATIVE_SMALL_BELOW:
        return Choice(NATIVE)
    if model is None:
        return Choice(schedule_rule(p, nbytes, host_of))
    return model.choose(nbytes, host_of, itemsize)


def allreduce(name: str, p: int, nbytes: int, host_of: tuple[int, ...], caps: Capabilities,
              model: Model | None = None, itemsize: int = 4) -> str:
    """The algorithm of :func:`allreduce_choice`."""
    return allreduce_choice(name, p, nbytes, host_of, caps, model, itemsize).algorithm


@dataclass(frozen=True, slots=True)
class Selector:
    """The algorithm selector the engine is handed: :func:`allreduce_choice` and :func:`allgather_choice`
    under one cost ``model`` (None: the size rule). Every rank must hold a selector built from the same
    constants (``ringlet.init`` builds it from the calibration profile every rank loads)."""

    model: Model | None = None

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, Model):
            raise TypeError(f"a Selector takes a select.Model or None, got {type(self.model).__name__}")

    def allreduce(self, name: str, p: int, nbytes: int, host_of: tuple[int, ...], caps,
                  itemsize: int = 4) -> Choice:
        """:func:`allreduce_choice` under this selector's model; ``caps``: anything with ``native_small``."""
        return allreduce_choice(name, p, nbytes, host_of, caps, self.model, itemsize)

    def allgather(self, name: str | None, counts: tuple[int, ...], itemsize: int, host_of: tuple[int, ...]) -> str:
        """:func:`allgather_choice` under this selector's model."""
        return allgather_choice(name, counts, itemsize, host_of, self.model)

    def alltoall(self, name: str | None, send_counts: tuple[tuple[int, ...], ...], itemsize: int,
                 host_of: tuple[int, ...]) -> str:
        """:func:`ringlet.tuning.alltoall_select.alltoall_choice` under this selector's model."""
        return alltoall_choice(name, send_counts, itemsize, host_of, self.model)


def allgather(name: str | None) -> str:
    """The all-gather algorithm for request ``name`` (``"ring"`` by default). ``ValueError`` when unknown."""
    if name is not None and not isinstance(name, str):
        raise ValueError(f"all-gather algorithm must be a name (str), got {name!r}.")
    name = (name or "ring").strip().lower()
    if name == AUTO:
        return "ring"
    if name not in ALLGATHER_ALGORITHMS:
        raise ValueError(f"unknown all-gather algorithm {name!r}; choose from {sorted(ALLGATHER_ALGORITHMS)}")
    return name


def allgather_choice(name: str | None, counts: tuple[int, ...], itemsize: int, host_of: tuple[int, ...],
                     model: Model | None = None) -> str:
    """The all-gather algorithm that runs for request ``name`` over blocks of ``counts`` elements of
    ``itemsize`` bytes on a group laid out as ``host_of``: a forced name as :func:`allgather` says;
    ``"auto"`` the one of least predicted time under ``model`` (ring or direct, from their schedules;
    direct only where a rank's p-1 sends stay within the model's ``fanout_limit``, as for all-reduce), or
    ``"ring"`` without a model. ``ValueError`` for an unknown name."""
    if (name or "ring").strip().lower() != AUTO or model is None or len(counts) < 2:
        return allgather(name)
    if len(counts) - 1 > model.fanout_limit:
        return "ring"
    return _fastest_allgather(tuple(counts), int(itemsize), tuple(host_of), model.network)


_AG_CACHE: dict[tuple, tuple[object, str]] = {}  # (counts, itemsize, host_of, id(network)) -> (network, name)


def _fastest_allgather(counts: tuple[int, ...], itemsize: int, host_of: tuple[int, ...], network) -> str:
    key = (counts, itemsize, host_of, id(network))
    hit = _AG_CACHE.get(key)
    if hit is not None and hit[0] is network:
        return hit[1]
    from .cost import predict
    from .network import Topology

    topology = Topology(host_of)
    times = {name: predict(build(len(counts), counts), topology, network, itemsize=itemsize).seconds
             for name, build in ALLGATHER_BUILDERS.items()}
    name = min(ALLGATHER_ALGORITHMS, key=lambda n: (times[n], n))
    if len(_AG_CACHE) >= 256:
        _AG_CACHE.pop(next(iter(_AG_CACHE)))
    _AG_CACHE[key] = (network, name)
    return name
