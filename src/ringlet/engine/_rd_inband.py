"""Recursive doubling with the metadata check in band: the small all-reduce over point-to-point links.

Every message carries, before the vector, the *entries* its sender knows: ``(rank, bytes, record)``
of every member whose contribution it has folded in. Partners swap vectors and entries each round
(``⌈log₂p⌉`` rounds; non-powers of two fold in as :mod:`ringlet.algorithms.recursive_doubling`), so at
the end every member holds every member's entry and the reduced vector: the check costs no round of
its own. The reduction runs on a scratch copy, and ``flat`` is written only when every entry agrees;
otherwise every member raises the same MismatchError (they all hold the same entries). Receives take
``irecv_upto`` buffers large enough for any record and the transport's ``capabilities.small_bytes``,
so a peer with another size is named by its entry instead of failing the receive. Partners combine
``a op b`` and ``b op a``: the same bits for ringlet's commutative ops, so every member ends equal.

``flat=None`` exchanges the entries only (the check of a collective that moves its data elsewhere):
a member doing that meets a member doing the all-reduce in the same messages, and both raise.
"""
from __future__ import annotations

import struct

import numpy as np
import torch

from ..algorithms.halving_doubling import participants
from ..types import ReduceOp, Reduction

RECORD_MAX = 1024  # bytes of one record a receive buffer has room for
_ENTRY = struct.Struct("<qqq")  # rank, payload bytes, record bytes; then the record


# numpy's elementwise ops cost about a microsecond on a few KiB where a torch call costs several;
# both round each element once, so the bits are the same. Half types stay with torch.
NP_OPS = {ReduceOp.AVG: np.add, ReduceOp.SUM: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
          ReduceOp.PRODUCT: np.multiply}
NP_DTYPES = frozenset((torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32,
                       torch.int64))


def _encode(entries: dict[int, tuple[int, bytes]], off: int) -> bytes:
    """Frame header: entry count, payload offset, then the entries."""
    out = [struct.pack("<qq", len(entries), off)]
    for r in sorted(entries):
        n, rec = entries[r]
        out.append(_ENTRY.pack(r, n, len(rec)) + rec)
    return b"".join(out)


def _decode(raw: memoryview, into: dict[int, tuple[int, bytes]]) -> int:
    """Merge the entries at the front of ``raw`` into ``into``; returns where the payload starts."""
    count, off = struct.unpack_from("<qq", raw, 0)
    pos = 16
    for _ in range(count):
        r, n, k = _ENTRY.unpack_from(raw, pos)
        pos += _ENTRY.size
        if r not in into:
            into[r] = (n, bytes(raw[pos:pos + k]))
        pos += k
    return off


