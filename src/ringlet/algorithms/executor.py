"""The one executor: compiles a rank's share of a :class:`Schedule` into a pipelined action list and
runs it over any object with ``isend``/``irecv`` (the transport is duck-typed; no transport import).

Pipelining: every transfer is cut into segments. Receives of step ``s+1`` are posted while step ``s``
is being applied (each as soon as the scratch it lands in is free), and a send segment of step ``s+1``
goes out as soon as the received segments of step ``s`` it depends on are reduced, so the reduction of
one segment overlaps the transfer of the next (the ring's classic chunk pipelining, and a pipelined
tree for free). A step's segments from several peers are applied in turn, one from each, as they arrive
together over this rank's link: the next step's first sends wait for the first segment of each, not for
all of the first peer's. :mod:`ringlet.algorithms.plan_check` verifies the plans.

Sends leave in step order where that helps: when this rank sends in step ``s`` data that its receiver
sends on in step ``s+1`` (reduced or relayed), a send of step ``s+1`` to a peer that it did not send to
in step ``s`` and that itself receives in step ``s`` waits until step ``s`` is applied and its sends
have completed. That peer applies the message only after its own step ``s``, so released early it would
only share this rank's link with the older step's data that other peers are waiting for (docs/design.md:
halving-doubling's second step slowed its first). To the same peer the two already travel in order (the
ring); to a peer idle in step ``s`` the early message is what keeps a pipelined tree pipelined; data that
nobody sends on (an all-to-all) waits for no one. :mod:`.hold` states which sends are held; the cost
model and the simulator read the same answer.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from . import inplace
from .cache import SizeBoundedCache, memoise
from .hold import held_pairs
from .range_index import RangeIndex
from .schedule import Schedule, StepArrays, Transfer
from .scratch import scratch as _scratch

POST_RECV, POST_SEND, APPLY = 0, 1, 2

#: Sends leave in step order (see the module doc). False only for an A/B measurement
#: (``benchmarks/step_order/step_order.py``); both kinds of plan are cached apart.
HOLD_NEW_PEERS = True
#: A step's segments from several peers are applied in turn (see the module doc). False only for an A/B
#: measurement (``benchmarks/step_order/step_order.py --rule interleave``).
INTERLEAVE_PEERS = True


@dataclass(frozen=True, slots=True)
class Msg:
    peer: int
    step: int
    buf: int
    offset: int
    count: int
    is_send: bool
    reduce: bool
    direct: bool  # receive straight into the buffer (no scratch, no apply copy)
    scratch: int  # offset into scratch when not direct


@dataclass(frozen=True, slots=True)
class Plan:
    msgs: tuple[Msg, ...]
    actions: tuple[tuple, ...]
    tail_waits: tuple[int, ...]
    scratch_elems: int


@dataclass(frozen=True, slots=True)
class _Run:
    """One unsegmented message of this rank: its segments are msgs[first:first+nseg]."""

    buf: int
    offset: int
    count: int
    first: int
    nseg: int
    step: int

    def seg_range(self, buf: int, lo: int, hi: int, segment: int) -> range:
        """Ids of this run's segments that overlap ``[lo, hi)`` of ``buf``."""
        if buf != self.buf or lo >= self.offset + self.count or self.offset >= hi:
            return range(0)
        a = (max(lo, self.offset) - self.offset) // segment
        b = (min(hi, self.offset + self.count) - 1 - self.offset) // segment
        return range(self.first + a, self.first + b + 1)


#: Compiled plans: 128 MiB in all, none above 32 MiB. A plan is weighed with its schedule (its key
#: keeps the schedule alive) plus an estimate per message and action (slotted objects and tuples).
PLANS = SizeBoundedCache(128 << 20, max_item_bytes=32 << 20, max_entries=256)
_MSG_BYTES, _ACTION_BYTES = 160, 100


def _plan_weight(plan: "Plan", args: tuple) -> int:
    return args[0].nbytes() + _MSG_BYTES * len(plan.msgs) + _ACTION_BYTES * len(plan.actions)


