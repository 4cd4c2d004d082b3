"""What the heap decay (ringlet.memory) costs a training loop: steps with and without it, in alternating
blocks in one process, and the cost of one trim derived from the difference.

    ringlet run -np 1 -- python benchmarks/soak/heap_decay_cost.py --interval 1 --block-seconds 20 --rounds 4

Run it under ``ringlet run`` so that the rank has the glibc thresholds training gets there (they are
set at process start). One rank trains the synthetic benchmark's model (``--model``) with SGD on random
data; ringlet is not initialised, so the only decay thread is the one this script starts in the
``decay`` blocks. A short ``--interval`` magnifies the effect: the cost per trim is
``(step_on - step_off) * steps / trims`` per block, and the overhead at another interval ``T`` is that
cost over ``T`` seconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import synthetic_benchmark  # noqa: E402  (the models of the synthetic benchmark)

from ringlet import memory  # noqa: E402


def _block(model, opt, data, target, seconds: float, decay_interval: float | None) -> tuple[float, int, int]:
    """Train for ``seconds``; return (mean step seconds, steps, trims)."""
    decay = memory.HeapDecay(decay_interval) if decay_interval else None
    steps, t0 = 0, time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(data), target).backward()
            opt.step()
            steps += 1
    finally:
        elapsed = time.perf_counter() - t0
        if decay is not None:
            decay.stop()
    return elapsed / steps, steps, (decay.trims if decay is not None else 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--interval", type=float, default=1.0, help="decay interval in the decay blocks (s)")
    p.add_argument("--block-seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    torch.manual_seed(0)
    model = getattr(synthetic_benchmark, args.model)()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    shape = (args.batch_size, 3, 32, 32) if args.model == "cnn" else (args.batch_size, 3 * 32 * 32)
    data, target = torch.randn(shape), torch.randint(0, 10, (args.batch_size,))
    _block(model, opt, data, target, 3.0, None)  # warm-up
    ratios, costs = [], []
    for r in range(args.rounds):
        order = (None, args.interval) if r % 2 == 0 else (args.interval, None)
        res = {arm: _block(model, opt, data, target, args.block_seconds, arm) for arm in order}
        (off, _, _), (on, steps, trims) = res[None], res[args.interval]
        ratios.append(on / off)
        costs.append((on - off) * steps / max(trims, 1))
        print(f"round {r}: step off {off * 1e3:.2f} ms, on {on * 1e3:.2f} ms ({trims} trims in {steps} steps): "
              f"ratio {on / off:.4f}, {costs[-1] * 1e3:.2f} ms per trim", flush=True)
    cost = statistics.median(costs)
    print(f"{args.model}, batch {args.batch_size}, interval {args.interval} s: step ratio on/off median "
          f"{statistics.median(ratios):.4f}; cost per trim median {cost * 1e3:.2f} ms; overhead at the "
          f"default {memory.DEFAULT_INTERVAL:.0f} s interval {cost / memory.DEFAULT_INTERVAL * 100:.3f}%")


if __name__ == "__main__":
    main()
