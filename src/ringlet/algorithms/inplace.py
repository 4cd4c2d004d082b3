"""When a receive may land straight in the buffer: the executor's in-place rule
(:mod:`ringlet.algorithms.executor`), as functions of one rank's plan builder ``pb``.

The rule rests on the executor's ordering: a rank runs its actions in order, and a send of step ``s``
is posted only after the received segments of step ``s-1`` it overlaps are applied. So a peer's
step-``s`` message over a range is causally after that peer received this rank's step-``s-1`` message
over the range when the peer forwards it (``answers``). :mod:`ringlet.algorithms.plan_check` verifies
the plans under every message timing.
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
