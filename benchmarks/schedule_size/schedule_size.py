"""Memory and build time of every all-reduce schedule at large rank counts, and the time to compile one
rank's plan from it.

    PYTHONPATH=src python benchmarks/schedule_size/schedule_size.py --ranks 1024 --hosts-of 8 --counts 268435456 256

Memory: the schedule's own :meth:`Schedule.nbytes` (arrays, shared ones counted once) where it exists,
else what ``tracemalloc`` sees retained by the build (the tuple-of-``Transfer`` storage). Build time is
one build with the builders' caches cleared (the fastest of ``--repeat``); ``read``: one pass of
``step_arrays`` over all steps (what the simulator reads); ``compile_plan`` is timed for rank 0 with a
1 MiB segment of 4-byte elements.
"""
from __future__ import annotations

import argparse
import time
import tracemalloc

from ringlet import algorithms
from ringlet.algorithms import executor


def _clear_caches() -> None:
    from ringlet.algorithms import direct, halving_doubling, hierarchical, recursive_doubling, ring, torus, tree
    for mod in (direct, halving_doubling, hierarchical, recursive_doubling, ring, torus, tree):
        for name in dir(mod):
            clear = getattr(getattr(mod, name), "cache_clear", None)
            if clear is not None:
                clear()
    executor.compile_plan.cache_clear()


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def measure(algo: str, p: int, count: int, host_of: tuple[int, ...], trace: bool, repeat: int) -> dict:
    build = algorithms.ALLREDUCE[algo]
    built = compiled = float("inf")
    for _ in range(repeat):
        _clear_caches()
        sched, dt = _timed(lambda: build(p, count, host_of))
        built = min(built, dt)
        compiled = min(compiled, _timed(lambda: executor.compile_plan(sched, 0, (1 << 20) // 4))[1])
    if trace:  # a second, traced build (tracemalloc slows the first one down)
        del sched
        _clear_caches()
        tracemalloc.start()
        sched = build(p, count, host_of)
        mem, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    else:
        mem = sched.nbytes()
    lengths, read = _timed(lambda: [len(sched.step_arrays(s)) for s in range(sched.num_steps)])
    return {"algo": algo, "count": count, "steps": sched.num_steps, "transfers": sum(lengths),
            "mem_mb": mem / 1e6, "build_s": built, "read_s": read, "compile_s": compiled}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--hosts-of", type=int, default=8, help="ranks per host (hierarchical, torus)")
    ap.add_argument("--counts", type=int, nargs="+", default=[1 << 28, 256])
    ap.add_argument("--algorithms", nargs="+", default=sorted(algorithms.ALLREDUCE))
    ap.add_argument("--repeat", type=int, default=1, help="report the fastest of this many builds and compiles")
    ap.add_argument("--tracemalloc", action="store_true", help="measure memory with tracemalloc")
    args = ap.parse_args()
    p = args.ranks
    host_of = tuple(r // args.hosts_of for r in range(p))
    trace = args.tracemalloc or not hasattr(algorithms.Schedule, "nbytes")
    print(f"p={p} hosts_of={args.hosts_of} memory={'tracemalloc' if trace else 'Schedule.nbytes'}")
    print(f"{'algorithm':<20}{'count':>11}{'steps':>7}{'transfers':>11}{'MB':>10}{'build s':>9}{'read s':>8}"
          f"{'compile s':>10}")
    for count in args.counts:
        for algo in args.algorithms:
            m = measure(algo, p, count, host_of, trace, args.repeat)
            print(f"{m['algo']:<20}{m['count']:>11}{m['steps']:>7}{m['transfers']:>11}{m['mem_mb']:>10.2f}"
                  f"{m['build_s']:>9.3f}{m['read_s']:>8.3f}{m['compile_s']:>10.3f}", flush=True)


if __name__ == "__main__":
    main()
