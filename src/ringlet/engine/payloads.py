"""Compressed payloads laid out block by block: what the compressed collectives
(:mod:`ringlet.engine.compressed`, :mod:`ringlet.engine.compressed_rs`) share.

A flat buffer is cut into one block per member; each block is compressed on its own and the blocks'
payloads lie end to end in one byte buffer (:class:`Blocks`). An empty block has an empty payload and is
never compressed. :class:`Contexts` hands out decompression contexts by block size, and
:func:`workspace_bytes` keeps the byte buffers that payloads travel in between calls.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

from . import ops
from .channel import Channel

if TYPE_CHECKING:
    from ..compression.base import Compressor

__all__ = ["Blocks", "Contexts", "put_payload", "starts", "workspace_bytes"]


def put_payload(dst: torch.Tensor, payload: torch.Tensor, comp: Compressor) -> None:
    """Copy ``payload`` into its slot ``dst`` of a byte buffer; ``ValueError`` when its size or type is
    not what the compressor's ``wire_bytes`` promised."""
    if payload.dtype != torch.uint8 or payload.numel() != dst.numel():
        raise ValueError(f"compressor {comp.name} produced {payload.numel()} x {payload.dtype}, but its wire_bytes "
                         f"promise {dst.numel()} x torch.uint8")
    dst.copy_(payload.reshape(-1))


def starts(sizes: Sequence[int]) -> tuple[int, ...]:
    """The offset of each size when laid end to end."""
    out, at = [], 0
    for s in sizes:
        out.append(at)
        at += s
    return tuple(out)


def workspace_bytes(ch: Channel, key: tuple, nbytes: int, device: torch.device) -> torch.Tensor:
    """``nbytes`` bytes under ``key`` of the channel's workspace, kept between calls (fresh buffers of tens
    of MiB cost a page fault per 4 KiB every call); a fresh buffer when the channel has no workspace."""
    ws = ch.workspace
    if ws is None:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    buf = ws.get(key)
    if buf is None or buf.numel() < nbytes:
        buf = ws[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return buf[:nbytes]


@dataclass(frozen=True, slots=True)
class Blocks:
    """The buffer cut into one block per member, and the blocks' payloads laid end to end in a byte
    buffer (an empty block has an empty payload: it is never compressed)."""

    counts: tuple[int, ...]
    offsets: tuple[int, ...]
    wire: tuple[int, ...]
    wire_offsets: tuple[int, ...]

    @staticmethod
    def of(n: int, p: int, comp: Compressor) -> "Blocks":
        """``n`` elements in Horovod's split over ``p`` members (:func:`ringlet.engine.ops.split_rows`)."""
        return Blocks.of_counts(ops.split_rows(n, p), comp)

    @staticmethod
    def of_counts(counts: Sequence[int], comp: Compressor) -> "Blocks":
        """Blocks of the given element ``counts``, in member order."""
        wire = [comp.wire_bytes(c) if c else 0 for c in counts]
        return Blocks(tuple(counts), starts(counts), tuple(wire), starts(wire))

    @property
    def total_wire(self) -> int:
        return sum(self.wire)

    def elems(self, t: torch.Tensor, j: int) -> torch.Tensor:
        return t[self.offsets[j]:self.offsets[j] + self.counts[j]]

    def payload(self, buf: torch.Tensor, j: int) -> torch.Tensor:
        return buf[self.wire_offsets[j]:self.wire_offsets[j] + self.wire[j]]


class Contexts:
    """Decompression contexts by block size. A context holds local facts (the element count, the dtype),
    so one from compressing any float32 block of a size serves every payload of that size, other
    members' too; a size this member has not compressed gets its context from compressing zeros (with a
    scratch state)."""

    __slots__ = ("comp", "device", "by_size")

    def __init__(self, comp: Compressor, device: torch.device):
        self.comp, self.device = comp, device
        self.by_size: dict[int, Any] = {}

    def compress(self, block: torch.Tensor, state: dict) -> torch.Tensor:
        payload, ctx = self.comp.compress(block, state)
        self.by_size.setdefault(block.numel(), ctx)
        return payload

    def of(self, numel: int) -> Any:
        if numel not in self.by_size:
            self.compress(torch.zeros(numel, dtype=torch.float32, device=self.device), {})
        return self.by_size[numel]