class _State:
    """One member's side: its scratch frames, accumulator and known entries. The payload sits at a
    fixed offset (room for every member's entry of our record's length), so the views of it are
    made once per (size, dtype) and kept in the runtime's workspace."""

    def __init__(self, ch, flat: torch.Tensor | None, rec: bytes, src: torch.Tensor | None, cap: int):
        self.ch, self.grank = ch, ch.rank
        self.tr = ch.transport
        self.workspace = ch.workspace if ch.workspace is not None else {}
        self.nbytes = 0 if flat is None else flat.numel() * flat.element_size()
        self.off = -(-(16 + ch.size * (_ENTRY.size + len(rec))) // 8) * 8  # payload 8-byte aligned
        ws = self.workspace.get(("engine.rd_inband", cap))
        if ws is None:  # frames, and memoryviews of them for struct (no copies, no tensor calls)
            buf = torch.empty(2 * cap, dtype=torch.uint8)
            ws = self.workspace[("engine.rd_inband", cap)] = (buf[:cap], buf[cap:], memoryview(buf[:cap].numpy()),
                                                              memoryview(buf[cap:].numpy()))
        self.out_frame, self.in_frame, self.out_mv, self.in_mv = ws
        self.entries: dict[int, tuple[int, bytes]] = {ch.rank: (self.nbytes, rec)}
        self.acc = None
        if flat is not None:
            self.frame, self.out_p, self.in_p, self.acc, self.acc_p = self._views(cap, flat.dtype, flat.numel())
            self.acc.copy_(flat if src is None else src)

    def _views(self, cap: int, dtype: torch.dtype, n: int):
        key = ("engine.rd_inband.views", cap, self.off, dtype, n)
        v = self.workspace.get(key)
        if v is None:
            off, end = self.off, self.off + self.nbytes
            out_p, in_p = self.out_frame[off:end].view(dtype), self.in_frame[off:end].view(dtype)
            acc = torch.empty(n, dtype=dtype)
            acc_p = acc
            if dtype in NP_DTYPES:
                out_p, in_p, acc_p = out_p.numpy(), in_p.numpy(), acc.numpy()
            v = self.workspace[key] = (self.out_frame[:end], out_p, in_p, acc, acc_p)
        return v

    def _send_frame(self) -> torch.Tensor:
        head = _encode(self.entries, self.off)
        if len(head) > self.off:  # a record longer than ours to forward (the members disagree anyway)
            return self._wide_frame()
        self.out_mv[:len(head)] = head
        if self.acc is None:
            return self.out_frame[:len(head)]
        if self.acc_p is self.acc:
            self.out_p.copy_(self.acc)
        else:
            np.copyto(self.out_p, self.acc_p)
        return self.frame

    def _wide_frame(self) -> torch.Tensor:
        """The frame with the payload after entries longer than this member's own record provided for:
        its offset travels in the frame header, and the receive buffers have room for any record."""
        off = -(-len(_encode(self.entries, 0)) // 8) * 8
        head = _encode(self.entries, off)
        self.out_mv[:len(head)] = head
        if self.acc is None:
            return self.out_frame[:len(head)]
        self.out_frame[off:off + self.nbytes].view(self.acc.dtype).copy_(self.acc)
        return self.out_frame[:off + self.nbytes]

    def _take(self, off: int, red: Reduction | None) -> None:
        """Reduce (``red``) or copy (``None``) the received payload at ``off`` into the accumulator."""
        inp = self.in_p
        if off != self.off:  # the sender's records have another length (it disagrees anyway)
            inp = self.in_frame[off:off + self.nbytes].view(self.acc.dtype)
            inp = inp.numpy() if self.acc_p is not self.acc else inp
        if self.acc_p is self.acc:
            if red is None:
                self.acc.copy_(inp)
            else:
                red.combine(self.acc, inp)
        elif red is None:
            np.copyto(self.acc_p, inp)
        else:
            with np.errstate(all="ignore"):  # overflow to inf is the caller's business, as with torch
                NP_OPS[red.op](self.acc_p, inp, out=self.acc_p)

    def swap(self, peer: int, tag: int, send: bool, recv: bool, red: Reduction | None) -> None:
        """Send our frame to / receive a frame from group rank ``peer``; merge its entries and
        reduce (``red``) or take (``red=None``) its vector when its size is ours."""
        tr, timeout = self.tr, self.ch.timeout
        hs = []
        if recv:
            hs.append(tr.irecv_upto(self.in_frame, self.ch.peers[peer], tag))
        if send:
            hs.append(tr.isend(self._send_frame(), self.ch.peers[peer], tag))
        tr.wait_all(hs, timeout)
        if not recv:
            return
        off = _decode(self.in_mv, self.entries)
        theirs = self.entries.get(peer)
        if self.acc is not None and theirs is not None and theirs[0] == self.nbytes and self.nbytes:
            self._take(off, red)


def allreduce_rd(ch, flat: torch.Tensor | None, red: Reduction | None, rec: bytes, src: torch.Tensor | None,
                 max_payload: int):
    """Run the rounds over channel ``ch`` (messages of step ``s`` carry tag ``ch.tag + s``). Returns
    every member's ``(bytes, record)`` in group-rank order and the reduced vector (a scratch tensor;
    ``None`` when ``flat`` is ``None``). ``flat`` is not written: the caller checks the entries first."""
    p, grank, tag = ch.size, ch.rank, ch.tag
    st = _State(ch, flat, rec, src, 16 + p * (_ENTRY.size + RECORD_MAX) + max_payload)
    pp = 1 << (p.bit_length() - 1)
    extra = p - pp
    folded = grank < 2 * extra and grank % 2 == 0  # hands its vector to grank + 1, gets the result back
    if grank < 2 * extra:
        st.swap(grank + 1 if folded else grank - 1, tag, send=folded, recv=not folded, red=red)
    if not folded:
        real = participants(p)
        v = real.index(grank)
        for j in range(pp.bit_length() - 1):
            st.swap(real[v ^ (1 << j)], tag + 1 + j, send=True, recv=True, red=red)
    last = tag + pp.bit_length()
    if grank < 2 * extra:
        st.swap(grank + 1 if folded else grank - 1, last, send=not folded, recv=folded, red=None)
    return [st.entries.get(q, (-1, b"")) for q in range(p)], st.acc
