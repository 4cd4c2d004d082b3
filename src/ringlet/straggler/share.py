"""Sharing the summaries on the liveness monitor's heartbeat, and reporting the verdicts.

Every heartbeat (``RINGLET_HEARTBEAT_INTERVAL``, 1 s) each rank's monitor thread publishes its
summary under the store entry ``strag`` (one ``set``, on the round the heartbeat already makes: no
collective and nothing on the training thread), and every ``every`` heartbeats reads every rank's and
runs its :class:`~.detect.Detector`. Every rank decides (the same summaries give the same verdicts, and
each rank's :meth:`~.stepmeter.StepMeter.scores` is there for its own metrics endpoint); rank 0 alone logs,
so a verdict is one line in the job's log, and every rank marks it on its own timeline.
"""
from __future__ import annotations

import json
import logging

from .. import timeline
from .detect import Change, Detector
from .stepmeter import StepMeter

NAME = "strag"  # the store entry (ringlet.liveness.monitor.StoreView) each rank publishes its summary under
TRACK = "straggler"  # the timeline track of the verdicts
log = logging.getLogger("ringlet")


class Sharer:
    """The monitor task (``Monitor.add_task``) of one rank's meter; ``hosts``: every rank's host name."""

    def __init__(self, meter: StepMeter, rank: int, size: int, hosts, reporter: bool):
        self.meter, self.rank, self.size = meter, rank, size
        self.hosts = dict(enumerate(hosts))
        self.reporter = reporter
        self.detector = meter.detector = Detector(meter.options)
        self.beats = 0

    def __call__(self, view) -> None:
        self.meter.mark_links()
        view.publish(NAME, json.dumps(self.meter.summary(), separators=(",", ":")))
        self.beats += 1
        if self.beats % self.meter.options.every:
            return
        raw = view.read(NAME, list(range(self.size)))
        summaries = {r: json.loads(v) for r, v in raw.items() if v}
        for change in self.detector.check(summaries, self.hosts):
            report(change, self.reporter)


def report(change: Change, to_log: bool) -> None:
    """Log ``change`` (WARNING on logger ``ringlet``) when ``to_log``; mark it on this process's timeline
    (an instant ``straggler`` or ``straggler_recovered`` on track ``straggler``)."""
    if to_log:
        log.warning("ringlet: %s", change.describe())
    name = "straggler" if change.state == "straggler" else "straggler_recovered"
    timeline.instant(TRACK, name, change.args())
