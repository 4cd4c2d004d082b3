"""The one executor: compiles a rank's share of a :class:`Schedule` into a pipelined action list and
runs it over any object with ``isend``/``irecv`` (the transport is duck-typed; no transport import).

Pipelining: every transfer is cut into segments. Receives of step ``s+1`` are posted while step ``s``
is being applied, and a send segment of step ``s+1`` goes out as soon as the received segments of
step ``s`` it depends on are reduced, so the reduction of one segment overlaps the transfer of the
next (the ring's classic chunk pipelining, and a pipelined tree for free).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .schedule import Schedule

POST_RECV, POST_SEND, APPLY = 0, 1, 2


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


def _overlap(a_buf: int, a_off: int, a_cnt: int, b_buf: int, b_off: int, b_cnt: int) -> bool:
    return a_buf == b_buf and a_off < b_off + b_cnt and b_off < a_off + a_cnt


@functools.lru_cache(maxsize=512)
def compile_plan(schedule: Schedule, rank: int, segment: int) -> Plan:
    """Turn ``rank``'s transfers into actions. ``segment`` is the pipeline granularity in elements."""
    segment = max(1, segment)
    nsteps = schedule.num_steps
    sends: list[list[tuple]] = [[] for _ in range(nsteps)]
    recvs: list[list[tuple]] = [[] for _ in range(nsteps)]
    for s, t in schedule.transfers():
        if t.src == rank:
            sends[s].append((t.dst, t.src_buf, t.offset, t.count))
        if t.dst == rank:
            recvs[s].append((t.src, t.dst_buf, t.recv_offset, t.count, t.reduce))

    # A copy-receive may land directly in the buffer when nothing else touches that range while
    # it is in flight: no other receive writes it and no send at this step or before reads it.
    def can_direct(s: int, i: int) -> bool:
        peer, b, off, cnt, red = recvs[s][i]
        if red:
            return False
        for s2 in range(nsteps):
            for j, r in enumerate(recvs[s2]):
                if (s2, j) != (s, i) and _overlap(b, off, cnt, r[1], r[2], r[3]):
                    return False
            if s2 <= s:
                for sd in sends[s2]:
                    if _overlap(b, off, cnt, sd[1], sd[2], sd[3]):
                        return False
        return True

    msgs: list[Msg] = []
    send_ids: list[list[int]] = [[] for _ in range(nsteps)]  # per step, in schedule order
    recv_ids: list[list[int]] = [[] for _ in range(nsteps)]
    scratch_need = [0, 0]
    for s in range(nsteps):
        for peer, b, off, cnt in sends[s]:
            for o in range(off, off + cnt, segment):
                send_ids[s].append(len(msgs))
                msgs.append(Msg(peer, s, b, o, min(segment, off + cnt - o), True, False, False, 0))
        used = 0
        for i, (peer, b, off, cnt, red) in enumerate(recvs[s]):
            direct = can_direct(s, i)
            for o in range(off, off + cnt, segment):
                n = min(segment, off + cnt - o)
                recv_ids[s].append(len(msgs))
                msgs.append(Msg(peer, s, b, o, n, False, red, direct, 0 if direct else used))
                if not direct:
                    used += n
        scratch_need[s % 2] = max(scratch_need[s % 2], used)
    # Scratch alternates between two halves: step s+1 is received while step s is applied.
    half = scratch_need[0]
    msgs = [m if m.is_send or m.direct or m.step % 2 == 0 else
            Msg(m.peer, m.step, m.buf, m.offset, m.count, False, m.reduce, False, m.scratch + half)
            for m in msgs]

    actions: list[tuple] = []
    posted_send: set[int] = set()
    outstanding: list[int] = []  # posted, not yet waited sends

    def post_ready_sends(step: int, ready: set[int]) -> None:
        # Sends to one peer within a step go out in schedule order so FIFO matching holds.
        if step >= nsteps:
            return
        blocked_peers: set[int] = set()
        for mid in send_ids[step]:
            if mid in posted_send:
                continue
            peer = msgs[mid].peer
            if peer in blocked_peers or mid not in ready:
                blocked_peers.add(peer)
                continue
            actions.append((POST_SEND, mid))
            posted_send.add(mid)
            outstanding.append(mid)

    def deps_on(step: int, mid: int) -> list[int]:
        m = msgs[mid]
        return [rid for rid in recv_ids[step]
                if _overlap(m.buf, m.offset, m.count, msgs[rid].buf, msgs[rid].offset, msgs[rid].count)]

    for mid in (recv_ids[0] if nsteps else []):
        actions.append((POST_RECV, mid))
    if nsteps:
        post_ready_sends(0, set(send_ids[0]))
    for s in range(nsteps):
        if s + 1 < nsteps:
            for mid in recv_ids[s + 1]:
                actions.append((POST_RECV, mid))
            waiting = {mid: set(deps_on(s, mid)) for mid in send_ids[s + 1]}
            ready = {mid for mid, d in waiting.items() if not d}
            post_ready_sends(s + 1, ready)
        else:
            waiting, ready = {}, set()
        for rid in recv_ids[s]:
            r = msgs[rid]
            hazards = [sid for sid in outstanding
                       if _overlap(r.buf, r.offset, r.count, msgs[sid].buf, msgs[sid].offset, msgs[sid].count)]
            if hazards and not r.direct:
                outstanding[:] = [sid for sid in outstanding if sid not in hazards]
            else:
                hazards = []
            actions.append((APPLY, rid, tuple(hazards)))
            if waiting:
                newly = False
                for mid, d in waiting.items():
                    if rid in d:
                        d.discard(rid)
                        if not d:
                            ready.add(mid)
                            newly = True
                if newly:
                    post_ready_sends(s + 1, ready)
        if s + 1 < nsteps:
            post_ready_sends(s + 1, set(send_ids[s + 1]))
    return Plan(tuple(msgs), tuple(actions), tuple(outstanding), 2 * max(scratch_need) if nsteps else 0)


