"""Agreeing on an all-to-all's counts before its data moves, in one small round.

Rank ``s`` sends ``send[d]`` rows to each member ``d`` (its ``splits``); a caller may also give the rows
it receives from each member (``recv``: torch's ``output_split_sizes``, MPI's ``recvcounts``). The
counts are consistent when ``send_s[d] == recv_d[s]`` for every pair.

*Consistency without exchanging the counts.* Each member adds up its side of every pair with weights
every member computes alike (a hash of the pair, modulo each prime of :data:`MODULI`):
``res_r = Σ_d w(r,d)·send_r[d] − Σ_s w(s,r)·recv_r[s]``. The members' residuals sum to
``Σ_{s,d} w(s,d)·(send_s[d] − recv_d[s])``: zero when the counts are consistent; when they are not, zero
only if the weights happen to cancel (about 2^-62). Where the records travel (the small-message path,
or the record exchange) the residual pair rides in them: the round every checked op makes anyway. On
Gloo (``native_digest``, no small-message path) the digest round (:func:`ringlet.engine.agree.digest_agrees`:
a native all-reduce of 2 int64) is followed by a second one of the residual pair. Carrying both in one
all-reduce (the digest as parts with their squares, 8 int64 summed) took 3 times as long as one of 2
int64 on Gloo over 4 ranks (its algorithm for fewer elements than ranks is cheaper), so two small
rounds are cheaper than one larger one. When the sum is not zero every member
exchanges its send and receive counts (an error path) and raises the same
:class:`~ringlet.types.MismatchError`, naming the first pair that disagrees.

*The count matrix*, where a schedule needs it (no receive counts, or a forced two-level or Bruck
schedule), travels in the records (:func:`ringlet.engine.agree.records`: the small-message path's one
round, or on Gloo the digest round of a checked call followed by a one-step exchange of the records;
unchecked, that exchange alone), each member's record holding its counts and, with receive counts, its
residual pair. A native all-reduce gathering the matrix instead (each member filling its row of a
``p × p`` int64 matrix) was slower on Gloo: its ring's sequential hops against one step of
point-to-point messages (benchmarks/alltoall).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch

from ..types import MismatchError, ReduceOp
from . import agree, small
from .channel import Channel
from .meta import Kind, Meta

#: The primes the residuals are taken modulo: below 2^31, so that a weight times a count fits an int64,
#: and so does the sum of the members' residuals.
MODULI = (2147483647, 2147483629)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _weights(pairs: np.ndarray, j: int) -> np.ndarray:
    """The weight of each pair index ``s·p + d`` modulo ``MODULI[j]``: a splitmix64 hash, in ``[1, q)``."""
    with np.errstate(over="ignore"):
        z = (pairs.astype(np.uint64) + np.uint64(j + 1)) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    q = MODULI[j]
    return (z % np.uint64(q - 1)).astype(np.int64) + 1


def residuals(p: int, me: int, send: Sequence[int], recv: Sequence[int]) -> tuple[int, int]:
    """Member ``me``'s residual pair (see the module doc); the diagonal is left out (a member's own
    block never travels; the caller checks ``send[me] == recv[me]``)."""
    others = np.array([r for r in range(p) if r != me], dtype=np.int64)
    s = np.asarray(send, dtype=np.int64)[others]
    r = np.asarray(recv, dtype=np.int64)[others]
    out = []
    for j, q in enumerate(MODULI):
        w_out, w_in = _weights(me * p + others, j), _weights(others * p + me, j)
        total = int(((w_out * (s % q)) % q).sum() - ((w_in * (r % q)) % q).sum())
        out.append(total % q)
    return out[0], out[1]


def record(t: torch.Tensor, algorithm: str, splits: Sequence[int], recv_known: bool) -> Meta:
    """The all-to-all's record: ``splits`` (its counts, and with receive counts its residual pair);
    ``root`` 1 when the caller gave receive counts, -1 otherwise (members must agree on it)."""
    return Meta.of("", Kind.ALLTOALL, t, splits=tuple(splits), algorithm=algorithm, root=1 if recv_known else -1)


def _common(meta: Meta) -> Meta:
    """What every member's record shares: no first dimension, no counts (the digest round's record)."""
    return dataclasses.replace(meta, shape=(0,) + meta.shape[1:], splits=())


def _native(ch: Channel) -> bool:
    return small.carrier(ch) is None and ch.transport.capabilities.native_digest


def _records(ch: Channel, meta: Meta, check: bool) -> list[Meta]:
    """Every member's record by the small-message path or the record exchange, verified when ``check``."""
    return agree.records(ch, meta, check=check)


