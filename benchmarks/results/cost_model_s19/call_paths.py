"""Per-call time of a 16 B all-reduce on 4 ranks three ways: the engine operation ``ringlet tune`` times
(``ops.allreduce_``), the public unchecked call, and the public checked call (what ``ringlet bench``
makes); each sustained (3 × 70 calls, median) and in blocks of 40 after a barrier (the bench's way, 5
blocks, median); the slowest rank's time.

    ringlet cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5
    ringlet run --cluster --transport torch -- python benchmarks/results/cost_model_s19/call_paths.py
"""
import os, time, statistics, sys
import torch, ringlet
from ringlet import collectives as core
from ringlet.engine import ops
from ringlet.types import reduction
from ringlet.types import ReduceOp
ringlet.init()
rt = core.runtime()
ch = rt.channel(rt.world)
p = rt.size
red = reduction(ReduceOp.SUM)
def engine(algo, t):
    ops.allreduce_(ch, t, red, algo)
def public(algo, t):
    ringlet.allreduce_(t, algorithm=algo, check=False)
def checked(algo, t):
    ringlet.allreduce_(t, algorithm=algo, check=True)
def block(fn, algo, n):
    t = torch.ones(p)
    ringlet.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(algo, t)
    return (time.perf_counter() - t0) / n
res = {}
for algo in ("ring", "recursive_doubling"):
    for name, fn in (("engine", engine), ("public", public), ("checked", checked)):
        for fn_ in range(2): fn(algo, torch.ones(p))
        sustained = statistics.median(block(fn, algo, 70) for _ in range(3))
        blocks = statistics.median(block(fn, algo, 40) for _ in range(5))
        res[(algo, name)] = (sustained, blocks)
mx = {}
for k, (a, b) in res.items():
    ta = torch.tensor([a, b], dtype=torch.float64)
    ringlet.allreduce_(ta, op=ReduceOp.MAX)
    mx[k] = ta.tolist()
if rt.rank == 0:
    print("profile:", os.environ.get("RINGLET_PROFILE", "none"))
    for (algo, name), (a, b) in mx.items():
        print(f"{algo:20s} {name:7s} sustained70 {a*1e6:8.0f} us   blocks40 {b*1e6:8.0f} us")
ringlet.shutdown()
