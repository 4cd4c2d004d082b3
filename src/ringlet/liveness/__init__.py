"""Liveness: a rank that stops answering is named on every survivor within seconds.

A heartbeat that is independent of the data path: each rank's monitor thread bumps a counter in the
job's store every ``interval`` seconds and watches the counters of the ranks after it; one that has
not moved for ``peer_timeout`` seconds is declared silent (a cut link, a frozen host, a stopped
process). The launcher's node agents record ranks that exit with an error. Either way every
survivor's transport is aborted with a :class:`ringlet.PeerError` that names the rank and its host.

- :mod:`.keys`: where the heartbeats, verdicts and death records live in the store.
- :mod:`.verdict`: what a verdict says and how it becomes a ``PeerError``.
- :mod:`.monitor`: the per-rank thread, and :func:`start` that ``ringlet.init`` calls.
"""
from .monitor import Monitor, start
from .verdict import Verdict

__all__ = ["Monitor", "Verdict", "start"]