def check_known(ch: Channel, t: torch.Tensor, algorithm: str, send: Sequence[int], recv: Sequence[int]) -> None:
    """The check of an all-to-all whose every member gave its receive counts: one round (the digest
    all-reduce with the residuals, or the records with them). ``MismatchError`` on every member when the
    ops or the counts disagree."""
    if ch.size == 1:
        return
    res = residuals(ch.size, ch.rank, send, recv)
    meta = record(t, algorithm, res, True)
    if _native(ch):
        if agree.digest_agrees(ch, _common(meta)):
            if _native_sum_is_zero(ch, res):
                return
            name_mismatch(ch, send, recv)
            return
        metas = agree.exchange_records(ch, meta)  # every member gets here: the digest round's answer is shared
        agree.verify(ch, metas)
    else:
        metas = _records(ch, meta, True)
    if not _sums_to_zero([m.splits[-2:] for m in metas]):
        name_mismatch(ch, send, recv)


def _native_sum_is_zero(ch: Channel, res: tuple[int, int]) -> bool:
    """Whether the members' residual pairs sum to zero, by a native all-reduce (SUM) of two int64 (every
    member of the group did the same op: the digest round said so)."""
    buf = torch.tensor(res, dtype=torch.int64)
    if not ch.transport.native_allreduce(buf, ReduceOp.SUM, ch.peers):
        raise RuntimeError(f"the {ch.transport.name} transport declares native_digest but refused an int64 "
                           "all-reduce")
    return _sums_to_zero([buf.tolist()])


def _sums_to_zero(pairs) -> bool:
    return all(sum(int(x[j]) for x in pairs) % q == 0 for j, q in enumerate(MODULI))


def exchange(ch: Channel, t: torch.Tensor, algorithm: str, send: Sequence[int], recv: Sequence[int] | None,
             check: bool) -> list[tuple[int, ...]]:
    """Every member's send counts in group-rank order (the count matrix), the ops compared first when
    ``check``. With ``recv`` (this member's receive counts) they are checked against the matrix on every
    member, checked or not: ``MismatchError`` everywhere when any member's differ."""
    p = ch.size
    if p == 1:
        return [tuple(send)]
    res = residuals(p, ch.rank, send, recv) if recv is not None else ()
    row = tuple(send) + tuple(res)
    meta = record(t, algorithm, row, recv is not None)
    rows = [m.splits for m in _records(ch, meta, check)]
    if recv is not None and not _sums_to_zero([r[p:] for r in rows]):
        name_mismatch(ch, send, recv)
    return [tuple(int(c) for c in r[:p]) for r in rows]


def name_mismatch(ch: Channel, send: Sequence[int], recv: Sequence[int]) -> None:
    """The error path: every member's send and receive counts exchanged, and the same
    ``MismatchError`` raised on every member, naming the first pair whose counts differ (returns only
    when none does)."""
    p = ch.size
    payload = np.asarray(list(send) + list(recv), dtype=np.int64).tobytes()
    raws = agree.exchange(ch.meta(), payload, 16 * p)
    rows = [np.frombuffer(raw, dtype=np.int64) for raw in raws]
    for s in range(p):
        for d in range(p):
            sent, expected = int(rows[s][d]), int(rows[d][p + s])
            if sent != expected:
                raise MismatchError(
                    f"Mismatched alltoall counts: rank {ch.peers[s]} sends {sent} rows to rank {ch.peers[d]}, but "
                    f"rank {ch.peers[d]} expects {expected} from it (its recv_splits); every rank's recv_splits[s] "
                    "must equal rank s's splits for it.")
