"""Mutual challenge-response over every pair of a Gloo process group, before ringlet uses the group.

Gloo connects a group's ranks by address and an 8-byte sequence number that anyone can guess: a
process that reaches a rank's listener while the group is being made can take a peer's place, and
Gloo itself never notices (the peer's own connection is parked unused). Every message sent on that
pair afterwards, pickled objects included, would reach or come from the intruder. So right after a
group is created, each pair of its ranks proves, over that very pair, that both ends hold the job's
secret (:func:`ringlet.security.prove`). Three rounds, each a message in both directions of every pair
(``a`` and ``b`` are global ranks, ``label`` names the group by its ranks)::

    1. a -> b   Na (a fresh nonce) || a's listeners of this group
    2. a -> b   HMAC(secret, ROLE, label, a, b, msg1 b->a, msg1 a->b, Ea) || Ea
    3. a -> b   a's verdict: one byte per group rank, 1 where a's pair with that rank failed

``Ea`` lists a's connections to b's listeners (their local endpoints), which is how b tells its peers'
connections from strangers' later (:mod:`._gloo_watch`). The answer is bound to the ordered pair and
to both nonces, so it cannot be replayed in the other direction, on another pair or in another group.
A pair that answers wrongly, stays silent past the timeout or closes fails; the verdicts spread every
failure to every rank of the group, so all of them raise :class:`PairAuthError`, never hang (each
round is bounded by the timeout; a rank that raises closes its pairs, which ends its peers' waits).
"""
from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field

import torch

from ..security.secret import MAC_BYTES, NONCE_BYTES, new_nonce, prove, verify
from ..types import PeerError
from ._gloo_endpoints import LISTEN, Endpoint, own_connections, pack_endpoints, packed_size, unpack_endpoints

ROLE = b"ringlet-gloo-pair"
CAPACITY = 4  # endpoints per message: one per Gloo device of a group is the usual count
TAGS = (0x52474C31, 0x52474C32, 0x52474C33)  # one per round; no ringlet traffic runs on a new group yet


class PairAuthError(PeerError):
    """A pair of a Gloo group did not prove the job's secret. ``pairs``: the failed pairs as
    (global rank, global rank); ``rank``: the peer this rank failed with, when there was one."""

    def __init__(self, msg: str, pairs: list[tuple[int, int]], rank: int | None = None):
        super().__init__(msg, rank=rank)
        self.pairs = pairs


@dataclass
class GroupView:
    """What the challenge needs about one group, from this rank's side."""

    pg: object                  # the torch ProcessGroup: ``send``/``recv`` take group ranks
    ranks: tuple[int, ...]      # global rank of each group rank
    me: int                     # this process's group rank
    listeners: list[Endpoint]   # this process's Gloo listeners of the group (may be empty)

    def label(self) -> bytes:
        return ("ringlet-gloo-group:" + ",".join(map(str, self.ranks))).encode()


@dataclass
class AuthResult:
    """Endpoints the authenticated peers said they connect to this rank's listeners from."""

    legit: set = field(default_factory=set)
    complete: bool = True


def _wait(work, deadline: float) -> None:
    work.wait(timeout=datetime.timedelta(seconds=max(deadline - time.monotonic(), 1e-3)))


def _why(exc: BaseException) -> str:
    text = str(exc).strip()
    low = text.lower()
    if "timed out" in low or "timeout" in low:
        return "it did not answer in time"
    if "closed" in low or "reset" in low:
        return "the connection closed (the peer failed or left)"
    return text.splitlines()[0][:160] if text else type(exc).__name__


def exchange(view: GroupView, payloads: dict[int, bytes], size: int, tag: int,
             deadline: float) -> tuple[dict[int, bytes], dict[int, str]]:
    """Send ``payloads[p]`` to and receive ``size`` bytes from every group rank ``p`` at once:
    (received, failed) where ``failed[p]`` says why nothing usable came from ``p`` by ``deadline``."""
    got: dict[int, bytes] = {}
    failed: dict[int, str] = {}
    posted = {}
    for p, payload in payloads.items():
        rbuf = torch.zeros(size, dtype=torch.uint8)
        sbuf = torch.frombuffer(bytearray(payload.ljust(size, b"\0")), dtype=torch.uint8)
        try:
            posted[p] = (view.pg.recv([rbuf], p, tag), view.pg.send([sbuf], p, tag), rbuf, sbuf)
        except Exception as exc:  # noqa: BLE001 - a closed pair is a failed pair
            failed[p] = _why(exc)
    for p, (rwork, swork, rbuf, _) in posted.items():
        try:
            _wait(rwork, deadline)
            _wait(swork, deadline)
        except Exception as exc:  # noqa: BLE001 - timeout or closed: the pair failed
            failed[p] = _why(exc)
            continue
        got[p] = bytes(rbuf.numpy().tobytes())
    return got, failed