@memoise(PLANS, _plan_weight)
def compile_plan(schedule: Schedule, rank: int, segment: int, hold: bool = True, interleave: bool = True) -> Plan:
    """Turn ``rank``'s transfers into actions. ``segment`` is the pipeline granularity in elements.

    The plan's messages are the transfers cut into segments; its actions post every receive up to one
    step ahead (once its scratch range is free), post each send segment as soon as
    the received segments it depends on are applied (with ``hold``, sends to a new peer busy with the
    older step wait for it: see the module doc), and wait for earlier sends whose range a receive
    or an apply would overwrite (see _PlanBuilder). The scratch is the largest step's non-direct
    receives, twice that when they fit in one segment. ``interleave``: a step's segments from several
    peers are applied in turn (see the module doc; False only for A/B runs).
    """
    return _PlanBuilder(schedule, rank, max(1, segment), hold, interleave).build()


def _select(st: StepArrays, rows: np.ndarray) -> list[Transfer]:
    """Transfers ``rows`` of a step, as :class:`Transfer` objects of Python ints."""
    cols = (st.src[rows].tolist(), st.dst[rows].tolist(), st.offset[rows].tolist(), st.count[rows].tolist(),
            st.reduce[rows].tolist(), st.recv_offset[rows].tolist(), st.src_buf[rows].tolist(),
            st.dst_buf[rows].tolist())
    return [Transfer(src, dst, off, cnt, red, recv, sb, db) for src, dst, off, cnt, red, recv, sb, db in zip(*cols)]


class _Streams:
    """Sends of one step, per peer, posted strictly in schedule order (FIFO matching). When this rank
    sent in the step before and a receiver forwards some of it, sends to a peer it did not send to
    then, and that receives in that step, are *held*: posted by ``flush`` only, after waiting for that
    step's sends (see the module doc)."""

    def __init__(self, pb: "_PlanBuilder", step: int):
        self.pb = pb
        self.queues: dict[int, list[int]] = {}
        for mid in pb.ids(pb.send_runs[step]):
            self.queues.setdefault(pb.msgs[mid].peer, []).append(mid)
        self.cursor = {peer: 0 for peer in self.queues}
        self.ready: set[int] = set()
        self.before = pb.ids(pb.send_runs[step - 1]) if step > 0 else []
        self.held: set[int] = pb.held_peers(step) if pb.hold else set()

    def mark(self, mid: int) -> None:
        self.ready.add(mid)
        self.advance(self.pb.msgs[mid].peer)

    def advance(self, peer: int, force: bool = False) -> None:
        if peer in self.held and not force:
            return
        q, i = self.queues[peer], self.cursor[peer]
        while i < len(q) and (force or q[i] in self.ready):
            self.pb.actions.append((POST_SEND, q[i], ()))
            self.pb.outstanding.add(q[i])
            i += 1
        self.cursor[peer] = i

    def flush(self) -> None:
        for peer in self.queues:
            if peer not in self.held:
                self.advance(peer, force=True)
        if not self.held:
            return
        older = [mid for mid in self.before if mid in self.pb.outstanding]
        self.pb.outstanding.difference_update(older)
        first = True
        for peer in self.queues:
            if peer in self.held and self.cursor[peer] < len(self.queues[peer]):
                mid = self.queues[peer][self.cursor[peer]]
                self.pb.actions.append((POST_SEND, mid, tuple(older) if first else ()))
                self.pb.outstanding.add(mid)
                self.cursor[peer] += 1
                first = False
                self.held.discard(peer)
                self.advance(peer, force=True)


