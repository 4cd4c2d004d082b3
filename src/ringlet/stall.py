"""The stall inspector: a rank that waits too long in a collective says which ranks have not arrived and
what they are doing instead.

Every rank publishes, once per liveness heartbeat (:meth:`ringlet.liveness.monitor.Monitor.add_task`,
entry :data:`ENTRY` of the job's store), what it is doing now (:func:`now_state`): each group's last
started sequence number (the runtime's own counters, so collectives the flight recorder does not see
count too) and, from the flight recorder's last records, the collective it is in (group, seq, op, shape,
dtype, call site, since when, wall clock) or, outside any, since when and its last one. Nothing is added
to the collective path: the state is built on the monitor's thread from what the recorder already keeps.

On the same tick the rank looks at its own running collective (the flight recorder's ``running``
record). Once it has waited ``warn`` seconds (``RINGLET_STALL_WARN_S``, default 60; 0 turns the warning
off) it reads the entries of the group's other members and logs (logger ``ringlet``, WARNING) the ranks
whose last started sequence number on that group is below its own, each with what it does instead; the
report repeats at 2, 4, 8, ... times ``warn``. After ``shutdown`` seconds (``RINGLET_STALL_SHUTDOWN_S``,
default 0: never) the rank gives up: it aborts its transport with a :class:`StallError` naming the
missing ranks, which fails its pending collectives (and writes its flight record, as any ``PeerError``
does). Under ``ringlet.torch`` (:func:`use_horovod_env`, called by ``hvd.init()``) Horovod's
``HOROVOD_STALL_CHECK_TIME_SECONDS``, ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` and
``HOROVOD_STALL_CHECK_DISABLE`` set these when the ``RINGLET_`` variables are not given.

Without a store (no liveness monitor: a process world not started by ``ringlet run`` or torchrun, or
``RINGLET_PEER_TIMEOUT=0``) a thread of the inspector's own ticks every :data:`OWN_PERIOD` seconds; the
rank still warns about its own long wait and gives up after ``shutdown``, but cannot name the others,
and its message says so. The inspector sees only what the flight recorder records (the core API and
everything queued through :meth:`ringlet.runtime.Runtime.submit_op`); with the recorder off
(``RINGLET_FLIGHT_RECORDER=0``) it publishes sequence numbers and warns about nothing.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from .types import PeerError

ENTRY = "now"  # the store entry each rank publishes its state under
OWN_PERIOD = 1.0  # seconds between ticks of the inspector's own thread (no liveness monitor)
MAX_NAMED = 8  # ranks described one by one in a report; the rest are listed by number
RECENT = 256  # the flight records read per tick: the running collective is among the last ones
_NOUN = {"allreduce": "all-reduce", "allgather": "all-gather", "reduce_scatter": "reduce-scatter",
         "alltoall": "all-to-all", "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier"}
_TRUE = ("1", "true", "yes", "on")

log = logging.getLogger("ringlet")


class StallError(PeerError):
    """A rank gave up waiting in a collective (``RINGLET_STALL_SHUTDOWN_S``); ``rank``: the first member
    that had not arrived, ``missing``: all of them (empty when unknown: no store)."""

    def __init__(self, *args, rank: int | None = None, host: str | None = None, missing: tuple = ()):
        super().__init__(*args, rank=rank, host=host)
        self.missing = tuple(missing)


# ---- settings ---------------------------------------------------------------------------------------
def _seconds(environ, name: str) -> float | None:
    """``name`` as seconds >= 0, None when unset or empty; anything else is a ``ValueError``."""
    raw = environ.get(name, "")
    if raw.strip() == "":
        return None
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name}={raw!r}: expected seconds >= 0 (0 turns it off)")
    return v


@dataclass(frozen=True)
class StallOptions:
    """``warn``: seconds in one collective before the first report (0: never); ``shutdown``: seconds
    before the rank gives up (0: never); ``warn_var``/``shutdown_var``: the variables they came from."""

    warn: float = 60.0
    shutdown: float = 0.0
    warn_var: str = "RINGLET_STALL_WARN_S"
    shutdown_var: str = "RINGLET_STALL_SHUTDOWN_S"

    @property
    def active(self) -> bool:
        return self.warn > 0 or self.shutdown > 0

    @classmethod
    def from_env(cls, environ=None, horovod: bool = False) -> "StallOptions":
        """``RINGLET_STALL_WARN_S`` and ``RINGLET_STALL_SHUTDOWN_S``; with ``horovod`` (``ringlet.torch``),
        Horovod's variables fill the ones not given (``HOROVOD_STALL_CHECK_DISABLE`` turns both off)."""
        env = os.environ if environ is None else environ
        warn, shut = _seconds(env, "RINGLET_STALL_WARN_S"), _seconds(env, "RINGLET_STALL_SHUTDOWN_S")
        warn_var, shut_var = "RINGLET_STALL_WARN_S", "RINGLET_STALL_SHUTDOWN_S"
        if horovod:
            off = env.get("HOROVOD_STALL_CHECK_DISABLE", "").strip().lower() in _TRUE
            if warn is None:
                warn_var = "HOROVOD_STALL_CHECK_DISABLE" if off else "HOROVOD_STALL_CHECK_TIME_SECONDS"
                warn = 0.0 if off else _seconds(env, "HOROVOD_STALL_CHECK_TIME_SECONDS")
            if shut is None:
                shut_var = "HOROVOD_STALL_CHECK_DISABLE" if off else "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
                shut = 0.0 if off else _seconds(env, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
        return cls(60.0 if warn is None else warn, 0.0 if shut is None else shut, warn_var, shut_var)


# ---- what this rank is doing now -------------------------------------------------------------------
def _op(rec, t: float | None) -> list:
    """``[group, seq, kind, shape, dtype, site, t]`` of a flight record (``t``: wall clock)."""
    dt = "" if rec.dtype is None else str(rec.dtype).replace("torch.", "")
    site = "" if rec.site is None else f"{os.path.basename(rec.site[0])}:{rec.site[1]}"
    return [rec.group, rec.seq, rec.kind, list(rec.shape), dt, site, t]


def running_record(records) -> Any:
    """The running record among ``records`` (a flight recorder's, oldest first), else None. Ops run in
    submission order, so the search stops at the newest record that has finished."""
    for rec in reversed(records):
        if rec.state == "running":
            return rec
        if rec.state != "queued":
            return None
    return None


def now_state(recorder, seqs: dict, started: float) -> dict:
    """What this rank is doing now, as a JSON-ready dict: ``seq`` (group id -> last started sequence
    number, ``seqs`` as :meth:`ringlet.runtime.Runtime.last_started` gives it), ``in`` (the running
    collective, :func:`_op` with its start) or ``out`` (outside any since then, wall clock; ``started``
    when it made none) and ``last`` (the newest finished collective, with its end)."""
    offset = time.time() - time.monotonic()
    recs = recorder.recent(RECENT) if recorder is not None and recorder.enabled else []
    state: dict = {"seq": {str(g): n for g, n in seqs.items()}, "in": None, "out": None, "last": None}
    run = running_record(recs)
    if run is not None:
        state["in"] = _op(run, run.m_start + offset)
    for rec in reversed(recs):
        if rec.state in ("done", "failed") and rec.m_end is not None:
            state["last"] = _op(rec, rec.m_end + offset)
            break
    if run is None:
        state["out"] = state["last"][6] if state["last"] is not None else started
    return state


# ---- words -----------------------------------------------------------------------------------------
def _a(kind: str) -> str:
    n = _NOUN.get(kind, kind)
    return ("an " if n[:1] in "aeiou" else "a ") + n


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks[:-1]) + f" and {ranks[-1]}"


