"""CPU time of one step's gradient all-reduce, torch's Gloo against ringlet, per thread, in one job.

    ringlet run -np 4 -- python benchmarks/training_ddp/comm_cpu.py
    ringlet run --cluster -np 4 -- python benchmarks/training_ddp/comm_cpu.py --rounds 20

On a host running at its CPU quota a step costs its CPU time, so the communication's CPU, not its wall
time, decides whether one DDP beats another there. This measures just that part, without the model:
each "step" averages the buckets of the synthetic benchmark's CNN (``--buckets``, elements, in launch
order) the way each DDP does it, all launched before the first is waited for:

* ``torch``: what torch's DDP does per bucket: ``div_(world size)``, then Gloo's ``all_reduce``
  (``async_op=True``);
* ``ringlet``: ``ringlet.allreduce_async_(bucket, op=AVG, check=False)`` (the algorithm ``--algorithm``;
  ``check=False`` as DDP's buckets after their first step);
* ``ringlet-sum``: like torch, ``div_(world size)`` first, then ringlet's SUM all-reduce.

CPU time is read per thread from ``/proc/self/task/*/schedstat`` (nanoseconds), so Gloo's own threads
are counted. Arms alternate in blocks of ``--steps``, the order rotating every round. Results are
checked against the exact average (integer-valued data).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import synthetic_benchmark  # its per-thread /proc reader

import ringlet


def thread_ns() -> dict[str, int]:
    """{"name[tid]": CPU ns} for every thread of this process."""
    return {f"{name}[{tid}]": ns for tid, (name, _, _, _, ns) in synthetic_benchmark._thread_cpu().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--buckets", default="2102794,370816", help="bucket sizes in elements (the CNN's)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--algorithm", default="auto")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    ringlet.init()
    rank, size = dist.get_rank(), dist.get_world_size()
    sizes = [int(x) for x in args.buckets.split(",")]
    # Integer-valued so every sum is exact; rank r contributes r+1 times the pattern.
    patterns = [(torch.arange(n, dtype=torch.float32) % 13) * size for n in sizes]
    buckets = [torch.empty(n) for n in sizes]
    want = [p * (size + 1) / 2 for p in patterns]

    def fill() -> None:
        for b, p in zip(buckets, patterns):
            b.copy_(p).mul_(rank + 1)

    def torch_step() -> None:
        works = []
        for b in buckets:
            b.div_(size)
            works.append(dist.all_reduce(b, async_op=True))
        for w in works:
            w.wait()

    def ringlet_step() -> None:
        works = [ringlet.allreduce_async_(b, op=ringlet.ReduceOp.AVG, algorithm=args.algorithm, check=False)
                 for b in buckets]
        for w in works:
            w.wait()

    def ringlet_sum_step() -> None:
        works = []
        for b in buckets:
            b.div_(size)
            works.append(ringlet.allreduce_async_(b, op=ringlet.ReduceOp.SUM, algorithm=args.algorithm,
                                                  check=False))
        for w in works:
            w.wait()

    arms = [("torch", torch_step), ("ringlet", ringlet_step), ("ringlet-sum", ringlet_sum_step)]
    for name, fn in arms:  # warm up, and check the results
        for _ in range(3):
            fill()
            fn()
            for b, w in zip(buckets, want):
                if not torch.equal(b, w):
                    raise SystemExit(f"rank {rank}: {name}: wrong average")

    wall = {n: [] for n, _ in arms}
    cpu = {n: [] for n, _ in arms}
    per_thread: dict[str, dict[str, int]] = {n: {} for n, _ in arms}
    for r in range(args.rounds):
        k = r % len(arms)
        for name, fn in arms[k:] + arms[:k]:
            dist.barrier()
            t0, th0 = time.perf_counter(), thread_ns()
            for _ in range(args.steps):
                fn()
            t1, th1 = time.perf_counter(), thread_ns()
            wall[name].append((t1 - t0) / args.steps)
            cpu[name].append(sum(v - th0.get(k2, 0) for k2, v in th1.items()) / args.steps)
            for k2, v in th1.items():
                per_thread[name][k2] = per_thread[name].get(k2, 0) + v - th0.get(k2, 0)

    n = args.rounds * args.steps
    lines = []
    for name, _ in arms:
        busy = ", ".join(f"{k} {v / n / 1e6:.2f}" for k, v in sorted(per_thread[name].items()) if v / n > 1e4)
        lines.append(f"rank {rank} {name}: wall {statistics.median(wall[name]) * 1e3:.1f} ms, CPU "
                     f"{statistics.median(cpu[name]) / 1e6:.2f} ms per step (median of rounds); by thread (ms): {busy}")
    for name, _ in arms[1:]:
        ratio = [a / b for a, b in zip(cpu[name], cpu["torch"])]
        lines.append(f"rank {rank} CPU {name}/torch: mean {statistics.mean(ratio):.3f} "
                     f"+- {statistics.stdev(ratio) / len(ratio) ** 0.5:.3f}")
    gathered = [None] * size
    dist.all_gather_object(gathered, "\n".join(lines))
    if rank == 0:
        print(f"{size} ranks, buckets {sizes} elements (fp32), {args.rounds} rounds x {args.steps} steps, "
              f"algorithm {args.algorithm}")
        print("\n".join(gathered), flush=True)
    ringlet.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
