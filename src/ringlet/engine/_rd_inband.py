"""Recursive doubling with the metadata check in band: the small all-reduce over point-to-point links.

Every message carries, before the vector, the *entries* its sender knows: ``(rank, bytes, record)``
of every member whose contribution it has folded in. Partners swap vectors and entries each round
(``⌈log₂p⌉`` rounds; non-powers of two fold in as :mod:`ringlet.algorithms.recursive_doubling`), so at
the end every member holds every member's entry and the reduced vector: the check costs no round of
its own. The reduction runs on a scratch copy, and ``flat`` is written only when every entry agrees;
otherwise every member raises the same MismatchError (they all hold the same entries). Receives take
``irecv_upto`` buffers large enough for any record and :data:`~ringlet.engine.small.P2P_MAX_BYTES`,
so a peer with another size is named by its entry instead of failing the receive. Partners combine
``a op b`` and ``b op a``: the same bits for ringlet's commutative ops, so every member ends equal.

``flat=None`` exchanges the entries only (the check of a collective that moves its data elsewhere):
a member doing that meets a member doing the all-reduce in the same messages, and both raise.
"""
from __future__ import annotations

import struct

import torch

from ..algorithms.executor import reduce_into
from ..algorithms.halving_doubling import participants

RECORD_MAX = 1024  # bytes of one record a receive buffer has room for
_ENTRY = struct.Struct("<qqq")  # rank, payload bytes, record bytes; then the record


def _encode(entries: dict[int, tuple[int, bytes]]) -> bytes:
    out = [struct.pack("<q", len(entries))]
    for r in sorted(entries):
        n, rec = entries[r]
        out.append(_ENTRY.pack(r, n, len(rec)) + rec)
    return b"".join(out)


def _decode(raw: memoryview, into: dict[int, tuple[int, bytes]]) -> int:
    """Merge the entries at the front of ``raw`` into ``into``; returns where the payload starts."""
    (count,) = struct.unpack_from("<q", raw, 0)
    pos = 8
    for _ in range(count):
        r, n, k = _ENTRY.unpack_from(raw, pos)
        pos += _ENTRY.size
        if r not in into:
            into[r] = (n, bytes(raw[pos:pos + k]))
        pos += k
    return pos


class _State:
    """One member's side: its scratch frames, accumulator and known entries."""

    def __init__(self, rt, g, grank: int, flat: torch.Tensor | None, rec: bytes, src: torch.Tensor | None,
                 cap: int):
        self.rt, self.g, self.grank = rt, g, grank
        self.tr = rt.transport
        self.nbytes = 0 if flat is None else flat.numel() * flat.element_size()
        key = ("engine.rd_inband", cap)
        ws = rt.workspace.get(key)
        if ws is None:  # frames, and memoryviews of them for struct (no copies, no tensor calls)
            buf = torch.empty(2 * cap, dtype=torch.uint8)
            ws = rt.workspace[key] = (buf[:cap], buf[cap:], memoryview(buf[:cap].numpy()),
                                      memoryview(buf[cap:].numpy()))
        self.out_frame, self.in_frame, self.out_mv, self.in_mv = ws
        self.acc = None if flat is None else (flat if src is None else src).clone()
        self.entries: dict[int, tuple[int, bytes]] = {grank: (self.nbytes, rec)}

    def _frame(self) -> torch.Tensor:
        head = _encode(self.entries)
        frame = self.out_frame[:len(head) + self.nbytes]
        self.out_mv[:len(head)] = head
        if self.nbytes:
            frame[len(head):].copy_(self.acc.view(torch.uint8))
        return frame

    def swap(self, peer: int, tag: int, send: bool, recv: bool, op: int | None) -> None:
        """Send our frame to / receive a frame from group rank ``peer``; merge its entries and
        reduce (``op``) or take (``op=None``) its vector when its size is ours."""
        tr, timeout = self.tr, self.rt.options.timeout
        hs = []
        if recv:
            hs.append(tr.irecv_upto(self.in_frame, self.g.ranks[peer], tag))
        if send:
            hs.append(tr.isend(self._frame(), self.g.ranks[peer], tag))
        wait_all = getattr(tr, "wait_all", None)
        if wait_all is not None:
            wait_all(hs, timeout)
        else:
            for h in hs:
                h.wait(timeout)
        if not recv:
            return
        pos = _decode(self.in_mv, self.entries)
        theirs = self.entries.get(peer)
        if self.acc is None or theirs is None or theirs[0] != self.nbytes or not self.nbytes:
            return
        payload = self.in_frame[pos:pos + self.nbytes].view(self.acc.dtype)
        if op is None:
            self.acc.copy_(payload)
        else:
            reduce_into(self.acc, payload, op)


def allreduce_rd(rt, g, grank: int, flat: torch.Tensor | None, op: int, rec: bytes, tag: int,
                 src: torch.Tensor | None, max_payload: int):
    """Run the rounds (messages of step ``s`` carry tag ``tag + s``). Returns every member's
    ``(bytes, record)`` in group-rank order and the reduced vector (a scratch tensor; ``None`` when
    ``flat`` is ``None``). ``flat`` is not written: the caller checks the entries first."""
    p = g.size
    st = _State(rt, g, grank, flat, rec, src, 8 + p * (_ENTRY.size + RECORD_MAX) + max_payload)
    pp = 1 << (p.bit_length() - 1)
    extra = p - pp
    folded = grank < 2 * extra and grank % 2 == 0  # hands its vector to grank + 1, gets the result back
    if grank < 2 * extra:
        st.swap(grank + 1 if folded else grank - 1, tag, send=folded, recv=not folded, op=op)
    if not folded:
        real = participants(p)
        v = real.index(grank)
        for j in range(pp.bit_length() - 1):
            st.swap(real[v ^ (1 << j)], tag + 1 + j, send=True, recv=True, op=op)
    last = tag + pp.bit_length()
    if grank < 2 * extra:
        st.swap(grank + 1 if folded else grank - 1, last, send=not folded, recv=folded, op=None)
    return [st.entries.get(q, (-1, b"")) for q in range(p)], st.acc
