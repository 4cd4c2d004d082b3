"""When each message of one all-reduce is posted and when the executor's wait for it returns, per rank.

    ringlet cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5
    ringlet run --cluster --transport torch -- python benchmarks/step_order/message_trace.py tree 16M --segment 1M

Every rank wraps its transport's ``isend``/``irecv`` for one timed call (after a warm-up call that builds
and compiles), writes ``OUT/rank<r>.json`` and rank 0 prints every rank's messages in posting order:
kind (``S``/``R``), peer, step (the tag's offset from the call's first), KiB, and the milliseconds since
the call began at which it was posted and its wait returned. A wait returns when the executor asks
for it (in its action order), so a late return may be the executor's order, not the data's: a receive
posted late shows where the plan held it back: a tree that applies one child's segments before the
other's shows as the second child's receives returning late.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import torch

import ringlet
from ringlet.benchmarking import parse_size
from ringlet.algorithms import executor
from ringlet.collectives import runtime
from step_order import RULES  # --off RULE -> the executor's flag (this directory is on the path)


class _Timed:
    """A transport handle whose ``wait`` records when it returned."""

    def __init__(self, handle, record: list, t0: list):
        self.handle, self.record, self.t0 = handle, record, t0

    def wait(self, timeout=None):
        out = self.handle.wait(timeout)
        self.record.append(time.perf_counter() - self.t0[0])
        return out

    def __getattr__(self, name):
        return getattr(self.handle, name)


def traced_call(algorithm: str, x: torch.Tensor) -> tuple[float, list]:
    """Seconds of one all-reduce of ``x`` and its messages ``[kind, peer, tag, bytes, posted, done]``."""
    transport, log, t0 = runtime().transport, [], [0.0]
    isend, irecv = transport.isend, transport.irecv

    def wrap(fn, kind):
        def post(buf, peer, tag):
            rec = [kind, peer, tag, buf.numel() * buf.element_size(), time.perf_counter() - t0[0]]
            log.append(rec)
            return _Timed(fn(buf, peer, tag), rec, t0)
        return post

    transport.isend, transport.irecv = wrap(isend, "S"), wrap(irecv, "R")
    try:
        ringlet.barrier()
        log.clear()
        t0[0] = time.perf_counter()
        ringlet.allreduce_(x, algorithm=algorithm)
        took = time.perf_counter() - t0[0]
    finally:
        transport.isend, transport.irecv = isend, irecv
    return took, log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("algorithm")
    ap.add_argument("size", type=parse_size)
    ap.add_argument("--segment", type=parse_size, default=None, help="executor segment size (bytes)")
    ap.add_argument("--out", default="/tmp/ringlet_message_trace")
    ap.add_argument("--off", choices=sorted(RULES), action="append", default=[],
                    help="turn one of the executor's rules off (repeatable; as step_order.py's off arm)")
    args = ap.parse_args()
    for rule in args.off:
        setattr(executor, RULES[rule], False)
    options = ringlet.Options.from_env()
    if args.segment:
        options = dataclasses.replace(options, segment_bytes=args.segment)
    ringlet.init(options=options)
    x = torch.ones(args.size // 4)
    ringlet.allreduce_(x, algorithm=args.algorithm)  # builds, compiles, touches the scratch
    took, log = traced_call(args.algorithm, x)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{ringlet.rank()}.json"), "w") as fh:
        json.dump({"seconds": took, "messages": log}, fh)
    ringlet.barrier()
    if ringlet.rank() == 0:
        ranks = []
        for r in range(ringlet.size()):
            with open(os.path.join(args.out, f"rank{r}.json")) as fh:
                ranks.append(json.load(fh))
        first = min((m[2] for got in ranks for m in got["messages"]), default=0)  # the call's first tag
        for r, got in enumerate(ranks):
            print(f"rank {r}: {got['seconds'] * 1e3:.1f} ms")
            for kind, peer, tag, nbytes, posted, *done in got["messages"]:
                ended = f"{done[0] * 1e3:8.1f}" if done else "       -"
                print(f"  {kind} peer {peer:>3} step {tag - first:>3} {nbytes >> 10:>8} KiB "
                      f"posted {posted * 1e3:8.1f} done {ended}")
    ringlet.shutdown()


if __name__ == "__main__":
    main()