class _Receives:
    """Receives of one step, posted in apply order (each peer's in schedule order: FIFO matching) as the
    scratch frees: one whose scratch range ends at ``e`` waits until the previous step's receives below
    ``e`` are applied, so consecutive steps share one scratch region (with two regions, ``post(None)``
    posts them all at once). Direct receives need no scratch."""

    def __init__(self, pb: "_PlanBuilder", step: int):
        self.pb = pb
        older = {}  # each segment's run's older sends (checked for direct ones)
        for run in pb.recv_runs[step]:
            sends = pb.send_runs_over(run, step - 1)
            older.update((rid, sends) for rid in range(run.first, run.first + run.nseg))
        self.queue = [(rid, older[rid]) for rid in pb.apply_order[step]]  # scratch order
        self.cursor = 0

    def post(self, freed: int | None) -> None:
        """Post the receives whose scratch lies below ``freed`` elements (None: all of them)."""
        pb, queue = self.pb, self.queue
        while self.cursor < len(queue):
            rid, older = queue[self.cursor]
            r = pb.msgs[rid]
            if not r.direct and freed is not None and r.scratch + r.count > freed:
                return
            pb.actions.append((POST_RECV, rid, pb._hazards(r, older) if r.direct else ()))
            self.cursor += 1


class _PlanBuilder:
    """The state of one :func:`compile_plan` call: this rank's transfers per step, their segments
    (``msgs``, grouped in runs), the actions emitted so far and the sends not yet waited for."""

    def __init__(self, schedule: Schedule, rank: int, segment: int, hold: bool = True, interleave: bool = True):
        self.rank, self.segment, self.hold, self.interleave_peers = rank, segment, hold, interleave
        self.nsteps = nsteps = schedule.num_steps
        # This rank's transfers per step, in schedule order: out_t[s] it sends, in_t[s] it receives.
        self.out_t: list[list[Transfer]] = []
        self.in_t: list[list[Transfer]] = []
        self.schedule = schedule
        for s in range(nsteps):
            st = schedule.step_arrays(s)
            self.out_t.append(_select(st, np.flatnonzero(st.src == rank)))
            self.in_t.append(_select(st, np.flatnonzero(st.dst == rank)))
        self.sends = [[(t.dst, t.src_buf, t.offset, t.count) for t in ts] for ts in self.out_t]
        self.recvs = [[(t.src, t.dst_buf, t.recv_offset, t.count, t.reduce) for t in ts] for ts in self.in_t]
        self.send_index = RangeIndex([[sd[1:] for sd in step] for step in self.sends])
        self.recv_index = RangeIndex([[r[1:4] for r in step] for step in self.recvs])
        self._by_peer: dict[tuple[int, bool], dict[int, list[Transfer]]] = {}
        self._recv_first: np.ndarray | None = None
        self.msgs: list[Msg] = []
        self.send_runs: list[list[_Run]] = [[] for _ in range(nsteps)]
        self.recv_runs: list[list[_Run]] = [[] for _ in range(nsteps)]
        self.actions: list[tuple] = []
        self.outstanding: set[int] = set()  # posted sends not yet waited for
        self.scratch_need = 0  # elements of the largest step's non-direct receives
        self.apply_order: list[list[int]] = []  # per step: received segment ids in apply order (interleave)
        self.apply_pos = np.zeros(0, dtype=np.int64)  # per message id: its place in its step's apply order
        self.two_regions = False  # set by segment_messages: see there

    def build(self) -> Plan:
        self.segment_messages()
        if self.nsteps:
            _Receives(self, 0).post(None)
            _Streams(self, 0).flush()
        for s in range(self.nsteps):
            self.run_step(s)
        scratch = self.scratch_need * (2 if self.two_regions else 1)
        return Plan(tuple(self.msgs), tuple(self.actions), tuple(sorted(self.outstanding)), scratch)

    def held_peers(self, s: int) -> set[int]:
        """The peers this rank's step-``s`` sends to are held (:func:`.hold.held_pairs`)."""
        st = self.schedule.step_arrays(s)
        rows = held_pairs(self.schedule, s)
        return set(st.dst[rows[st.src[rows] == self.rank]].tolist())

    def by_peer(self, s: int, sent: bool) -> dict[int, list[Transfer]]:
        """This rank's transfers of step ``s`` (sent or received) keyed by the other rank, in order."""
        key = (s, sent)
        if key not in self._by_peer:
            out: dict[int, list[Transfer]] = {}
            for t in (self.out_t if sent else self.in_t)[s]:
                out.setdefault(t.dst if sent else t.src, []).append(t)
            self._by_peer[key] = out
        return self._by_peer[key]

    def segment_messages(self) -> None:
        """Cut every transfer into segments (``msgs``) and lay out the scratch of non-direct receives."""
        msgs, segment = self.msgs, self.segment
        for s in range(self.nsteps):
            for peer, b, off, cnt in self.sends[s]:
                first = len(msgs)
                for o in range(off, off + cnt, segment):
                    msgs.append(Msg(peer, s, b, o, min(segment, off + cnt - o), True, False, False, 0))
                self.send_runs[s].append(_Run(b, off, cnt, first, len(msgs) - first, s))
            for i, (peer, b, off, cnt, red) in enumerate(self.recvs[s]):
                direct = inplace.can_direct(self, s, i)
                first = len(msgs)
                for o in range(off, off + cnt, segment):
                    msgs.append(Msg(peer, s, b, o, min(segment, off + cnt - o), False, red, direct, 0))
                self.recv_runs[s].append(_Run(b, off, cnt, first, len(msgs) - first, s))
            order = self.interleave(self.recv_runs[s])
            self.apply_order.append(order)
            used = 0
            for rid in order:
                m = msgs[rid]
                if not m.direct:
                    msgs[rid] = dataclasses.replace(m, scratch=used)
                    used += m.count
            self.scratch_need = max(self.scratch_need, used)
        self.apply_pos = np.zeros(len(msgs), dtype=np.int64)
        for order in self.apply_order:
            self.apply_pos[order] = np.arange(len(order))
        # Every step lays its receives out from the scratch's start, in apply order. When a step's
        # receives fit in one segment, odd steps use a second region, so that all of step s+1's
        # receives are posted before step s is applied (one segment per step could not otherwise
        # overlap its transfer with the previous step's reduction). Larger steps share one region: a
        # receive of step s+1 is posted once the receives of step s below its end are applied
        # (_Receives), one segment behind, at half the memory.
        self.two_regions = 0 < self.scratch_need <= self.segment
        if self.two_regions:
            half = self.scratch_need
            self.msgs = [m if m.is_send or m.direct or m.step % 2 == 0 else
                         Msg(m.peer, m.step, m.buf, m.offset, m.count, False, m.reduce, False, m.scratch + half)
                         for m in msgs]

    def interleave(self, runs: list[_Run]) -> list[int]:
        """Ids of one step's received segments in the order they are applied: a segment from each
        sending peer in turn (transfers from several peers arrive together, sharing this rank's link,
        so the first segments of all of them complete what the next step's first sends need), each
        peer's own segments in schedule order (the order they are posted and matched in)."""
        per_peer: dict[int, list[int]] = {}
        for run in runs:
            per_peer.setdefault(self.msgs[run.first].peer, []).extend(range(run.first, run.first + run.nseg))
        queues = list(per_peer.values())
        if len(queues) == 1 or not self.interleave_peers:
            return [i for q in queues for i in q]
        return [q[j] for j in range(max(map(len, queues), default=0)) for q in queues if j < len(q)]

    def send_runs_over(self, run: _Run, last: int) -> list[_Run]:
        """Send runs of steps ``0..last-1`` overlapping ``run``'s range, in step and schedule order."""
        where = self.send_index.where
        return [self.send_runs[where[pos][0]][where[pos][1]]
                for pos in self.send_index.overlapping(run.buf, run.offset, run.count, 0, last)]

    @staticmethod
    def ids(runs: list[_Run]) -> list[int]:
        return [i for run in runs for i in range(run.first, run.first + run.nseg)]

    def _hazards(self, r: Msg, runs: list[_Run]) -> tuple[int, ...]:
        """Outstanding send segments of ``runs`` overlapping message ``r``; they count as waited for."""
        hazards: list[int] = []
        for sr in runs:
            hazards.extend(i for i in sr.seg_range(r.buf, r.offset, r.offset + r.count, self.segment)
                           if i in self.outstanding)
        self.outstanding.difference_update(hazards)
        return tuple(hazards)

    def last_input(self, s: int, m: Msg) -> int:
        """Id of the last received segment of step ``s`` overlapping message ``m`` (-1: none)."""
        runs, end, pos_of = self.recv_runs[s], m.offset + m.count, self.apply_pos
        if len(runs) <= 16:
            last = -1
            for run in runs:
                r = run.seg_range(m.buf, m.offset, end, self.segment)
                if r and (last < 0 or pos_of[r[-1]] > pos_of[last]):
                    last = r[-1]
            return last
        index = self.recv_index
        pos = np.asarray(index.overlapping(m.buf, m.offset, m.count, s, s + 1), dtype=np.int64)
        if not len(pos):
            return -1
        if self._recv_first is None:  # first segment of every receive run, by flat position
            self._recv_first = np.array([run.first for runs in self.recv_runs for run in runs], dtype=np.int64)
        ends = np.minimum(end, index.hi[pos])
        ids = self._recv_first[pos] + (ends - 1 - index.lo[pos]) // self.segment
        return int(ids[np.argmax(pos_of[ids])])

    def unlocks(self, s: int, nxt: _Streams) -> dict[int, list[int]]:
        """Sends of step s+1 keyed by the received segment of step s that completes their input;
        those depending on nothing received in step s are marked ready at once."""
        out: dict[int, list[int]] = {}
        for mid in self.ids(self.send_runs[s + 1]):
            last = self.last_input(s, self.msgs[mid])
            if last < 0:
                nxt.mark(mid)
            else:
                out.setdefault(last, []).append(mid)
        return out

    def run_step(self, s: int) -> None:
        """Apply step s's received segments in apply order (:meth:`interleave`), posting step s+1's
        receives as the scratch they land in frees and releasing the sends of step s+1 that each segment
        completes, then post the rest of step s+1's receives and sends."""
        nxt = _Streams(self, s + 1) if s + 1 < self.nsteps else None
        recvs = _Receives(self, s + 1) if nxt is not None else None
        unlocks: dict[int, list[int]] = {}
        if nxt is not None:
            recvs.post(None if self.two_regions else 0)
            unlocks = self.unlocks(s, nxt)
        writers = {}  # per received segment: the sends of steps <= s+1 over its run's range
        for run in self.recv_runs[s]:
            hazard = self.send_runs_over(run, s + 1)
            writers.update((rid, hazard) for rid in range(run.first, run.first + run.nseg))
        for rid in self.apply_order[s]:
            r, writers_hazard = self.msgs[rid], writers[rid]
            hazards = self._hazards(r, writers_hazard) if writers_hazard and not r.direct else ()
            self.actions.append((APPLY, rid, hazards))
            if recvs is not None and not r.direct:
                recvs.post(r.scratch + r.count)
            for mid in unlocks.get(rid, ()):
                nxt.mark(mid)
        if nxt is not None:
            recvs.post(None)
            nxt.flush()