def _secs(x: float) -> str:
    return f"{x:.0f} s" if abs(x) >= 10 else f"{x:.1f} s"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + " UTC"


def describe_op(op: list, groups: dict) -> str:
    """``an all-reduce on the world group seq 3 (shape [4], float32, train.py:12)``; ``groups``: group
    id -> member ranks."""
    gid, seq, kind, shape, dtype, site, _ = op
    where = "the world group" if gid == 0 else f"group {gid} (ranks {list(groups.get(gid, ()))})"
    detail = ", ".join(x for x in (f"shape {shape}" if dtype else "", dtype, site) if x)
    return f"{_a(kind)} on {where} seq {seq}" + (f" ({detail})" if detail else "")


def doing(entry: dict | None, now: float, groups: dict) -> str:
    """What a peer's published ``entry`` says it does, as a clause: ``is in ... since ...`` or ``is
    outside any collective since ...``."""
    if entry is None:
        return "has published no state yet (still starting, or not connected to the job's store)"
    if entry.get("in"):
        op = entry["in"]
        return f"is in {describe_op(op, groups)} since {_clock(op[6])} (for {_secs(now - op[6])})"
    since = entry.get("out") or now
    text = f"is outside any collective since {_clock(since)} (for {_secs(now - since)})"
    if entry.get("last"):
        text += f"; its last was {describe_op(entry['last'], groups)}"
    return text


