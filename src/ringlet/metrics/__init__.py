"""Prometheus/OpenMetrics metrics of a ringlet job (``prometheus-client``); docs/metrics.md.

Every metric is derived when the endpoint is scraped: the collectives from the flight recorder's ring
(:mod:`.fold`), the steps and exposed communication from :mod:`ringlet.steps`, liveness from the
monitor, straggler scores from :func:`set_straggler_score`. Nothing is observed on the collective path.

Endpoints: per rank (``RINGLET_METRICS_PORT``, :mod:`.serve`) or one per host served by ``ringlet run
--metrics-port``'s agent (:mod:`.host`). ``ringlet.init`` starts the rank's side (:func:`start`).
``prometheus_client`` is imported only by those (and :mod:`.collector`): publishing a straggler score
(:mod:`.scores`) needs nothing.
"""
from __future__ import annotations

from .scores import clear_straggler_scores, set_straggler_score, straggler_scores

__all__ = ["set_straggler_score", "clear_straggler_scores", "straggler_scores", "start"]


def start(rt):
    """The rank's endpoint for runtime ``rt`` when ``RINGLET_METRICS_PORT`` or ``RINGLET_METRICS_DIR`` asks
    for one (see :mod:`.serve`), else None."""
    from .. import collectives
    from . import serve

    return serve.start(rt, lambda: collectives._runtime)
