"""The name-matched coordinator: a background thread that agrees, in rounds, which ops to run.

Negotiation. Every rank keeps the same response cache (:class:`~.requests.Cache`): a name agreed with
one identical record everywhere gets a position there, the same on every rank. Each round starts with
ONE small collective, the AND over the ranks of a bit vector (:mod:`.negotiation`; packed, one
all-gather step): bit 0 "I want no
full round", bit 1 "my execution queue accepts a batch", then one bit per cache position, "I have
submitted this cached name" (members of other process sets set it for them). A cached name whose bit
survives the AND is ready: its record is already known and validated, nothing else is exchanged, so
steady-state training costs one small all-reduce per round. Only when some rank has a name that is not
cached with the same record (new, or its shape changed), a join, a shutdown or an error to announce,
the round goes on with a full all-gather of every rank's message (full records, or 5-byte cache
references) into a table of pending names that every rank holds identically. A name is ready from the
table once every member of its process set has announced it (joined ranks count as present for
all-reduce, contributing zeros); it is then validated (a mismatch fails that name on every rank;
nothing moves). Once a name is in the table, ranks still holding it as a bit move it there too, so a
name is never split between the two paths; while a rank has joined, every round is a full one.

Execution. Ready ops are collected in agreement order and handed, as one batch, to the execution
thread (:mod:`.exec_queue`) once every rank's queue accepts one (at most one batch waits behind the
running one, so what becomes ready meanwhile is fused into the next batch); ready all-reduces are
fused up to ``HOROVOD_FUSION_THRESHOLD``. Negotiation goes on while the batch runs, on a group of its
own (separate tags). Process set changes wait for the queue to drain.

Liveness: nothing is ever executed by rank order of submission, so ranks submitting names in
different orders cannot deadlock. A dead peer or transport timeout fails every pending handle with
``HorovodInternalError``; a failure on the execution thread is announced in the next round and stops
every rank's coordinator; a rank that shuts down stops every coordinator after that round, once the
agreed batches have run. After 0.1 s without news (nothing new announced, nothing ready) rounds back
off exponentially up to ``RINGLET_CYCLE_IDLE_MAX_MS`` (20 ms). A rank with nothing submitted and not yet
agreed, and nothing of other ranks pending in the table or in process sets without it, starts no
round at all until its next submission wakes it (at most that long): the peers wait for it inside their
round, which no round could have completed anyway. So an idle job, one waiting for a straggler, or one
whose only work is a running collective does not burn a core. A name waiting as a bit for more than
half of ``HOROVOD_STALL_CHECK_TIME_SECONDS`` moves to the table, where the stall warning sees it.
``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (0: off): a name in the table that misses ranks for longer stops
every rank's coordinator, failing its pending handles with ``HorovodInternalError`` naming the name.
``HOROVOD_CACHE_CAPACITY`` (4096) bounds the cache; 0 turns it off (every round is a full one).
"""
from __future__ import annotations

import collections
import os
import threading
import time

import numpy as np
import torch

from ringlet import timeline

from .errors import HorovodInternalError
from .cachebits import CachedRequests
from .exec_queue import ExecQueue
from .execute import Runner
from .negotiation import Exchange
from .requests import (ADD_PS, ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BIT_ACCEPT, BIT_FIRST_POS, BIT_QUIET,
                       BROADCAST, CACHEABLE, F_ERROR, F_SHUTDOWN, JOIN, KIND_NAMES, MESSAGE_OVERHEAD,
                       REDUCESCATTER, REMOVE_PS, Meta, Request, decode_message, encode_message,
                       entry_bytes)
from .requests import Entry as _Entry
from .stall import stall_check, stalled_beyond
from ringlet.engine.meta import mismatch as check


_MIN_SLOT, _MAX_SLOT = 1024, 16 << 20
_FULL_CAUSES = ("new", "spill", "stop", "error", "join")  # why a rank asks for a full round (stats)
_IDLE_SECONDS_BEFORE_BACKOFF = 0.1  # a training step's forward pass should not pay the wake-up latency


def _env_float(name: str, default: float) -> float:
    v = os.environ.get(name)
    return float(v) if v not in (None, "") else default