def reduce_into(dst: torch.Tensor, src: torch.Tensor, op: int) -> None:
    """``dst = dst (op) src`` elementwise, in place. ``op`` is a :class:`ringlet.types.ReduceOp` value."""
    if op == 3:  # MIN
        torch.minimum(dst, src, out=dst)
    elif op == 4:  # MAX
        torch.maximum(dst, src, out=dst)
    elif op == 5:  # PRODUCT
        dst.mul_(src)
    else:  # SUM and AVG (AVG divides once at the end)
        dst.add_(src)


def execute(schedule: Schedule, rank: int, transport, buffers: tuple[torch.Tensor, ...], op: int,
            *, peers: tuple[int, ...] | None = None, tag: int = 0, segment_bytes: int = 1 << 20,
            timeout: float | None = None) -> None:
    """Run ``rank``'s part of ``schedule`` over ``transport`` on flat contiguous ``buffers``.

    ``peers`` maps schedule ranks to transport ranks (sub-groups); messages of step ``s`` carry
    tag ``tag + s``.
    """
    if not schedule.steps:
        return
    itemsize = buffers[0].element_size()
    plan = compile_plan(schedule, rank, max(1, segment_bytes // itemsize))
    msgs = plan.msgs
    scratch = torch.empty(plan.scratch_elems, dtype=buffers[0].dtype, device=buffers[0].device)
    handles: list = [None] * len(msgs)
    isend, irecv = transport.isend, transport.irecv
    for act in plan.actions:
        kind, mid = act[0], act[1]
        m = msgs[mid]
        peer = m.peer if peers is None else peers[m.peer]
        if kind == POST_RECV:
            view = (buffers[m.buf][m.offset:m.offset + m.count] if m.direct
                    else scratch[m.scratch:m.scratch + m.count])
            handles[mid] = irecv(view, peer, tag + m.step)
        elif kind == POST_SEND:
            handles[mid] = isend(buffers[m.buf][m.offset:m.offset + m.count], peer, tag + m.step)
        else:
            handles[mid].wait(timeout)
            handles[mid] = None
            for sid in act[2]:
                handles[sid].wait(timeout)
                handles[sid] = None
            if not m.direct:
                dst = buffers[m.buf][m.offset:m.offset + m.count]
                src = scratch[m.scratch:m.scratch + m.count]
                if m.reduce:
                    reduce_into(dst, src, op)
                else:
                    dst.copy_(src)
    for sid in plan.tail_waits:
        if handles[sid] is not None:
            handles[sid].wait(timeout)
