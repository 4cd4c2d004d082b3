"""Bruck's all-to-all for small messages: ``ceil(log2 p)`` rounds instead of ``p-1``, each rank sending
one message per round, at the price of moving every block up to ``log2 p`` times.

Block ``(s, d)`` has the relative index ``j = (d - s) mod p``. In round ``k`` every rank ``r`` sends to
``r + 2^k`` all blocks it holds whose ``j`` has bit ``k`` set; a block thus travels ``j`` hops in
total and ends at ``d``. Before round ``k`` rank ``r`` holds, for every ``j``, the block from
``s = r - (j mod 2^k)``; every rank knows the whole count matrix, so every block's size, and so every
round's layout, is known everywhere (ragged counts need no extra exchange).

Layout (per rank, all in its scratch, buffer 2): round ``k``'s send area holds the blocks of that round
in increasing ``j``, packed by local copies before the round; the receiver keeps the message in a
receive area of the same layout, from where later rounds pack or the end unpacks. The schedule's steps
are the rounds' messages (one per rank per round, from send area to receive area); ``meta["copies"]``
holds the packing (:mod:`.alltoall`: a schedule with copies runs round by round). The scratch holds
every round's two areas: ``2 · Σ_k`` (bytes of the round) per rank, about ``p/2 · log2 p`` blocks
each way, which is why it is a schedule for small messages.

Cost: ``ceil(log2 p)·α + (log2 p)/2 · n·β`` per rank for ``n`` bytes per rank (even blocks), against
pairwise's ``(p-1)·α + n·β`` in the step-by-step model.
"""
from __future__ import annotations

import numpy as np

from .alltoall import Counts, matrix, merge_pieces, offsets
from .cache import cached
from .schedule import Schedule, ScheduleBuilder


def _rounds(p: int) -> int:
    return (p - 1).bit_length()


def _empty() -> np.ndarray:
    return np.zeros((0, 5), np.int64)


def _as_array(pieces) -> np.ndarray:
    return np.asarray(merge_pieces(pieces), dtype=np.int64).reshape(-1, 5)


class _State:
    """Where each rank's slot ``j`` lies (buffer, offset) and how big it is, and the scratch filled so far."""

    def __init__(self, p: int, counts: np.ndarray, send_off: np.ndarray):
        self.p = p
        self.counts = counts
        r, j = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
        d = (r + j) % p
        self.buf = np.ones((p, p), np.int64)  # slot j of rank r: initially r's input block for r + j
        self.off = send_off[r, d]
        self.size = counts[r, d]
        self.cursor = np.zeros(p, np.int64)

    def round(self, k: int, b: ScheduleBuilder) -> tuple[np.ndarray, list[list]]:
        """Pack and send round ``k``; returns per-rank message sizes and per-rank pack copies."""
        p, step = self.p, 1 << k
        js = np.array([j for j in range(1, p) if j & step], np.int64)
        sizes = self.size[:, js]  # [r, i]: slot js[i] of rank r
        total = sizes.sum(axis=1)
        send_base = self.cursor.copy()
        self.cursor += total
        within = np.cumsum(sizes, axis=1) - sizes
        copies = [[(int(self.buf[r, j]), int(self.off[r, j]), 2, int(send_base[r] + within[r, i]), int(sizes[r, i]))
                   for i, j in enumerate(js.tolist())] for r in range(p)]
        r = np.arange(p)
        q = (r + step) % p
        recv_base = np.zeros(p, np.int64)
        recv_base[q] = self.cursor[q]
        self.cursor[q] += total
        b.new_step()
        b.add_many(r, q, send_base, total, dst_offset=recv_base[q], src_buf=2, dst_buf=2)
        # The receiver's slot js[i] now is the sender's, in its receive area.
        self.buf[np.ix_(q, js)] = 2
        self.off[np.ix_(q, js)] = recv_base[q][:, None] + within
        self.size[np.ix_(q, js)] = sizes
        return total, copies

    def unpack(self, recv_off: np.ndarray) -> list[np.ndarray]:
        """Copies of every slot (now the block from ``r - j`` to ``r``) into the output."""
        out = []
        for r in range(self.p):
            src = [(r - j) % self.p for j in range(self.p)]
            out.append(_as_array([(int(self.buf[r, j]), int(self.off[r, j]), 0, int(recv_off[src[j], r]),
                                   int(self.size[r, j])) for j in range(1, self.p)]))
        return out


@cached
def bruck(p: int, send_counts: Counts) -> Schedule:
    """Bruck's all-to-all of the module doc over the count matrix ``send_counts``."""
    counts = matrix(p, send_counts)
    send_off, recv_off = offsets(counts)
    state = _State(p, counts, send_off)
    full = ScheduleBuilder("bruck_alltoall", p)
    rounds, copies = [], []
    pending = [[] for _ in range(p)]  # copies of rounds that move nothing, kept for the next boundary
    for k in range(_rounds(p)):
        one = ScheduleBuilder(f"bruck_alltoall_round{k}", p)
        total, packs = state.round(k, one)
        for r in range(p):
            pending[r].extend(packs[r])
        if not total.any():
            continue  # every block of this round is empty: no step, and its copies move nothing
        state_round = one.build()
        full.extend(state_round)
        rounds.append(state_round)
        copies.append(tuple(_as_array(pending[r]) for r in range(p)))
        pending = [[] for _ in range(p)]
    copies.append(tuple(state.unpack(recv_off)))
    return full.build(scratch=tuple(int(c) for c in state.cursor), copies=tuple(copies), rounds=tuple(rounds))