def _outgoing(connections, listeners: list[Endpoint]) -> list[Endpoint]:
    """The local endpoints of those ``connections`` (this process's) that reach one of ``listeners``."""
    targets = set(listeners)
    return sorted({c.local for c, _ in connections if c.state != LISTEN and c.remote in targets})


def _answers(view: GroupView, secret: bytes, sent1: dict[int, bytes], got1: dict[int, bytes]) -> dict[int, bytes]:
    """Round 2's message to every peer that delivered round 1."""
    out = {}
    connections = own_connections()
    for p, theirs in got1.items():
        their_listeners, _ = unpack_endpoints(theirs[NONCE_BYTES:], CAPACITY)
        table = pack_endpoints(_outgoing(connections, their_listeners), CAPACITY)
        mac = prove(secret, ROLE, view.label(), _rank_bytes(view.ranks[view.me]), _rank_bytes(view.ranks[p]),
                    theirs, sent1[p], table)
        out[p] = mac + table
    return out


def _rank_bytes(rank: int) -> bytes:
    return int(rank).to_bytes(8, "big")


def _check_answers(view: GroupView, secret: bytes, sent1, got1, got2, failed: dict[int, str]) -> AuthResult:
    """Verify round 2's answers; record failures in ``failed``; collect the endpoints of the peers that passed."""
    result = AuthResult()
    for p, msg in got2.items():
        mac, table = msg[:MAC_BYTES], msg[MAC_BYTES:]
        if not verify(secret, mac, ROLE, view.label(), _rank_bytes(view.ranks[p]), _rank_bytes(view.ranks[view.me]),
                      sent1[p], got1[p], table):
            failed[p] = "it did not prove the job's secret"
            continue
        eps, complete = unpack_endpoints(table, CAPACITY)
        result.legit.update(eps)
        result.complete = result.complete and complete
    return result


def authenticate_group(view: GroupView, secret: bytes, timeout: float) -> AuthResult:
    """Run the three rounds of the module docstring with every other rank of ``view``'s group; raise
    :class:`PairAuthError` on every rank of the group when any pair failed. Each round waits at most
    ``timeout`` seconds longer than the one before."""
    n, me = len(view.ranks), view.me
    peers = [p for p in range(n) if p != me]
    start = time.monotonic()
    size1, size2 = NONCE_BYTES + packed_size(CAPACITY), MAC_BYTES + packed_size(CAPACITY)
    sent1 = {p: new_nonce() + pack_endpoints(view.listeners, CAPACITY) for p in peers}
    got1, failed = exchange(view, sent1, size1, TAGS[0], start + timeout)
    got2, failed2 = exchange(view, _answers(view, secret, sent1, got1), size2, TAGS[1], start + 2 * timeout)
    failed.update(failed2)
    result = _check_answers(view, secret, sent1, got1, got2, failed)
    verdict = bytes(1 if q in failed else 0 for q in range(n))
    got3, failed3 = exchange(view, {p: verdict for p in got2}, n, TAGS[2], start + 3 * timeout)
    for p, why in failed3.items():
        failed.setdefault(p, why)
    reported = sorted({tuple(sorted((view.ranks[p], view.ranks[q]))) for p, v in got3.items()
                       for q in range(n) if v[q] and q != p})
    if failed or reported:
        raise _error(view, failed, reported)
    return result


def _error(view: GroupView, failed: dict[int, str], reported: list[tuple[int, int]]) -> PairAuthError:
    me = view.ranks[view.me]
    mine = sorted(view.ranks[p] for p in failed)
    why = {view.ranks[p]: w for p, w in failed.items()}
    parts = [f"with rank {r}: {why[r]}" for r in mine]
    parts += [f"rank {a if b == me else b} could not authenticate this rank" for a, b in reported
              if me in (a, b) and (a if b == me else b) not in why]
    others = [pr for pr in reported if me not in pr]
    if others:
        parts.append("failed elsewhere in the group: " + ", ".join(f"ranks {a} and {b}" for a, b in others))
    pairs = sorted({tuple(sorted((me, r))) for r in mine} | set(reported))
    msg = (f"rank {me}: the Gloo connections of group {list(view.ranks)} failed authentication "
           f"(a peer without the job's secret, or a stranger in a peer's place): " + "; ".join(parts))
    return PairAuthError(msg, pairs, rank=mine[0] if mine else None)
