"""Where one collective runs: the transport, the group, this rank's place in it and the op's tag space.

A :class:`Channel` is what every flat-buffer operation of the engine takes instead of loose arguments
(transport, peers, tag, segment size, timeout, scratch memory). The runtime hands out one per op
(:meth:`ringlet.runtime.Runtime.channel`), in execution order, so the tags agree on every member.

Tag layout (fits MPI's guaranteed 2^29-1 upper bound in MPICH): group's tag slot 5 bits | op sequence 8 bits |
step 16 bits. Steps in the upper half (``META_STEP`` and above) carry an op's metadata exchange. The last
slot (``P2P_SLOT``) is not a group's: point-to-point messages (:mod:`ringlet.p2p`) carry it, with the
caller's tag in the 24 bits below, so they never meet a collective's.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..algorithms import executor
from ..algorithms.schedule import Schedule
from ..group import Group

GROUP_BITS, SEQ_BITS, STEP_BITS = 5, 8, 16
META_STEP = 1 << (STEP_BITS - 1)
P2P_SLOT = (1 << GROUP_BITS) - 1  # the tag slot of point-to-point messages; groups get the slots below it
P2P_TAGS = 1 << (SEQ_BITS + STEP_BITS)  # point-to-point tags are 0 .. P2P_TAGS - 1


def p2p_tag(tag: int) -> int:
    """The transport tag of point-to-point tag ``tag`` (``0 <= tag < P2P_TAGS``, checked by the caller)."""
    return P2P_SLOT << (SEQ_BITS + STEP_BITS) | tag


def tag_base(tag_slot: int, seq: int) -> int:
    """First tag of the ``seq``-th op of a group in tag slot ``tag_slot`` (``Group.tag_slot``; both wrap
    around)."""
    return ((tag_slot % (1 << GROUP_BITS)) << SEQ_BITS | (seq % (1 << SEQ_BITS))) << STEP_BITS


@dataclass(frozen=True, slots=True)
class Channel:
    """One op's view of the network: ``rank`` is this process's rank in ``group`` (the schedule rank).
    ``selector``: the algorithm selector (a :class:`ringlet.tuning.select.Selector`) handed over by
    whoever builds the channel (:meth:`ringlet.runtime.Runtime.channel`: the runtime's); the operations
    that choose an algorithm ask it, and raise ``ValueError`` on a channel without one."""

    transport: Any
    group: Group
    rank: int
    tag: int
    segment_bytes: int = 4 << 20
    timeout: float | None = None
    workspace: dict | None = None
    selector: Any = None
    peers: tuple[int, ...] = field(init=False)  # transport rank of each schedule rank (the group's ranks)
    size: int = field(init=False)  # members of the group

    def __post_init__(self) -> None:
        # Plain fields, not properties: the executor reads them without calling back into this module.
        object.__setattr__(self, "peers", self.group.ranks)
        object.__setattr__(self, "size", self.group.size)

    @staticmethod
    def world(transport, tag: int = 0, *, segment_bytes: int = 4 << 20, timeout: float | None = None,
              workspace: dict | None = None, selector: Any = None) -> "Channel":
        """A channel over every rank of ``transport`` (one host assumed), outside any runtime: for
        bootstrapping (the hostname exchange) and for running schedules directly in tests."""
        everyone = Group(-1, tuple(range(transport.size)), (0,) * transport.size)
        return Channel(transport, everyone, transport.rank, tag, segment_bytes, timeout, workspace, selector)

    def meta(self) -> "Channel":
        """The same op's channel for its metadata exchange (tags that never meet its data's)."""
        return dataclasses.replace(self, tag=self.tag + META_STEP)

    def run(self, schedule: Schedule, buffers: tuple[torch.Tensor, ...],
            combine: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> None:
        """Run this rank's part of ``schedule`` over ``buffers`` (see :func:`executor.execute`)."""
        executor.execute(schedule, self, buffers, combine)
