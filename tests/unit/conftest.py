"""Helpers shared by the in-process unit tests: a world of ranks as threads running the public API,
deterministic exact-valued inputs, and a step-by-step schedule interpreter (the schedule semantics)."""
from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

import ringlet
from ringlet.runtime import Runtime
from ringlet.transport.inproc import InprocTransport, InprocWorld
from ringlet.types import Options, ReduceOp

OPS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)
# The in-process transport declaring MPI's small-message path (recursive doubling with the records in band
# over partial receives): patch it onto InprocTransport.capabilities to run that path on in-process worlds.
P2P_SMALL = dataclasses.replace(InprocTransport.capabilities, small_path="p2p", small_bytes=64 << 10)


def use_model(monkeypatch, model) -> None:
    """Every runtime made during the test starts with a selector of cost ``model`` (None: the size rule),
    as ``ringlet.init`` gives one from a calibration profile."""
    from ringlet.tuning.select import Selector

    monkeypatch.setattr("ringlet.runtime.Selector", lambda: Selector(model))


def run_world(p: int, fn, *, options: Options | None = None, world: InprocWorld | None = None, **world_kw):
    """Run ``fn(rank)`` on every rank of an in-process world of ``p`` ranks, each thread with its own
    :class:`Runtime` made current by ``use_runtime``; return the results in rank order."""
    opts = options or Options(timeout=20)
    w = world if world is not None else InprocWorld(p, **world_kw)

    def body(tr):
        rt = Runtime(tr, opts)
        with ringlet.use_runtime(rt):
            try:
                return fn(tr.rank)
            finally:
                rt.close()

    return w.run(body)


def make_input(rank: int, count: int, dtype: torch.dtype, op: ReduceOp = ReduceOp.SUM, seed: int = 0,
               shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Integer-valued data that every dtype represents exactly, and whose reduction over <= 8 ranks stays
    exact: [-3, 3] (uint8: [0, 3]) for sums/min/max, {-1, 1, 2} (uint8: {1, 2}) for products."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((rank, count, str(dtype), int(op), seed)).encode()))
    unsigned = dtype == torch.uint8
    if op == ReduceOp.PRODUCT:
        choices = torch.tensor([1, 2] if unsigned else [-1, 1, 2])
        vals = choices[torch.randint(0, len(choices), (count,), generator=g)]
    else:
        vals = torch.randint(0 if unsigned else -3, 4, (count,), generator=g)
    out = vals.to(dtype)
    return out.reshape(shape) if shape is not None else out


def simulate(schedule, buffers: list[tuple[torch.Tensor, ...]], op: ReduceOp = ReduceOp.SUM):
    """Interpret ``schedule`` literally: every transfer of step ``s`` reads the sender's buffers as they
    were after step ``s-1``; receivers reduce or copy when the step ends. Returns new buffers."""
    from ringlet.types import reduction

    bufs = [tuple(b.clone() for b in rank_bufs) for rank_bufs in buffers]
    for step in schedule.steps:
        snap = [tuple(b.clone() for b in rank_bufs) for rank_bufs in bufs]
        for t in step:
            src = snap[t.src][t.src_buf][t.offset:t.offset + t.count]
            dst = bufs[t.dst][t.dst_buf][t.recv_offset:t.recv_offset + t.count]
            if t.reduce:
                reduction(op).combine(dst, src)
            else:
                dst.copy_(src)
    return bufs


@pytest.fixture
def world_runner():
    return run_world
