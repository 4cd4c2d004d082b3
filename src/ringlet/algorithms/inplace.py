"""When a receive may land straight in the buffer, and how early it may be posted: the executor's
in-place rules (:mod:`ringlet.algorithms.executor`), as functions of one rank's plan builder ``pb``.

Both rules rest on the executor's ordering: a rank runs its actions in order; a send of step ``s`` is
posted only after the received segments of step ``s-1`` it overlaps are applied, and after every
apply of steps ``<= s-2``. So a peer's step-``t`` message over a range is causally after that peer
received this rank's message over the range in step ``t-1`` when the peer forwards it (``answers``),
and in any step ``<= t-2`` always. :mod:`ringlet.algorithms.plan_check` verifies the plans these rules
produce under every message timing.
"""
from __future__ import annotations


def _overlap(a_buf: int, a_off: int, a_cnt: int, b_buf: int, b_off: int, b_cnt: int) -> bool:
    return a_buf == b_buf and a_off < b_off + b_cnt and b_off < a_off + a_cnt


def answers(pb, s: int, peer: int, sd: tuple) -> bool:
    """True when ``peer``'s step-``s`` message to ``pb.rank`` can only start after ``peer`` has fully
    received ``pb.rank``'s step ``s-1`` send ``sd``: ``peer`` forwards the very range ``sd`` landed in.

    In the executor a send of step ``s`` is posted only once every received segment of step ``s-1``
    overlapping it has been applied, so the reply is causally after the last byte of ``sd`` left this
    rank's buffer, whatever the transport (this is what lets the all-gather half of an all-reduce
    receive in place: the reduced chunk comes back from the rank it was sent to)."""
    back = pb.by_peer(s, False).get(peer, [])
    mine = [t for t in pb.by_peer(s - 1, True).get(peer, [])
            if (t.src_buf, t.offset, t.count) == (sd[1], sd[2], sd[3])]
    if not back or not mine or any(t.recv_offset != t.offset for t in back + mine):
        return False
    t_in = mine[0]
    return all(t.src_buf == t_in.dst_buf and t_in.offset <= t.offset
               and t.offset + t.count <= t_in.offset + t_in.count for t in back
               if _overlap(t.dst_buf, t.offset, t.count, sd[1], sd[2], sd[3]))


def can_direct(pb, s: int, i: int) -> bool:
    """A copy-receive may land directly in the buffer (no scratch, no copy) when nothing else touches
    that range while it is in flight. It is posted one step ahead and waited for in its own step, so
    in flight with it are: receives of steps s-1..s+1, and sends of steps s-1 and s. A send of step s-1
    to the same peer is harmless when that peer's reply depends on it (``answers``). Older sends of
    the range are waited for before the receive is posted."""
    peer, b, off, cnt, red = pb.recvs[s][i]
    if red:
        return False
    me = pb.recv_index.position(s, i)
    if any(pos != me for pos in pb.recv_index.overlapping(b, off, cnt, s - 1, s + 2)):
        return False
    for pos in pb.send_index.overlapping(b, off, cnt, s - 1, s + 1):
        s2, j = pb.send_index.where[pos]
        sd = pb.sends[s2][j]
        if not (s2 == s - 1 and sd[0] == peer and answers(pb, s, peer, sd)):
            return False
    return True


def early_step(pb, s: int) -> int | None:
    """The step ``t > s+1`` whose receives may be posted while step ``s`` is applied, or None.

    Without this, a rank that receives nothing in steps ``s+1..t-1`` posts step ``t``'s receives only
    after step ``s`` is applied in full, while the sender may be ready long before (a tree's interior
    rank reduces its children's data, sends it up, and waits for the broadcast coming down: its
    parent's first segments would wait for this rank's last reduction). They may go early when every
    receive of step ``t`` lands in place (:func:`can_direct`) and, for its range ``R`` from peer
    ``q``, ``q``'s data cannot arrive before this rank is done with ``R``:

    * no send of step ``s`` overlaps ``R`` (it may still be reading ``R``);
    * every send over ``R`` in steps ``s+1..t-1`` goes to ``q`` (``q`` applies it before its step-``t``
      message: program order, or ``answers`` for step ``t-1``, which ``can_direct`` checked);
    * those sends cover every part of ``R`` that a receive of step ``s`` writes (the sends are posted
      after those writes, so ``q``'s reply comes after them).
    """
    if not pb.in_t[s] or s + 1 >= pb.nsteps or pb.in_t[s + 1]:
        return None
    t = next((u for u in range(s + 2, pb.nsteps) if pb.in_t[u]), None)
    if t is None:
        return None
    for i, (q, b, off, cnt, _) in enumerate(pb.recvs[t]):
        if not (cnt == 0 or (can_direct(pb, t, i) and _replied(pb, s, t, q, b, off, cnt))):
            return None
    return t


def _replied(pb, s: int, t: int, q: int, b: int, off: int, cnt: int) -> bool:
    """The last two conditions of :func:`early_step` for one receive of step ``t`` (from ``q``)."""
    if pb.send_index.overlapping(b, off, cnt, s, s + 1):
        return False
    cover = []
    for pos in pb.send_index.overlapping(b, off, cnt, s + 1, t):
        s2, j = pb.send_index.where[pos]
        dst, _, o, c = pb.sends[s2][j]
        if dst != q:
            return False
        cover.append((o, o + c))
    for pos in pb.recv_index.overlapping(b, off, cnt, s, s + 1):
        _, o, c = pb.recv_index.items[pos]
        if not _covers(cover, max(o, off), min(o + c, off + cnt)):
            return False
    return True


def _covers(spans: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """True when the union of ``spans`` covers ``[lo, hi)``."""
    for a, z in sorted(spans):
        if a > lo:
            break
        lo = max(lo, z)
        if lo >= hi:
            return True
    return lo >= hi
