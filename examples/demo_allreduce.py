"""ringlet's first demo: all-reduce with every algorithm on this host, check, and print busbw.

Run it with ``ringlet run -np 4 -- python examples/demo_allreduce.py`` (``make demo`` does).
"""
from __future__ import annotations

import torch

import ringlet
from ringlet.algorithms import reference
from ringlet.benchmarking import busbw, fmt_size, integer_data, iterations_for, time_collective

SIZES = [64 << 10, 1 << 20, 16 << 20]


def available(name: str) -> bool:
    """False for ``native`` on a transport without a backend all-reduce (shm): every rank raises the same
    ValueError there, after the ranks agreed on the call."""
    if name != "native":
        return True
    try:
        ringlet.allreduce(torch.zeros(1), algorithm=name)
        return True
    except ValueError:
        return False


def main() -> None:
    ringlet.init()
    p, me = ringlet.size(), ringlet.rank()
    names = [n for n in ringlet.algorithms.allreduce_names() if available(n)]
    skipped = [n for n in ringlet.algorithms.allreduce_names() if n not in names]
    results: dict[str, list[float]] = {}
    wrong = 0
    for name in names:
        # correctness first: integer data, every rank can compute the expected sum itself
        for n in (0, 1, 7, 1023, (1 << 16) + 3):
            expected = reference.allreduce([integer_data(n, r) for r in range(p)])[0]
            got = ringlet.allreduce(integer_data(n, me), algorithm=name)
            wrong += int((got != expected).sum())
        row = []
        for nbytes in SIZES:
            t = integer_data(nbytes // 4, me)
            sec = time_collective(lambda: ringlet.allreduce_(t, algorithm=name), ringlet.barrier,
                                  iters=iterations_for(nbytes, 256 << 20, 3, 20),
                                  agree_max=lambda x: ringlet.allreduce(torch.tensor([x]), op="max").item())
            row.append(busbw("allreduce", p, nbytes, sec) / 1e9)
        results[name] = row
    wrong = int(ringlet.allreduce(torch.tensor([wrong])).item())
    if me == 0:
        transport = ringlet.collectives.runtime().transport.name
        print(f"ringlet demo: all-reduce on {p} ranks over the {transport} transport, busbw in GB/s")
        print(f"{'algorithm':<18}" + "".join(f"{fmt_size(s):>12}" for s in SIZES))
        for name, row in results.items():
            print(f"{name:<18}" + "".join(f"{v:>12.3f}" for v in row))
        if skipped:
            print(f"not available on the {transport} transport: {', '.join(skipped)}")
        print("correctness: " + ("all results exact" if wrong == 0 else f"{wrong} WRONG ELEMENTS"))
    ringlet.shutdown()
    if wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
