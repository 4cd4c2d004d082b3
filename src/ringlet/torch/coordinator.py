"""The name-matched coordinator: a background thread that agrees, in cycles, which ops to run.

Each cycle every rank contributes one message — its newly submitted requests (full records, or
5-byte references to the response cache once a name repeats) and a shutting-down flag —
through ONE all-gather over the world. Every rank then holds the same table of pending names and
computes the same ready list without a central decision: a name is ready once every member of its
process set has announced it (joined ranks count as present for all-reduce, contributing zeros).
Ready requests are validated (a mismatch fails that name on every rank; nothing moves), then
executed in the same order everywhere; ready all-reduces are fused.

Liveness: nothing is ever executed by rank order of submission, so ranks submitting names in
different orders cannot deadlock. A dead peer or transport timeout fails every pending handle with
``HorovodInternalError``; a rank that shuts down stops every coordinator after that round.
After 0.1 s without news (nothing new announced, nothing ready) rounds back off exponentially up to
``RINGLET_CYCLE_IDLE_MAX_MS`` (20 ms); a local submission wakes the thread at once (the peers follow
within their back-off), so an idle job, or one waiting for a straggler, does not burn a core.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import time

import torch

from ringlet import timeline
from ringlet.engine.agree import exchange

from .errors import HorovodInternalError
from .execute import Runner
from .requests import (ADD_PS, ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, F_SHUTDOWN, JOIN,
                       KIND_NAMES, MESSAGE_OVERHEAD, REDUCESCATTER, REMOVE_PS, Cache, Meta, Request,
                       decode_message, encode_message, entry_bytes)
from ringlet.engine.meta import mismatch as check

log = logging.getLogger("ringlet.torch")

_MIN_SLOT, _MAX_SLOT = 1024, 16 << 20
_IDLE_SECONDS_BEFORE_BACKOFF = 0.1  # a training step's forward pass should not pay the wake-up latency


def _env_float(name: str, default: float) -> float:
    v = os.environ.get(name)
    return float(v) if v not in (None, "") else default


class _Entry:
    """A name announced by at least one rank and not yet executed (same on every rank)."""

    __slots__ = ("metas", "wires", "first", "warned")

    def __init__(self) -> None:
        self.metas: dict[int, Meta] = {}
        self.wires: dict[int, bytes] = {}
        self.first = time.monotonic()
        self.warned = 0.0


class Coordinator:
    def __init__(self, ctx):
        self.ctx = ctx
        self.rt = ctx.rt
        self.cycle = _env_float("HOROVOD_CYCLE_TIME", 1.0) / 1000.0
        self.idle_max = max(self.cycle, _env_float("RINGLET_CYCLE_IDLE_MAX_MS", 20.0) / 1000.0)
        self.stall = _env_float("HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0)
        if os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "").strip() in ("1", "true", "True"):
            self.stall = 0.0
        self.runner = Runner(self.rt, int(_env_float("HOROVOD_FUSION_THRESHOLD", float(128 << 20))))
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._outbox: collections.deque[Request] = collections.deque()
        self._mine: dict[tuple[int, str], Request] = {}
        self._pending: dict[tuple[int, str], _Entry] = {}
        self._cache = Cache()
        self._slot = _MIN_SLOT
        self._spill = False
        self._idle = 0
        self._idle_since = time.monotonic()
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._last_round = 0.0

    # ---- submission (any thread) ------------------------------------------------------------------
    def start(self) -> None:
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
                    self._outbox.append(r)
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

    # ---- the loop ---------------------------------------------------------------------------------
    def _sleep(self) -> None:
        if self._spill or self._stop:
            return
        if self.ctx.world.size == 1:
            # Nobody to negotiate with: a round is only needed when something was submitted (or stop).
            self._wake.wait()
            return
        if self._idle == 0 or time.monotonic() - self._idle_since < _IDLE_SECONDS_BEFORE_BACKOFF:
            delay = self.cycle - (time.monotonic() - self._last_round)
            if delay > 0:
                time.sleep(delay)
            return
        self._wake.wait(min(self.idle_max, self.cycle * (2 ** min(20, self._idle))))

    def _loop(self) -> None:
        # Requests may hold tensors that require grad (hvd.broadcast_(param, 0)): the thread's copies and
        # in-place reductions must not be recorded by autograd.
        torch.set_grad_enabled(False)
        try:
            while True:
                self._sleep()
                self._wake.clear()
                self._last_round = time.monotonic()
                if self._round():
                    break
        except BaseException as exc:  # noqa: BLE001 - every failure ends up in the pending handles
            err = exc if isinstance(exc, HorovodInternalError) else HorovodInternalError(
                f"ringlet.torch coordinator failed on rank {self.rt.rank}: {type(exc).__name__}: {exc}")
            if err is not exc:
                err.__cause__ = exc
            self._die(err)
            return
        self._die(HorovodInternalError(
            "ringlet.torch has been shut down (this or another rank called shutdown()); this operation "
            "cannot complete. Call hvd.init() again to start over."))

    def _die(self, err: BaseException) -> None:
        with self._lock:
            self._error = err
            reqs = list(self._mine.values())
            self._mine.clear()
            self._outbox.clear()
        for r in reqs:
            self.ctx.handles.complete(r.handle, r.part, error=err)

    # ---- one round --------------------------------------------------------------------------------
    def _take_outbox(self) -> tuple[list[bytes], int]:
        room = self._slot - MESSAGE_OVERHEAD
        entries: list[bytes] = []
        waiting = 0
        with self._lock:
            while self._outbox:
                e = entry_bytes(self._outbox[0], self._cache)
                if len(e) > room:
                    waiting = sum(len(entry_bytes(r, self._cache)) for r in self._outbox)
                    break
                room -= len(e)
                entries.append(e)
                self._outbox.popleft()
        return entries, waiting

    def _exchange(self, payload: bytes) -> list[bytes]:
        return exchange(self.rt.channel(self.ctx.world, self.runner.workspace), payload, self._slot)

    def _round(self) -> bool:
        """One negotiation round plus execution of what became ready. Returns True to stop."""
        entries, waiting = self._take_outbox()
        flags = F_SHUTDOWN if self._stop else 0
        msgs = self._exchange(encode_message(flags, entries, waiting))
        shutdown_by = []
        new = 0
        max_waiting = 0
        for r, raw in enumerate(msgs):
            fl, items, w = decode_message(raw, self._cache)
            max_waiting = max(max_waiting, w)
            if fl & F_SHUTDOWN:
                shutdown_by.append(r)
            for meta, wire in items:
                e = self._pending.get((meta.ps_id, meta.name))
                if e is None:
                    e = self._pending[(meta.ps_id, meta.name)] = _Entry()
                e.metas[r] = meta
                e.wires[r] = wire
                new += 1
        self._spill = max_waiting > 0
        self._slot = min(_MAX_SLOT, max(_MIN_SLOT, 1 << (max_waiting + MESSAGE_OVERHEAD).bit_length()))
        tl = timeline.active()
        if tl is not None and tl.mark_cycles:
            tl.cycle({"new": new, "pending": len(self._pending)})
        ready = self._ready()
        if ready:
            self._execute(ready)
        if new or ready or self._spill:
            self._idle = 0
        else:
            if self._idle == 0:
                self._idle_since = time.monotonic()
            self._idle += 1
        if self.stall > 0 and self.rt.rank == 0:
            self._stall_check()
        return bool(shutdown_by)

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

    def _execute(self, ready) -> None:
        now = timeline.now_us()
        buckets: dict[tuple, list] = {}
        others = []
        for key, e, err in ready:
            req = self._local(key)
            if req is not None:
                req.ready_us = now
                tl = timeline.active()
                if tl is not None:
                    tl.span(req.meta.name, "NEGOTIATE", req.submit_us, now)
            if err is not None:
                self._finish(key, error=HorovodInternalError(err))
                continue
            wires = set(e.wires.values())
            if len(wires) == 1:
                self._cache.record(next(iter(e.metas.values())), wires.pop())
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

    # ---- stall warning ----------------------------------------------------------------------------
    def _stall_check(self) -> None:
        now = time.monotonic()
        joined = self._joined()
        lines = []
        for (ps_id, name), e in self._pending.items():
            if now - e.first < self.stall or (e.warned and now - e.warned < self.stall):
                continue
            try:
                ranks = self.ctx.process_sets.group(ps_id).ranks
            except ValueError:
                continue
            missing = [r for r in ranks if r not in e.metas and r not in joined]
            if missing:
                e.warned = now
                lines.append(f"{name} (process set {ps_id}): missing ranks {missing}, "
                             f"submitted by ranks {sorted(e.metas)}")
        if lines:
            log.warning("Stall: %d op(s) were submitted by some ranks but not by others for more than %.0f s. "
                        "This may mean ranks submit different names, or only some ranks submit them "
                        "(which deadlocks):\n  %s", len(lines), self.stall, "\n  ".join(lines))