def missing_ranks(gid: int, seq: int, peers: dict) -> list[int]:
    """The ranks of ``peers`` (rank -> published entry or None) whose last started sequence number on
    group ``gid`` is below ``seq``: they have not arrived in the collective."""
    out = []
    for r, entry in sorted(peers.items()):
        last = -1 if entry is None else entry.get("seq", {}).get(str(gid), -1)
        if last < seq:
            out.append(r)
    return out


def report(rank: int, op: list, waited: float, peers: dict | None, groups: dict, now: float) -> tuple[str, list]:
    """The warning of rank ``rank``, in collective ``op`` for ``waited`` seconds, given its peers'
    entries (``None``: no store to read them from); returns ``(text, missing ranks)``."""
    head = (f"ringlet stall: rank {rank} has waited {_secs(waited)} in {describe_op(op, groups)}, "
            f"started {_clock(op[6])}")
    if peers is None:
        return (head + "; which ranks have not arrived is unknown: this job has no store to share the "
                       "ranks' state (no liveness monitor)"), []
    missing = missing_ranks(op[0], op[1], peers)
    if not missing:
        return (head + "; every other member has started it, so it is still running (a slow link, or a "
                       "peer blocked inside it)"), []
    if len(missing) == 1:
        return f"{head}; rank {missing[0]} has not arrived: it {doing(peers[missing[0]], now, groups)}", missing
    verb = "have"
    parts = [f"rank {r} {doing(peers[r], now, groups)}" for r in missing[:MAX_NAMED]]
    if len(missing) > MAX_NAMED:
        parts.append(f"and {_ranks(missing[MAX_NAMED:])}")
    return f"{head}; {_ranks(missing)} {verb} not arrived: " + "; ".join(parts), missing


def _decode(raw) -> dict | None:
    if raw is None:
        return None
    try:
        d = json.loads(raw)
    except (ValueError, TypeError):
        return None
    return d if isinstance(d, dict) else None