def execute(schedule: Schedule, channel, buffers: tuple[torch.Tensor, ...],
            combine: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> None:
    """Run ``channel.rank``'s part of ``schedule`` on flat contiguous ``buffers``.

    ``channel`` (duck-typed; :class:`ringlet.engine.channel.Channel`) gives ``transport``, ``rank``
    (this rank in the schedule), ``peers`` (schedule rank -> transport rank), ``tag`` (messages of step
    ``s`` carry ``tag + s``), ``segment_bytes`` (at most the transport's ``max_segment_bytes`` when it
    has one), ``timeout`` and ``workspace`` (a dict owned by the
    caller that keeps scratch memory between calls, or None). ``combine(dst, src)`` reduces a received
    range into the buffer in place (:attr:`ringlet.types.Reduction.combine`); schedules without reducing
    transfers need none (a reducing transfer without it raises ``ValueError``: a caller's bug).
    A transport with a ``links`` counter (:class:`ringlet.transport.base.LinkCounter`, set by the
    straggler meter) is told each send of at least ``links.min_bytes``: its peer, bytes, seconds from
    post to the end of its wait, and seconds blocked in that wait.
    """
    if not schedule.num_steps:
        return
    itemsize = buffers[0].element_size()
    segment_bytes, cap = channel.segment_bytes, channel.transport.capabilities.max_segment_bytes
    if cap:
        segment_bytes = min(segment_bytes, cap)
    plan = compile_plan(schedule, channel.rank, max(1, segment_bytes // itemsize), HOLD_NEW_PEERS,
                        INTERLEAVE_PEERS)
    msgs = plan.msgs
    scratch = _scratch(channel.workspace, plan.scratch_elems, buffers[0])
    handles: list = [None] * len(msgs)
    transport, peers, tag, timeout = channel.transport, channel.peers, channel.tag, channel.timeout
    isend, irecv = transport.isend, transport.irecv
    clock = _SendClock(transport.links, itemsize) if transport.links is not None else None
    for act in plan.actions:
        kind, mid = act[0], act[1]
        m = msgs[mid]
        peer = peers[m.peer]
        if kind == POST_RECV:
            if act[2]:  # most actions wait for no send
                _wait_sends(handles, act[2], timeout, clock)
            view = (buffers[m.buf][m.offset:m.offset + m.count] if m.direct
                    else scratch[m.scratch:m.scratch + m.count])
            handles[mid] = irecv(view, peer, tag + m.step)
        elif kind == POST_SEND:
            if act[2]:
                _wait_sends(handles, act[2], timeout, clock)
            handles[mid] = isend(buffers[m.buf][m.offset:m.offset + m.count], peer, tag + m.step)
            if clock is not None and m.count >= clock.min_count:
                clock.posted(mid, peer, m.count)
        else:
            handles[mid].wait(timeout)
            handles[mid] = None
            if act[2]:
                _wait_sends(handles, act[2], timeout, clock)
            if not m.direct:
                _apply(schedule, m, buffers, scratch, combine)
    tail = [sid for sid in plan.tail_waits if handles[sid] is not None]
    if tail:
        _wait_sends(handles, tail, timeout, clock)


def _apply(schedule: Schedule, m: Msg, buffers, scratch: torch.Tensor, combine) -> None:
    """Reduce or copy received message ``m`` from the scratch into its place."""
    dst = buffers[m.buf][m.offset:m.offset + m.count]
    src = scratch[m.scratch:m.scratch + m.count]
    if m.reduce:
        if combine is None:
            raise ValueError(f"schedule {schedule.name!r} reduces, but no reduction was given")
        combine(dst, src)
    else:
        dst.copy_(src)


def _wait_sends(handles: list, sids, timeout, clock: "_SendClock | None") -> None:
    """Wait for the sends ``sids`` (timed when ``clock`` posted them) and drop their handles."""
    for sid in sids:
        if clock is None:
            handles[sid].wait(timeout)
        else:
            clock.wait(handles[sid], sid, timeout)
        handles[sid] = None


class _SendClock:
    """Post times of this execution's large sends, told to the transport's link counter at their wait."""

    __slots__ = ("links", "itemsize", "min_count", "times")

    def __init__(self, links, itemsize: int):
        self.links, self.itemsize = links, itemsize
        self.min_count = -(-links.min_bytes // itemsize)
        self.times: dict[int, tuple[float, int, int]] = {}

    def posted(self, mid: int, peer: int, count: int) -> None:
        self.times[mid] = (time.perf_counter(), peer, count * self.itemsize)

    def wait(self, handle, mid: int, timeout) -> None:
        rec = self.times.pop(mid, None)
        if rec is None:
            handle.wait(timeout)
            return
        t0 = time.perf_counter()
        handle.wait(timeout)
        t1 = time.perf_counter()
        self.links.add(rec[1], rec[2], t1 - rec[0], t1 - t0)
