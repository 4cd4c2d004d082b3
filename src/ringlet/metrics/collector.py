"""The rank's Prometheus collector: every metric derived when scraped, nothing observed on the hot path.

:class:`RankCollector` is a ``prometheus_client`` custom collector. At each scrape it folds the flight
records finished since the previous one (:mod:`.fold`), the step clock (:mod:`.stepfold`), and reads the
liveness monitor and the straggler scores (:func:`ringlet.metrics.set_straggler_score`). Every sample carries
the ``rank`` label of the rank that measured it, except the straggler scores (:mod:`.scores`), whose
``rank`` and ``host`` are those of the rank scored. docs/metrics.md lists the metrics.
"""
from __future__ import annotations

import threading
from typing import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .. import steps, straggler
from .fold import Cursor, Totals, cumulative
from .scores import straggler_scores
from .stepfold import STEP_BUCKETS, StepTotals

__all__ = ["RankCollector"]


class RankCollector:
    """The metrics of the rank whose runtime ``get_runtime()`` returns (None: no runtime now; the totals
    kept so far are still served, under the last rank seen). ``clock``: the step clock (default the
    process's). Thread-safe: scrapes are serialised."""

    def __init__(self, get_runtime: Callable[[], object], clock=None) -> None:
        self._get_runtime = get_runtime
        self._clock = steps.CLOCK if clock is None else clock
        self._lock = threading.Lock()
        self._cursor: Cursor | None = None
        self.totals = Totals()
        self.step_totals = StepTotals()
        self._rank: str | None = None
        self._info: dict[str, str] = {}

    def describe(self):
        return []  # registered without a trial collect

    def collect(self):
        with self._lock:
            rt = self._get_runtime()
            self._fold(rt)
            return list(self._families(rt))

    def _fold(self, rt) -> None:
        if rt is not None:
            rec = rt.recorder
            if self._cursor is None or self._cursor.recorder is not rec:
                self._cursor = Cursor(rec)  # a new session: its own ring; the totals go on
            self._rank = str(rt.rank)
            host = rt.hostnames[rt.rank] if getattr(rt, "hostnames", None) else ""
            self._info = {"rank": self._rank, "host": host, "world_size": str(rt.size),
                          "local_rank": str(rt.local_rank()), "transport": str(getattr(rt.transport, "name", ""))}
            self.totals.add(self._cursor.take())
        self.step_totals.fold(self._clock)

    def _families(self, rt):
        if self._rank is None:
            yield from self._scores(rt)
            return
        rank = self._rank
        info = GaugeMetricFamily("ringlet_rank_info", "This rank: its host, local rank, world size and transport.",
                                 labels=list(self._info))
        info.add_metric(list(self._info.values()), 1.0)
        yield info
        yield from self._collectives(rank)
        yield from self._steps(rank)
        yield from self._liveness(rank, None if rt is None else rt.monitor)
        yield from self._scores(rt)

    def _collectives(self, rank: str):
        t = self.totals
        labels = ["rank", "op", "algorithm"]
        count = CounterMetricFamily("ringlet_collectives", "Collectives completed, by op and algorithm.", labels=labels)
        nbytes = CounterMetricFamily("ringlet_collective_bytes", "Bytes of the collectives' tensors, by op and "
                                     "algorithm.", labels=labels)
        busy = CounterMetricFamily("ringlet_collective_busy_seconds", "Seconds collectives ran (start to end), by op "
                                   "and algorithm.", labels=labels)
        for (op, algo), v in sorted(t.ops.items()):
            count.add_metric([rank, op, algo], v.count)
            nbytes.add_metric([rank, op, algo], v.bytes)
            busy.add_metric([rank, op, algo], v.seconds)
        errors = CounterMetricFamily("ringlet_collective_errors", "Collectives that failed, by op and error type.",
                                     labels=["rank", "op", "error"])
        for (op, err), n in sorted(t.errors.items()):
            errors.add_metric([rank, op, err], n)
        hist = HistogramMetricFamily("ringlet_collective_latency_seconds", "Collective latency (start to end) by op.",
                                     labels=["rank", "op"])
        for op, (counts, total, _n) in sorted(t.hist.items()):
            hist.add_metric([rank, op], cumulative(counts), total)
        dropped = CounterMetricFamily("ringlet_flight_records_dropped", "Flight records the ring buffer lost before "
                                      "a scrape read them (not in the collective counts).", labels=["rank"])
        dropped.add_metric([rank], t.dropped)
        pending = GaugeMetricFamily("ringlet_collectives_pending", "Collectives queued or running now.", labels=["rank"])
        pending.add_metric([rank], t.pending)
        oldest = GaugeMetricFamily("ringlet_collective_oldest_pending_seconds", "Seconds the oldest collective still "
                                   "queued or running has waited (0: none).", labels=["rank"])
        oldest.add_metric([rank], t.oldest_pending_seconds())
        yield from (count, nbytes, busy, errors, hist, dropped, pending, oldest)

    def _steps(self, rank: str):
        s = self.step_totals
        total = CounterMetricFamily("ringlet_steps", "Training steps marked by the front ends.", labels=["rank"])
        total.add_metric([rank], s.steps)
        hist = HistogramMetricFamily("ringlet_step_seconds", "Step time: between consecutive step marks.",
                                     labels=["rank"])
        hist.add_metric([rank], cumulative(s.buckets, STEP_BUCKETS), s.seconds)
        exposed = CounterMetricFamily("ringlet_exposed_comm_seconds", "Seconds the training loop waited on its "
                                      "gradient reductions after the backward.", labels=["rank"])
        exposed.add_metric([rank], s.wait_seconds)
        share = GaugeMetricFamily("ringlet_exposed_comm_share", "Exposed communication over step time, for the "
                                  "steps finished since the previous scrape (0..1).", labels=["rank"])
        share.add_metric([rank], s.share)
        switches = CounterMetricFamily("ringlet_algorithm_switches", "Switches the tuners made while training, by "
                                       "kind (algorithm, bucket_bytes, trial).", labels=["rank", "kind"])
        for kind, n in sorted(s.switches.items()):
            switches.add_metric([rank, kind], n)
        yield from (total, hist, exposed, share, switches)

    def _liveness(self, rank: str, monitor):
        up = GaugeMetricFamily("ringlet_liveness_up", "1 while this rank's liveness monitor runs without a verdict.",
                               labels=["rank"])
        beats = CounterMetricFamily("ringlet_liveness_heartbeats", "Heartbeats this rank wrote to the job's store.",
                                    labels=["rank"])
        silence = GaugeMetricFamily("ringlet_liveness_peer_silence_seconds", "Seconds since a watched rank's "
                                    "heartbeat last moved, as this rank last looked.", labels=["rank", "peer"])
        verdict = GaugeMetricFamily("ringlet_liveness_verdict", "1 for the liveness verdict this rank holds: the "
                                    "failed rank, its host and how it failed.",
                                    labels=["rank", "failed_rank", "host", "kind"])
        if monitor is None:
            up.add_metric([rank], 0.0)
        else:
            v = monitor.verdict
            up.add_metric([rank], 1.0 if v is None else 0.0)
            beats.add_metric([rank], monitor.beats)
            for peer, age in sorted(monitor.peer_ages().items()):
                silence.add_metric([rank, str(peer)], age)
            if v is not None:
                verdict.add_metric([rank, str(v.rank), v.host, v.kind], 1.0)
        yield from (up, beats, silence, verdict)

    def _scores(self, rt):
        g = GaugeMetricFamily("ringlet_straggler_score", "How much slower than the others a rank is, as this "
                              "rank's straggler detector last saw it (its time over the others' median, less 1; "
                              "0: not slower), and scores set with set_straggler_score.", labels=["rank", "host"])
        found = dict(straggler_scores())
        if rt is not None:
            for r, score in straggler.scores(rt).items():
                found[(r, rt.hostnames[r])] = score
        for (r, host), s in sorted(found.items()):
            g.add_metric([str(r), host], s)
        yield g