# ---- the inspector ---------------------------------------------------------------------------------
class Inspector:
    """The stall inspector of runtime ``rt`` (see the module docstring). :meth:`tick` does its work:
    the liveness monitor calls it every heartbeat with a store view, else :meth:`start_thread` runs it."""

    def __init__(self, rt, options: StallOptions | None = None, clock=time.monotonic) -> None:
        self.rt = rt
        self.options = options if options is not None else StallOptions.from_env()
        self.clock = clock
        self.started = time.time()
        self.reports: list[str] = []  # the texts logged, newest last (the last few)
        self._rec = None  # (running record, options) the back-off belongs to
        self._next = 0.0  # seconds of waiting at which the next report is due
        self._gave_up = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def groups(self) -> dict:
        return {g.id: g.ranks for g in list(self.rt.groups)}

    def state(self) -> dict:
        return now_state(self.rt.recorder, self.rt.last_started(), self.started)

    def tick(self, view=None) -> None:
        """Publish this rank's state through ``view`` (a store view; None: no store), then check its
        running collective."""
        state = self.state()
        if view is not None:
            view.publish(ENTRY, json.dumps(state, separators=(",", ":")))
        self.check(view)

    def check(self, view=None) -> None:
        """Report (or give up on) the running collective when its wait passed the limits."""
        opts = self.options
        if not opts.active:
            return
        rec = running_record(self.rt.recorder.recent(RECENT)) if self.rt.recorder.enabled else None
        if rec is None or rec.m_start is None:
            self._rec = None
            return
        key = (rec.group, rec.seq, rec.m_start, opts)
        if self._rec != key:  # a new collective, or new limits: the back-off starts over
            self._rec, self._next, self._gave_up = key, opts.warn, False
        waited = self.clock() - rec.m_start
        due_warn = opts.warn > 0 and waited >= self._next
        due_stop = opts.shutdown > 0 and waited >= opts.shutdown and not self._gave_up
        if not (due_warn or due_stop):
            return
        op = _op(rec, time.time() - waited)
        peers = None
        if view is not None:
            others = [r for r in rec.ranks if r != self.rt.rank]
            peers = {r: _decode(raw) for r, raw in view.read(ENTRY, others).items()}
        text, missing = report(self.rt.rank, op, waited, peers, self.groups(), time.time())
        while opts.warn > 0 and self._next <= waited:
            self._next *= 2
        if due_stop:
            self._give_up(text, missing)
        else:
            self._log(f"{text}. Next report at {_secs(self._next)} ({opts.warn_var}={opts.warn:g})")

    def _log(self, text: str, level: int = logging.WARNING) -> None:
        self.reports = self.reports[-7:] + [text]
        log.log(level, "%s", text)

    def _give_up(self, text: str, missing: list) -> None:
        opts = self.options
        self._gave_up = True
        msg = f"{text}. Giving up after {opts.shutdown:g} s ({opts.shutdown_var}): its pending collectives fail"
        self._log(msg, logging.ERROR)
        host = None
        if missing:
            names = getattr(self.rt, "hostnames", ())
            host = names[missing[0]] if missing[0] < len(names) else None
        self.rt.transport.abort(StallError(msg, rank=missing[0] if missing else None, host=host,
                                           missing=tuple(missing)))

    # ---- without a liveness monitor ----------------------------------------------------------------
    def start_thread(self, period: float = OWN_PERIOD) -> None:
        """Tick every ``period`` seconds on a daemon thread of its own (no store: the rank cannot name
        the others); a second call does nothing."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(period,), name="ringlet-stall", daemon=True)
        self._thread.start()

    def _loop(self, period: float) -> None:
        while not self._stop.wait(period):
            try:
                self.tick(None)
            except Exception as exc:  # noqa: BLE001 - the inspector must never take the rank down
                log.debug("ringlet stall: the check failed: %s", exc)

    def stop(self) -> None:
        """Stop the inspector's own thread, if it runs (a monitor's task ends with the monitor)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=OWN_PERIOD + 5.0)
        self._thread = None


def start(rt, options: StallOptions | None = None) -> Inspector | None:
    """The inspector of ``rt`` (None for a world of one): a task of ``rt.monitor`` when the job has one,
    else its own thread while it is active. A bad setting raises ``ValueError`` before anything starts."""
    opts = options if options is not None else StallOptions.from_env()
    if rt.size <= 1:
        return None
    insp = Inspector(rt, opts)
    if rt.monitor is not None:
        rt.monitor.add_task(insp.tick)
    elif opts.active:
        insp.start_thread()
    return insp


def use_horovod_env(rt, options: StallOptions | None = None) -> None:
    """Give ``rt``'s inspector ``options`` (default: :meth:`StallOptions.from_env` with Horovod's
    variables where the ``RINGLET_`` ones are not given; ``ringlet.torch``'s ``init``); nothing when
    ``rt`` has no inspector."""
    opts = options if options is not None else StallOptions.from_env(horovod=True)
    insp = getattr(rt, "stall", None)
    if insp is None:
        return
    insp.options = opts
    if rt.monitor is None and insp.options.active:
        insp.start_thread()
