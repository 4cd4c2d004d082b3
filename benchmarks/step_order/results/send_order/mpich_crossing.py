"""Four ranks on four emulated hosts, in pairs (0-2, 1-3), post crossing non-blocking sends and receives
to their partner (32 MiB each way, cut into messages of 1, 4 or 32 MiB) and wait with MPI_Waitall:
no ringlet code. Rank 0 prints the rate of each round.

    ringlet run --cluster --transport mpi -- python -u benchmarks/results/step_order_s18/mpich_crossing.py
"""
import time, numpy as np, sys
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.rank
for seg in [1 << 20, 4 << 20, 32 << 20, 1 << 20, 4 << 20]:
    n = 32 << 20; k = n // seg
    a = np.ones(n // 4, np.float32); b = np.empty_like(a)
    q = r ^ 2  # hosts 0<->2 and 1<->3
    c.Barrier(); t = time.perf_counter()
    reqs = [c.Irecv(b[i*seg//4:(i+1)*seg//4], q, 7) for i in range(k)] + [c.Isend(a[i*seg//4:(i+1)*seg//4], q, 7) for i in range(k)]
    MPI.Request.Waitall(reqs)
    dt = time.perf_counter() - t
    if r == 0: print("seg", seg >> 20, "MiB:", f"{n/dt/1e6:.0f} MB/s", flush=True)
