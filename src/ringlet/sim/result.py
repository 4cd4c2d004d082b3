"""One row of a simulation: a collective of some size by one algorithm, replayed or predicted."""
from __future__ import annotations

from dataclasses import dataclass

REPLAY = "replay"  # replayed step by step on the modelled network (:mod:`ringlet.sim.engine`)
MODEL = "model"  # predicted by the cost model (:mod:`ringlet.tuning.cost`)
SOURCES = (REPLAY, MODEL)


@dataclass(frozen=True)
class SimResult:
    """``seconds`` for ``collective`` of ``nbytes`` by ``algorithm`` on ``ranks`` ranks, in ``steps``
    schedule steps, with pipelining segments of ``segment_bytes`` (``None``: whole transfers); ``source``
    says whether it was replayed or taken from the cost model; ``factor`` is the busbw factor."""

    collective: str
    algorithm: str
    nbytes: int
    ranks: int
    seconds: float
    steps: int
    segment_bytes: int | None
    source: str
    factor: float

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")

    @property
    def algbw(self) -> float:
        """Bytes per second, nccl-tests' ``size / time`` (0 for an empty or instant collective)."""
        return self.nbytes / self.seconds if self.seconds > 0 and self.nbytes else 0.0

    @property
    def busbw(self) -> float:
        """``algbw · factor``: comparable to a link's rate whatever the collective and rank count."""
        return self.algbw * self.factor

    def to_dict(self) -> dict:
        return {"collective": self.collective, "algorithm": self.algorithm, "bytes": self.nbytes,
                "ranks": self.ranks, "seconds": self.seconds, "algbw_GBps": self.algbw / 1e9,
                "busbw_GBps": self.busbw / 1e9, "steps": self.steps, "segment_bytes": self.segment_bytes,
                "source": self.source}
