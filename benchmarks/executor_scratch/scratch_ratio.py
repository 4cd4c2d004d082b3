from ringlet import algorithms
from ringlet.algorithms import executor
n = 1 << 20
for algo in sorted(algorithms.ALLREDUCE):
    row = []
    for p in (2, 3, 4, 8):
        host_of = tuple(r // 2 for r in range(p))
        sched = algorithms.ALLREDUCE[algo](p, n, host_of)
        worst = max(executor.compile_plan(sched, r, 1 << 16).scratch_elems for r in range(p))
        row.append(f"{worst / n:.3f}")
    print(f"{algo:20s}", row)
