"""CPU and wall time of each layer of a small checked all-reduce, entered at each layer's own entry point
in interleaved blocks: what the per-call path adds on top of the carrier's round.

    ringlet run -np 4 --transport shm -- python benchmarks/small_messages/small_layers.py [BLOCKS]

Layers, each including the ones below it: ``public`` (``ringlet.allreduce_``), ``submit``
(``Runtime.submit_op`` of the collective layer's request), ``request.run`` (channel, record, engine),
``engine`` (the engine's all-reduce entry, ``engine.allreduce.allreduce_``), ``small.allreduce_`` (the
round, the check, the reduction) and ``small_round`` (the transport's round alone). Rank 0 prints the medians over blocks of 500 calls
of 4 KiB (``small_profile._timed``); CPU is this process's user + system time per call.
"""
from __future__ import annotations

import sys

import torch

import ringlet
from ringlet import collectives
from ringlet.engine import small
from ringlet.engine.allreduce import allreduce_
from ringlet.engine.meta import Kind, Meta
from ringlet.engine.requests import AllreduceRequest
from ringlet.types import reduction
from small_profile import _timed  # interleaved blocks, medians of wall and CPU time per call

CALLS = 500


def layers(rt, t: torch.Tensor) -> dict:
    g, red, flat = rt.world, reduction("sum"), t.view(-1)
    meta = Meta.of("", Kind.ALLREDUCE, t, op=red.op)
    request = AllreduceRequest(g, t, red, "auto", 1.0, 1.0, True)
    how = small.carrier(rt.channel(g)) if small.takes(rt.channel(g), flat.numel() * flat.element_size()) else None
    runs = {
        "public": lambda: ringlet.allreduce_(t),
        "submit": lambda: rt.submit_op(request, sync=True).wait(),
        "request.run": lambda: request.run(rt.channel(g)),
        "engine": lambda: allreduce_(rt.channel(g), flat, red, "auto", 1.0, 1.0, meta),
        "small.allreduce_": lambda: small.allreduce_(rt.channel(g), flat, red, meta),
    }
    if how == "mailbox":
        rec = meta.encode()
        runs["small_round"] = lambda: rt.transport.small_round(rec, flat, rt.options.timeout)
    return runs


def main() -> None:
    blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    ringlet.init()
    rt = collectives.runtime()
    runs = layers(rt, torch.ones(1024))
    res = _timed(runs, ringlet.barrier, CALLS * blocks, blocks)
    if ringlet.rank() == 0:
        print(f"# {ringlet.size()} ranks, 4 KiB, ringlet on {rt.transport.name}: medians of {blocks} blocks")
        for name, (wall, cpu, _) in res.items():
            print(f"{name:18s} wall {wall * 1e6:6.1f} us  cpu {cpu * 1e6:6.1f} us")
    ringlet.shutdown()


if __name__ == "__main__":
    main()
