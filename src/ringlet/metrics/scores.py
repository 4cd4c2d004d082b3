"""Straggler scores published as ``ringlet_straggler_score{rank, host}``: a process-wide table that the
straggler detector fills and the collector reads when scraped. It imports nothing (setting a score costs a
lock and a dict store, metrics served or not).
"""
from __future__ import annotations

import math
import threading

__all__ = ["set_straggler_score", "clear_straggler_scores", "straggler_scores"]

_SCORES: dict[tuple[int, str], float] = {}
_SCORES_LOCK = threading.Lock()


def set_straggler_score(rank: int, host: str, score: float) -> None:
    """Publish ``score`` as ``ringlet_straggler_score{rank, host}`` (the scored rank and its host) on this
    process's metrics; a later call for the same rank and host replaces it. The straggler detector calls
    it; the score's meaning (docs/metrics.md) is its own: higher is slower, 1.0 an ordinary rank.
    ``ValueError`` for a negative rank or a score that is not a finite number."""
    r, s = int(rank), float(score)
    if r < 0 or not math.isfinite(s):
        raise ValueError(f"straggler score: rank {rank!r} must be >= 0 and score {score!r} finite")
    with _SCORES_LOCK:
        _SCORES[(r, str(host))] = s


def clear_straggler_scores() -> None:
    """Forget every straggler score (the gauge then has no samples)."""
    with _SCORES_LOCK:
        _SCORES.clear()


def straggler_scores() -> dict[tuple[int, str], float]:
    """A copy of the scores set: (rank, host) -> score."""
    with _SCORES_LOCK:
        return dict(_SCORES)
