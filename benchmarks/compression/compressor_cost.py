"""CPU cost of each compressor on one model's gradient, one thread, no network.

    python benchmarks/compression/compressor_cost.py --model mlp --compressors powersgd:1 powersgd:2 int8+ef fp16

For every compressor: milliseconds per step of what one rank computes (compress and accumulate its own
payload for the dense ones; ``PowerSGD.allreduce_`` with a no-op all-reduce), with the compressor's state
kept between steps as in training, and the bytes its payload puts on the wire for the whole gradient.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import synthetic_benchmark  # noqa: E402

from ringlet.compression import get  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--compressors", nargs="+", default=["fp16", "bf16", "int8+ef", "topk:0.01+ef",
                                                             "powersgd:1", "powersgd:2", "powersgd:4"])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = getattr(synthetic_benchmark, args.model)()
    shapes = [tuple(p.shape) for p in model.parameters()]
    n = sum(p.numel() for p in model.parameters())
    grad, work, acc = torch.randn(n), torch.empty(n), torch.zeros(n)
    print(f"{args.model}: {n / 1e6:.1f} M parameters, one thread")
    for spec in args.compressors:
        comp, state = get(spec), {}

        def step() -> None:
            work.copy_(grad)
            if comp.reduces_by == "custom":
                comp.allreduce_(work, state, lambda t: None, shapes=shapes)
            else:
                payload, ctx = comp.compress(work, state)
                comp.accumulate_(acc, payload, ctx)

        step(), step()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        ms = (time.perf_counter() - t0) / args.steps * 1e3
        wire = comp.wire_bytes_for(shapes) if hasattr(comp, "wire_bytes_for") else comp.wire_bytes(n)
        print(f"  {spec:14s} {ms:7.1f} ms per step   payload {wire / 1e6:8.2f} MB")


if __name__ == "__main__":
    main()