class Coordinator:
    def __init__(self, ctx):
        self.ctx = ctx
        self.rt = ctx.rt
        self.cycle = _env_float("HOROVOD_CYCLE_TIME", 1.0) / 1000.0
        self.idle_max = max(self.cycle, _env_float("RINGLET_CYCLE_IDLE_MAX_MS", 20.0) / 1000.0)
        self.stall = _env_float("HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0)
        if os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "").strip() in ("1", "true", "True"):
            self.stall = 0.0
        self.stall_shutdown = _env_float("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0.0)  # 0: wait forever
        self.runner = Runner(self.rt, int(_env_float("HOROVOD_FUSION_THRESHOLD", float(128 << 20))))
        # Negotiation rounds get a group (and so a tag sequence) of their own: they run while the
        # execution thread's collectives use the process sets' groups.
        self.exchange = Exchange(self.rt, self.rt.new_group(range(self.rt.size)))
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._exec = ExecQueue(self._exec_moved)
        self._inbox: collections.deque[Request] = collections.deque()  # submitted, not seen by the thread
        self._mine: dict[tuple[int, str], Request] = {}  # every local request not completed yet
        # Owned by the coordinator thread:
        self._outbox: collections.deque[Request] = collections.deque()  # to announce in a full round
        self._cached = CachedRequests(self.rt.rank, ctx.process_sets,  # response cache, requests as bits
                                      int(_env_float("HOROVOD_CACHE_CAPACITY", 4096.0)))
        self._pending: dict[tuple[int, str], _Entry] = {}
        self._held: list = []  # agreed, waiting for every execution queue to accept a batch
        self._slot = _MIN_SLOT
        self._spill = False
        self._idle = 0
        self._idle_since = time.monotonic()
        self._stop = False
        self._failed: BaseException | None = None  # this rank's execution failure, announced to the peers
        self._peer_failed = False
        self._error: BaseException | None = None
        self._stopped_error = HorovodInternalError(
            "ringlet.torch has been shut down (this or another rank called shutdown()); this operation "
            "cannot complete. Call hvd.init() again to start over.")
        self._thread: threading.Thread | None = None
        self._last_round = 0.0
        # Rounds and ops by path, and the full rounds this rank asked for by cause (``asked.new``: a
        # request to announce, ``.spill``, ``.stop``, ``.error``, ``.join``). Every key exists from the
        # start, so other threads may copy the counter while this thread counts.
        self.stats = collections.Counter({k: 0 for k in (
            "bit_rounds", "full_rounds", "cached_ops", *(f"asked.{c}" for c in _FULL_CAUSES))})

    # ---- submission (any thread) ------------------------------------------------------------------
    def start(self) -> None:
        self._exec.start()
        self._thread = threading.Thread(target=self._loop, name="ringlet-coordinator", daemon=True)
        self._thread.start()

    def submit(self, reqs: list[Request]) -> None:
        """Queue requests for the next round. A name already pending on this rank raises ValueError."""
        now = timeline.now_us()
        with self._lock:
            seen = set()
            for r in reqs:
                key = (r.meta.ps_id, r.meta.name)
                if key in self._mine or key in seen:
                    raise ValueError(f"Duplicate name {r.meta.name!r}: an operation with this name is already "
                                     "pending on this rank; wait for it (synchronize) or use another name.")
                seen.add(key)
            err = self._error
            if err is None:
                for r in reqs:
                    r.submit_us = now
                    r.wire = r.meta.encode()
                    self._mine[(r.meta.ps_id, r.meta.name)] = r
                    self._inbox.append(r)
        if err is not None:
            for r in reqs:
                self.ctx.handles.complete(r.handle, r.part, error=err)
            return
        self._wake.set()

    def stop(self) -> None:
        """Announce shutdown to the peers and wait for the thread to finish its last round."""
        self._stop = True
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=60.0)
        self._exec.close(timeout=5.0, drop=True)  # the coordinator has drained it unless a rank failed

    # ---- the loop ---------------------------------------------------------------------------------
    def _exec_moved(self) -> None:
        # Execution thread: its queue moved or it failed. A round is due only to hand over held ops or
        # to announce the failure (a stale read of _held is caught by _sleep, which sees the queue empty).
        if self._held or self._exec.error is not None:
            self._wake.set()

    def _sleep(self) -> None:
        if self._spill or self._stop or self._exec.error is not None:
            return
        if self.ctx.world.size == 1:
            # Nobody to negotiate with: a round is only needed when something was submitted (or stop),
            # or when held ops can be handed over. The execution thread's wake may read _held stale,
            # so while ops are held the wait is bounded.
            if self._held and not self._exec.waiting():
                return
            self._wake.wait(self.idle_max if self._held else None)
            return
        if (self._held and self._exec.waiting()) or self._quiet():
            # Nothing can be handed over before our queue moves / no round can agree anything before
            # this rank submits (which wakes it): the peers wait for us in the round.
            self._wake.wait(self.idle_max)
            return
        if self._idle == 0 or time.monotonic() - self._idle_since < _IDLE_SECONDS_BEFORE_BACKOFF:
            delay = self.cycle - (time.monotonic() - self._last_round)
            if delay > 0:
                time.sleep(delay)
            return
        self._wake.wait(min(self.idle_max, self.cycle * (2 ** min(20, self._idle))))

    def _quiet(self) -> bool:
        """True when this rank has nothing submitted and not agreed, and nothing of other ranks is pending
        in the table or in process sets without this rank (whose ops need its rounds all the same)."""
        return not (self._inbox or self._outbox or self._cached.waiting or self._held or self._pending
                    or self._cached.foreign)

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        try:
            while True:
                self._sleep()
                self._wake.clear()
                self._last_round = time.monotonic()
                if self._exec.error is not None and self._failed is None:
                    self._failed = self._exec_failure()
                if self._round():
                    break
        except BaseException as exc:  # noqa: BLE001 - every failure ends up in the pending handles
            err = exc if isinstance(exc, HorovodInternalError) else HorovodInternalError(
                f"ringlet.torch coordinator failed on rank {self.rt.rank}: {type(exc).__name__}: {exc}")
            if err is not exc:
                err.__cause__ = exc
            self._exec.close(timeout=0, drop=True)
            self._die(self._failed or err)
            return
        if self._failed is None and not self._peer_failed:
            self._exec.close(timeout=None)  # a clean shutdown drains what every rank agreed
        else:
            self._exec.close(timeout=0, drop=True)  # a collective of the queue may wait for the failed rank
        if self._exec.error is not None and self._failed is None:
            self._failed = self._exec_failure()
        self._die(self._failed or self._stopped_error)

    def _exec_failure(self) -> BaseException:
        exc = self._exec.error
        if isinstance(exc, HorovodInternalError):
            return exc
        err = HorovodInternalError(f"ringlet.torch: an operation failed on rank {self.rt.rank}: "
                                   f"{type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err

    def _die(self, err: BaseException) -> None:
        with self._lock:
            self._error = err
            reqs = list(self._mine.values())
            self._mine.clear()
            self._inbox.clear()
        self._outbox.clear()
        self._cached.waiting.clear()
        for r in reqs:
            self.ctx.handles.complete(r.handle, r.part, error=err)

    # ---- one round --------------------------------------------------------------------------------
    def _admit(self) -> None:
        """Place new submissions: cached with the same record and not in the table -> a bit, else -> a
        full record. While a rank has joined, and for bits waiting longer than half the stall time,
        everything goes the full way."""
        with self._lock:
            reqs = list(self._inbox)
            self._inbox.clear()
        full_only = bool(self._joined())
        now = time.monotonic()
        for r in reqs:
            if (full_only or r.meta.kind not in CACHEABLE or (r.meta.ps_id, r.meta.name) in self._pending
                    or not self._cached.place(r, now)):
                self._outbox.append(r)
        limit = self.stall / 2 if self.stall > 0 else float("inf")
        if self._cached.waiting:
            self._outbox.extend(self._cached.take_if(lambda r, t: full_only or now - t > limit))

    def _round(self) -> bool:
        """One negotiation round; agreed ops go to the execution thread. Returns True to stop."""
        self._admit()
        causes = [c for c, on in zip(_FULL_CAUSES, (self._outbox, self._spill, self._stop,
                                                     self._failed is not None, self._joined())) if on]
        want_full = bool(causes)
        for c in causes:
            self.stats[f"asked.{c}"] += 1
        agreed = self.exchange.and_bits(self._cached.vector(not want_full, self._exec.waiting() == 0))
        full, accept = not agreed[BIT_QUIET], bool(agreed[BIT_ACCEPT])
        ready = self._cached.agreed(np.flatnonzero(agreed[BIT_FIRST_POS:]))
        self.stats["cached_ops"] += len(ready)
        stop, new = False, 0
        if full:
            self.stats["full_rounds"] += 1
            stop, new = self._full_round()
            ready += self._ready()
            # Names others announced in full: follow them there, or they never complete.
            self._outbox.extend(self._cached.take_if(lambda r, t: (r.meta.ps_id, r.meta.name) in self._pending))
        else:
            self.stats["bit_rounds"] += 1
        tl = timeline.active()
        if tl is not None and tl.mark_cycles:
            tl.cycle({"new": new, "pending": len(self._pending), "ready": len(ready), "full": int(full)})
        self._decide(ready)
        if self._held and (accept or stop):
            self._dispatch()
        if new or ready or self._spill or (self._held and not self._exec.waiting()):
            self._idle = 0
        else:
            if self._idle == 0:
                self._idle_since = time.monotonic()
            self._idle += 1
        if self.stall > 0 and self.rt.rank == 0:
            stall_check(self._pending, self.ctx.process_sets, self._joined(), self.stall)
        if self.stall_shutdown > 0 and self._failed is None:
            msg = stalled_beyond(self._pending, self.ctx.process_sets, self._joined(), self.stall_shutdown)
            self._failed = HorovodInternalError(msg) if msg else None  # announced in the next round
        return stop

    def _take_outbox(self) -> tuple[list[bytes], int]:
        room = self._slot - MESSAGE_OVERHEAD
        entries: list[bytes] = []
        waiting = 0
        while self._outbox:
            e = entry_bytes(self._outbox[0], self._cached.cache)
            if len(e) > room:
                waiting = sum(len(entry_bytes(r, self._cached.cache)) for r in self._outbox)
                break
            room -= len(e)
            entries.append(e)
            self._outbox.popleft()
        return entries, waiting

    def _full_round(self) -> tuple[bool, int]:
        """All-gather every rank's message into the table. Returns (a rank stops, entries announced)."""
        entries, waiting = self._take_outbox()
        flags = (F_SHUTDOWN if self._stop or self._failed is not None else 0) | (
            F_ERROR if self._failed is not None else 0)
        msgs = self.exchange.allgather(encode_message(flags, entries, waiting), self._slot)
        stop_by, failed_by = [], []
        new = 0
        max_waiting = 0
        for r, raw in enumerate(msgs):
            fl, items, w = decode_message(raw, self._cached.cache)
            max_waiting = max(max_waiting, w)
            if fl & F_SHUTDOWN:
                stop_by.append(r)
            if fl & F_ERROR:
                failed_by.append(r)
            for meta, wire in items:
                e = self._pending.get((meta.ps_id, meta.name))
                if e is None:
                    e = self._pending[(meta.ps_id, meta.name)] = _Entry()
                e.metas[r] = meta
                e.wires[r] = wire
                new += 1
        self._spill = max_waiting > 0
        self._slot = min(_MAX_SLOT, max(_MIN_SLOT, 1 << (max_waiting + MESSAGE_OVERHEAD).bit_length()))
        if failed_by:
            self._peer_failed = True
            self._stopped_error = HorovodInternalError(
                f"ringlet.torch stopped: an operation failed on rank(s) {failed_by}; this operation cannot "
                "complete. Call hvd.init() again to start over.")
        return bool(stop_by), new

    def joined(self) -> set[int]:
        """The ranks whose join has been announced and not yet completed (read from any thread: a table
        changed meanwhile reads as empty, and the caller asks again)."""
        try:
            return set(self._joined())
        except RuntimeError:  # the coordinator thread changed the table while it was read
            return set()

    def _joined(self) -> set[int]:
        # A rank has joined while its "join" request is pending: the table itself carries the state.
        e = self._pending.get((0, "join"))
        return set(e.metas) if e is not None else set()

    def _ready(self) -> list[tuple[tuple[int, str], _Entry, str | None]]:
        """Entries every member has announced, in table order, with an error message or None."""
        joined = self._joined()
        out = []
        for key, e in self._pending.items():
            ps_id, name = key
            kind = next(iter(e.metas.values())).kind
            try:
                g = self.ctx.process_sets.group(ps_id)
            except ValueError as exc:
                out.append((key, e, str(exc)))
                continue
            missing = [r for r in g.ranks if r not in e.metas]
            if kind == JOIN:
                if not missing:
                    out.append((key, e, None))
                continue
            if missing and not all(r in joined for r in missing):
                continue
            if missing and kind != ALLREDUCE:
                out.append((key, e, f"{KIND_NAMES[kind]} {name!r} cannot run while ranks {missing} have joined "
                                    "(hvd.join): only allreduce supports joined ranks."))
                continue
            out.append((key, e, check(e.metas)))
        for key, _, _ in out:
            del self._pending[key]
        return out

    # ---- execution ---------------------------------------------------------------------------------
    def _local(self, key) -> Request | None:
        with self._lock:
            return self._mine.get(key)

    def _finish(self, key, result=None, error: BaseException | None = None) -> None:
        with self._lock:
            req = self._mine.pop(key, None)
        if req is not None:
            self.ctx.handles.complete(req.handle, req.part, result, error)

    def _decide(self, ready) -> None:
        """Stamp the agreed ops, cache records agreed identically everywhere, and hold them for the next
        batch (same order on every rank)."""
        now = timeline.now_us()
        tl = timeline.active()
        for key, e, err in ready:
            req = self._local(key)
            if req is not None:
                req.ready_us = now
                if tl is not None:
                    tl.span(req.meta.name, "NEGOTIATE", req.submit_us, now)
            meta = next(iter(e.metas.values()))
            wires = set(e.wires.values())
            if err is None and meta.kind in CACHEABLE and len(wires) == 1:
                displaced = self._cached.record(meta, wires.pop())
                if displaced is not None:
                    self._outbox.append(displaced)
            self._held.append((key, e, err))

    def _dispatch(self) -> None:
        """Hand the held ops to the execution thread as one batch; process set changes wait for it."""
        batch, self._held = self._held, []
        self._exec.put(lambda: self._execute(batch))
        if any(next(iter(e.metas.values())).kind in (ADD_PS, REMOVE_PS) for _, e, _ in batch):
            self._exec.drain()

    def _execute(self, ready) -> None:
        """Run one agreed batch (execution thread): errors, fused all-reduces, then the other ops."""
        buckets: dict[tuple, list] = {}
        others = []
        for key, e, err in ready:
            req = self._local(key)
            if err is not None:
                self._finish(key, error=HorovodInternalError(err))
                continue
            meta = e.metas[min(e.metas)]
            if meta.kind == ALLREDUCE:
                bk = (meta.ps_id, meta.dtype, meta.op, meta.pre, meta.post, meta.device)
                buckets.setdefault(bk, []).append((key, meta, req))
            else:
                others.append((key, e, meta, req))
        for bk, members in buckets.items():
            g = self.ctx.process_sets.group(bk[0])
            if self.rt.rank not in g:
                continue
            self._queue_spans([m[2] for m in members])
            outs = self.runner.allreduce(g, [(m[1], m[2]) for m in members])
            for (key, _, req), out in zip(members, outs):
                if req is not None:
                    self._finish(key, out)
        for key, e, meta, req in others:
            self._run_other(key, e, meta, req)

    @staticmethod
    def _queue_spans(reqs) -> None:
        tl = timeline.active()
        if tl is None:
            return
        now = timeline.now_us()
        for r in reqs:
            if r is not None:
                tl.span(r.meta.name, "QUEUE", r.ready_us, now)

    def _run_other(self, key, e: _Entry, meta: Meta, req: Request | None) -> None:
        kind = meta.kind
        if kind == JOIN:
            # (last rank to join, the largest handle counter announced: every rank resumes numbering there)
            counter = max((m.splits[0] for m in e.metas.values() if m.splits), default=0)
            self._finish(key, (list(e.metas)[-1], counter))
            return
        if kind == ADD_PS:
            self._finish(key, self.ctx.process_sets._register(tuple(meta.splits)))
            return
        if kind == REMOVE_PS:
            self.ctx.process_sets._unregister(int(meta.splits[0]))
            self._finish(key, True)
            return
        if kind == BARRIER or req is None:
            self._finish(key, None)  # negotiation itself was the barrier: every member has arrived
            return
        g = self.ctx.process_sets.group(meta.ps_id)
        self._queue_spans([req])
        t0 = timeline.now_us()
        if kind == ALLGATHER:
            out = self.runner.allgather(g, e.metas, req)
        elif kind == BROADCAST:
            out = self.runner.broadcast(g, meta, req)
        elif kind == ALLTOALL:
            out = self.runner.alltoall(g, e.metas, req)
        elif kind == REDUCESCATTER:
            out = self.runner.reducescatter(g, meta, req)
        else:
            raise HorovodInternalError(f"unknown op kind {kind}")
        tl = timeline.active()
        if tl is not None:
            tl.span(meta.name, "COMMUNICATE", t0, timeline.now_us())
        self._finish(key, out)
