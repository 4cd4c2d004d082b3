"""What the simulator can replay: for each collective, its algorithms' schedule builders and its busbw factor.

Every builder has the all-reduce registry's shape, ``build(p, count, host_of) -> Schedule``, where
``count`` is the collective's size in elements as nccl-tests counts it: the vector for all-reduce,
broadcast and reduce; the whole gathered (scattered) buffer for all-gather (reduce-scatter), split
evenly into the ranks' blocks; each rank's whole send buffer for all-to-all, split evenly over the
destinations. All-reduce takes :data:`ringlet.algorithms.ALLREDUCE` and all-to-all
:data:`ringlet.algorithms.ALLTOALL` as they are, so an algorithm added there is simulated without new
code here (all-to-all's local copies between steps cost nothing in the replay).

``busbw = algbw · factor(p)`` with nccl-tests' factors: ``2(p-1)/p`` for all-reduce, ``(p-1)/p`` for
all-gather, reduce-scatter and all-to-all, 1 for broadcast and reduce.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..algorithms import ALIASES, ALLREDUCE, ALLTOALL, binomial, direct, ring
from ..algorithms.schedule import Schedule, even_split

Builder = Callable[[int, int, tuple[int, ...]], Schedule]


def _blocks(count: int, p: int) -> tuple[int, ...]:
    return tuple(c for _, c in even_split(count, p))


def _alltoall(name: str) -> Builder:
    def build(p: int, count: int, host_of: tuple[int, ...]) -> Schedule:
        return ALLTOALL[name](p, (_blocks(count, p),) * p, tuple(host_of))
    return build


@dataclass(frozen=True)
class Collective:
    """One collective: ``algorithms`` by name, ``aliases`` of those names, ``factor(p)`` for busbw."""

    name: str
    algorithms: Mapping[str, Builder]
    factor: Callable[[int], float]
    aliases: Mapping[str, str] = field(default_factory=dict)

    @property
    def _choices(self) -> str:
        return ", ".join(sorted(self.algorithms))

    def resolve(self, name: str) -> str:
        """The canonical algorithm name for ``name`` (case-insensitive; aliases allowed).
        ``ValueError`` naming the choices when there is no such algorithm."""
        key = name.strip().lower()
        key = self.aliases.get(key, key)
        if key not in self.algorithms:
            raise ValueError(f"unknown {self.name} algorithm {name!r}; choose from {self._choices}")
        return key

    def names(self, spec: str) -> tuple[str, ...]:
        """Algorithms of a comma list or ``"all"`` (in registry order), canonical and without repeats."""
        if spec.strip().lower() == "all":
            return tuple(self.algorithms)
        picked = [self.resolve(n) for n in spec.split(",") if n.strip()]
        if not picked:
            raise ValueError(f"no {self.name} algorithm given; choose 'all' or from {self._choices}")
        return tuple(dict.fromkeys(picked))

    def build(self, algorithm: str, p: int, count: int, host_of: tuple[int, ...]) -> Schedule:
        return self.algorithms[self.resolve(algorithm)](p, count, tuple(host_of))


def _pairs_factor(p: int) -> float:
    return (p - 1) / p if p else 0.0


COLLECTIVES: dict[str, Collective] = {
    "allreduce": Collective("allreduce", ALLREDUCE, lambda p: 2.0 * (p - 1) / p if p else 0.0, ALIASES),
    "allgather": Collective("allgather", {
        "ring": lambda p, n, h: ring.allgather(p, _blocks(n, p)),
        "direct": lambda p, n, h: direct.allgather(p, _blocks(n, p)),
    }, _pairs_factor),
    "reduce_scatter": Collective("reduce_scatter", {
        "ring": lambda p, n, h: ring.reduce_scatter(p, _blocks(n, p)),
    }, _pairs_factor),
    "broadcast": Collective("broadcast", {"binomial": lambda p, n, h: binomial.broadcast(p, n, 0)}, lambda p: 1.0),
    "reduce": Collective("reduce", {"binomial": lambda p, n, h: binomial.reduce(p, n, 0)}, lambda p: 1.0),
    "alltoall": Collective("alltoall", {name: _alltoall(name) for name in ALLTOALL}, _pairs_factor),
}


def collective(name: str) -> Collective:
    """The collective called ``name``; ``ValueError`` naming the choices otherwise."""
    key = name.strip().lower().replace("-", "_")
    if key not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; choose from {', '.join(COLLECTIVES)}")
    return COLLECTIVES[key]
