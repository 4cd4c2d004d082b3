"""Print the target ratios from the JSON files of ``benchmarks/allreduce_cluster/cluster_suite.sh``.

    python benchmarks/allreduce_cluster/summarize.py [benchmarks/allreduce_cluster/results]

Every ratio compares implementations measured in the same run (same job, same data). Times and
bandwidths are the in-place columns (``--column oop`` for out-of-place): in place, no implementation
allocates an output per call, whose page faults blur large sizes. "best ringlet" is the best forced
algorithm at that size, ``auto`` is what ringlet picks by itself.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

GBIT = 1e9 / 8 / 1e9  # 1 Gbit/s in GB/s
SOCKET = 0.1195  # GB/s one TCP stream carried across a 1gbit emulated link here (ringlet/cluster/linktest.py)


def load(path: Path) -> dict:
    rows = json.loads(path.read_text())["rows"]
    out: dict = {}
    for r in rows:
        out.setdefault(r["size"], {})[r["impl"]] = r
    return out


def best(by_impl: dict, key: str, lower: bool) -> tuple[str, float]:
    cands = [(k, v[key]) for k, v in by_impl.items() if k.startswith("ringlet:") and k != "ringlet:auto"]
    return (min if lower else max)(cands, key=lambda kv: kv[1])


def fmt_size(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n >> k} {unit}"
    return f"{n} B"


COL = "ip"


def main(root: Path) -> None:
    lines = ["| result | target | size | measured | ratio |", "|---|---|---|---|---|"]

    def add(result, target, size, measured, ratio):
        lines.append(f"| {result} | {target} | {fmt_size(size)} | {measured} | {ratio:.2f} |")

    for name, transport in (("b_4x1_1gbit_torch", "Gloo p2p"), ("b_4x1_1gbit_mpi", "MPI p2p")):
        p = root / f"{name}.json"
        if not p.exists():
            continue
        d = load(p)
        for size in sorted(s for s in d if s >= 16 << 20):
            big = d[size]
            algo, bw = best(big, f"{COL}_busbw", lower=False)
            add(f"(b) ringlet over {transport}", "busbw >= 0.97 x link", size,
                f"{algo} {bw:.3f} GB/s ({bw / SOCKET:.2f} x a TCP stream's {SOCKET}), "
                f"native {big['native'][COL + '_busbw']:.3f}, mpi {big['mpi'][COL + '_busbw']:.3f}", bw / GBIT)
        small = d.get(4096)
        if small:
            algo, us = best(small, f"{COL}_us", lower=True)
            add(f"(b) ringlet over {transport}", "4 KiB time <= 2 x MPI", 4096,
                f"{algo} {us:.0f} us, auto {small['ringlet:auto'][COL + '_us']:.0f} us, mpi {small['mpi'][COL + '_us']:.0f} us, "
                f"native {small['native'][COL + '_us']:.0f} us" if "ringlet:auto" in small else
                f"{algo} {us:.0f} us, mpi {small['mpi'][COL + '_us']:.0f} us", us / small["mpi"][f"{COL}_us"])
    p = root / "a_1host_4r.json"
    if p.exists():
        d = load(p)
        for size in sorted(s for s in d if s >= 1 << 20):
            algo, bw = best(d[size], f"{COL}_busbw", lower=False)
            add("(a) ringlet on shm", "busbw >= 1.2 x MPI", size,
                f"{algo} {bw:.3f} GB/s, mpi {d[size]['mpi'][COL + '_busbw']:.3f}", bw / d[size]["mpi"][f"{COL}_busbw"])
        if 4096 in d:
            algo, us = best(d[4096], f"{COL}_us", lower=True)
            add("(a) ringlet on shm", "4 KiB time <= 2 x MPI", 4096,
                f"{algo} {us:.0f} us, mpi {d[4096]['mpi'][COL + '_us']:.0f} us", us / d[4096]["mpi"][f"{COL}_us"])
    p = root / "c_2x2_1gbit.json"
    if p.exists():
        d = load(p)
        for size in sorted(s for s in d if s >= 16 << 20):
            h, r = d[size]["ringlet:hierarchical"][f"{COL}_busbw"], d[size]["ringlet:ring"][f"{COL}_busbw"]
            add("(c) hierarchical vs flat ring", ">= 1.35 x", size, f"{h:.3f} vs {r:.3f} GB/s", h / r)
    p = root / "d_4x1_10gbit.json"
    if p.exists():
        d = load(p)
        for size in sorted(s for s in d if s >= 16 << 20):
            algo, bw = best(d[size], f"{COL}_busbw", lower=False)
            add("(d) ringlet vs native Gloo", ">= 1.0 x", size,
                f"{algo} {bw:.3f} vs {d[size]['native'][COL + '_busbw']:.3f} GB/s", bw / d[size]["native"][f"{COL}_busbw"])
    print("\n".join(lines))


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--column"]:
        COL, args = args[1], args[2:]
    main(Path(args[0]) if args else Path(__file__).parent / "results")
