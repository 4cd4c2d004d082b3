"""The executor's step-order rule as a property of a schedule: which sends of a step are *held* until the
step before has been applied and its sends have completed.

A rank ``r`` holds its step-``s`` send to ``d`` when all of these are true:

* ``r`` sends in step ``s-1``;
* ``d`` is a new peer: ``r`` did not send to it in step ``s-1``;
* ``d`` itself receives in step ``s-1`` (it is busy with the older step);
* some rank that ``r`` sent to in step ``s-1`` sends on, in step ``s``, part of what it received from
  ``r`` (a reduction or a relay), from the same buffer and an overlapping range: others then wait for
  ``r``'s step-``s-1`` data, which the early message would only slow down on ``r``'s link.

The executor (:mod:`.executor`) holds exactly these sends, and the cost model and the simulator read
the same answer, so that a held step starts after the step before in all three: one definition.
The reasons for the rule are in the executor's module doc and ``docs/design.md``.
"""
from __future__ import annotations

import numpy as np

from .schedule import Schedule, StepArrays

__all__ = ["held_between", "held_pairs", "held_steps"]


def held_pairs(schedule: Schedule, s: int) -> np.ndarray:
    """Indices into ``schedule.step_arrays(s)`` of the transfers whose sends are held (see the module
    doc); empty for step 0. ``IndexError`` outside ``0..num_steps-1``."""
    cur = schedule.step_arrays(s)
    if s == 0:
        return np.zeros(0, np.int64)
    return held_between(schedule.step_arrays(s - 1), cur, schedule.nranks)


def held_steps(schedule: Schedule) -> np.ndarray:
    """Per step, whether any rank holds a send of it (bool array of ``num_steps``)."""
    out = np.zeros(schedule.num_steps, bool)
    prev = schedule.step_arrays(0) if schedule.num_steps else None
    for s in range(1, schedule.num_steps):
        cur = schedule.step_arrays(s)
        out[s] = len(held_between(prev, cur, schedule.nranks)) > 0
        prev = cur
    return out


def held_between(prev: StepArrays, cur: StepArrays, p: int) -> np.ndarray:
    """:func:`held_pairs` for a caller that already holds the arrays of step ``s-1`` (``prev``) and
    step ``s`` (``cur``) of a ``p``-rank schedule."""
    if len(cur.src) == 0:
        return np.zeros(0, np.int64)
    if np.array_equal(cur.src, prev.src) and np.array_equal(cur.dst, prev.dst):
        return np.zeros(0, np.int64)  # the same pairs as the step before (a ring): no new peer
    src, dst = cur.src.astype(np.int64), cur.dst.astype(np.int64)
    psrc, pdst = prev.src.astype(np.int64), prev.dst.astype(np.int64)
    candidate = (np.isin(src, psrc) & ~np.isin(src * p + dst, psrc * p + pdst) & np.isin(dst, pdst))
    if not candidate.any():
        return np.zeros(0, np.int64)
    senders = np.unique(src[candidate])
    forwarding = senders[np.isin(senders, _forwarders(prev, cur, senders))]
    return np.flatnonzero(candidate & np.isin(src, forwarding))


def _forwarders(prev: StepArrays, cur: StepArrays, senders: np.ndarray) -> np.ndarray:
    """The ``senders`` some of whose step-``s-1`` data (``prev``) a receiver sends on in step ``s``."""
    rows = np.flatnonzero(np.isin(prev.src, senders))
    nbuf = int(max(prev.dst_buf.max(initial=0), cur.src_buf.max(initial=0))) + 1
    t_src = prev.src[rows].astype(np.int64)
    t_key = prev.dst[rows].astype(np.int64) * nbuf + prev.dst_buf[rows].astype(np.int64)
    t_lo = prev.recv_offset[rows].astype(np.int64)
    t_hi = t_lo + prev.count[rows].astype(np.int64)
    u_key = cur.src.astype(np.int64) * nbuf + cur.src_buf.astype(np.int64)
    order = np.argsort(u_key, kind="stable")
    u_key, u_lo = u_key[order], cur.offset.astype(np.int64)[order]
    u_hi = u_lo + cur.count.astype(np.int64)[order]
    first, last = np.searchsorted(u_key, t_key, "left"), np.searchsorted(u_key, t_key, "right")
    n = last - first
    if n.sum() == 0:
        return np.zeros(0, np.int64)
    which = np.repeat(np.arange(len(rows)), n)  # each (t, u) pair with u sent by t's receiver
    u = np.concatenate([np.arange(a, b) for a, b in zip(first[n > 0], last[n > 0])])
    overlap = (u_lo[u] < t_hi[which]) & (t_lo[which] < u_hi[u])
    return np.unique(t_src[which[overlap]])
