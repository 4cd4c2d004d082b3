"""How a simulated transfer is cut into pipelining segments: a strategy object per choice.

* :class:`Whole` — no segmentation (one segment per transfer);
* :class:`Fixed` — segments of a given size;
* :class:`Auto` — try whole transfers and the segment size that the pipelining formula calls best for
  the schedule, keep the faster.

The formula: a chain of ``n`` dependent steps whose transfers of ``b`` bytes are cut into ``k`` segments
costs about ``(n + k - 1)·(α + (b/k)·β)``, smallest at ``k* = sqrt((n-1)·b·β/α)``. Auto takes ``b`` the
largest transfer of the schedule, ``α``/``β`` the larger of the two link classes', rounds ``b/k*`` to a
power of two and never goes below :data:`Auto.smallest` bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from ..tuning.network import LINK_CLASSES, Network
from .sizes import parse_size


class SegmentPolicy(Protocol):
    label: str

    def candidates(self, steps: int, largest_bytes: int, network: Network) -> tuple[int | None, ...]:
        """Segment sizes to try (``None``: whole transfers), given the schedule's step count and largest
        transfer in bytes. The simulator keeps the fastest."""
        ...


@dataclass(frozen=True)
class Whole:
    label: str = "none"

    def candidates(self, steps: int, largest_bytes: int, network: Network) -> tuple[int | None, ...]:
        return (None,)


@dataclass(frozen=True)
class Fixed:
    segment_bytes: int

    def __post_init__(self) -> None:
        if not isinstance(self.segment_bytes, int) or self.segment_bytes < 1:
            raise ValueError(f"a segment must be a positive number of bytes, got {self.segment_bytes!r}")

    @property
    def label(self) -> str:
        return str(self.segment_bytes)

    def candidates(self, steps: int, largest_bytes: int, network: Network) -> tuple[int | None, ...]:
        return (self.segment_bytes,)


@dataclass(frozen=True)
class Auto:
    label: str = "auto"
    smallest: int = 4096

    def best_segment(self, steps: int, largest_bytes: int, network: Network) -> int | None:
        """The formula's segment size, or ``None`` when cutting does not pay (one step, or ``k* <= 1``)."""
        alpha = max(network[c].alpha for c in LINK_CLASSES)
        beta = max(network[c].beta for c in LINK_CLASSES)
        if steps < 2 or largest_bytes <= self.smallest or beta == 0:
            return None
        k = math.inf if alpha == 0 else math.sqrt((steps - 1) * largest_bytes * beta / alpha)
        if k <= 1:
            return None
        size = max(self.smallest, largest_bytes / k)
        rounded = 1 << round(math.log2(size))
        return rounded if rounded < largest_bytes else None

    def candidates(self, steps: int, largest_bytes: int, network: Network) -> tuple[int | None, ...]:
        best = self.best_segment(steps, largest_bytes, network)
        return (None,) if best is None else (None, best)


WHOLE = Whole()


def policy(spec: "str | int | None | SegmentPolicy") -> SegmentPolicy:
    """A policy from ``None`` (whole), a byte count, ``"auto"``, ``"none"``, a size text (``"64K"``) or a
    policy. ``ValueError`` for anything else."""
    if spec is None:
        return WHOLE
    if isinstance(spec, bool):
        raise ValueError(f"not a segment size: {spec!r}")
    if isinstance(spec, int):
        return Fixed(spec)
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text == "auto":
            return Auto()
        if text in ("none", "whole", "0", ""):
            return WHOLE
        return Fixed(parse_size(spec))
    if hasattr(spec, "candidates"):
        return spec
    raise ValueError(f"not a segment size: {spec!r} (a byte count, 'auto' or 'none')")
