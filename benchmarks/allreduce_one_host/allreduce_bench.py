"""Every ringlet all-reduce algorithm against the backend's own (native Gloo) on one host.

Launch with the torch transport; ``--shm`` also times ringlet over the shared-memory transport in the
same run, on the same data, so the ratios are side by side::

    ringlet run -np 4 --transport torch -- python benchmarks/allreduce_one_host/allreduce_bench.py --shm \
        --out benchmarks/allreduce_one_host/results/sweep_4p.md

Each number is the slowest rank's median over timing blocks that interleave all implementations
(A B C A B C ...), so a slow spell of a shared machine hits every one of them alike; a
correctness check of every candidate runs after the timed iterations. The baseline ``gloo`` is a bare
``torch.distributed.all_reduce`` (what a user calls without ringlet); ``torch:native`` is the same call
made through ringlet (with its metadata check unless ``--no-check``).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import torch

import ringlet
from ringlet.algorithms import reference
from ringlet.benchmarking import busbw, fmt_size, integer_data, iterations_for, parse_size, time_interleaved
from ringlet.runtime import Runtime


def sizes_between(lo: int, hi: int, factor: int) -> list[int]:
    out = []
    s = lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min", default="4K")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--algorithms", default="all", help="comma list of ringlet algorithms, or 'all'")
    ap.add_argument("--shm", action="store_true", help="also time ringlet over the shm transport")
    ap.add_argument("--no-check", dest="check", action="store_false",
                    help="skip ringlet's per-op metadata exchange (RINGLET_CHECK=0)")
    ap.add_argument("--out", default="", help="write a markdown report (rank 0)")
    ap.add_argument("--json", default="", help="write raw results as JSON (rank 0)")
    args = ap.parse_args()

    import dataclasses

    import torch.distributed as dist

    opts = dataclasses.replace(ringlet.Options.from_env(), check=args.check)
    ringlet.init(options=opts)
    rt = ringlet.collectives.runtime()
    p, me = ringlet.size(), ringlet.rank()
    algos = ringlet.algorithms.allreduce_names() if args.algorithms == "all" else args.algorithms.split(",")
    candidates: list[tuple[str, Runtime, str]] = [(f"{rt.transport.name}:{a}", rt, a) for a in algos]
    if args.shm:
        from ringlet.transport.shm import ShmTransport

        shm_rt = Runtime(ShmTransport.from_env(), opts)
        candidates += [(f"shm:{a}", shm_rt, a) for a in algos if a != "native"]

    def agree_max(x: float) -> float:
        return ringlet.allreduce(torch.tensor([x], dtype=torch.float64), op="max").item()

    transports = sorted({c[0].split(":")[0] for c in candidates})

    def best_of(row: dict, tr: str) -> tuple[str, float]:
        """Fastest ringlet schedule on transport ``tr`` (native excluded: it is the backend's own)."""
        keys = [k for k in row if k.startswith(tr + ":") and not k.endswith(":native")]
        k = max(keys, key=lambda k: row[k]["busbw"])
        return k.split(":")[1], row[k]["busbw"]

    rows = []
    sizes = sizes_between(parse_size(args.min), parse_size(args.max), args.factor)
    for nbytes in sizes:
        n = nbytes // 4
        row = {"bytes": nbytes}
        expected = reference.allreduce([integer_data(n, r) for r in range(p)])[0]
        t = integer_data(n, me)  # one work buffer for every implementation (its values do not matter)

        def on(crt: Runtime, algo: str) -> None:
            with ringlet.use_runtime(crt):
                ringlet.allreduce_(t, algorithm=algo)

        runs = {"gloo": lambda: dist.all_reduce(t)}
        runs.update({label: functools.partial(on, crt, algo) for label, crt, algo in candidates})
        # Interleaved blocks (A B C A B C ...): a slow spell of this shared machine hits every implementation.
        secs = time_interleaved(runs, dist.barrier, iters=iterations_for(nbytes, 1 << 30, 3, 30))
        got = integer_data(n, me)
        dist.all_reduce(got)
        wrong = int(ringlet.allreduce(torch.tensor([int((got != expected).sum())])).item())
        row["gloo"] = {"sec": (sec := agree_max(secs["gloo"])), "busbw": busbw("allreduce", p, nbytes, sec),
                       "wrong": wrong}
        for label, crt, algo in candidates:
            with ringlet.use_runtime(crt):
                got = ringlet.allreduce(integer_data(n, me), algorithm=algo)
            sec = agree_max(secs[label])
            wrong = int(ringlet.allreduce(torch.tensor([int((got != expected).sum())])).item())
            row[label] = {"sec": sec, "busbw": busbw("allreduce", p, nbytes, sec), "wrong": wrong}
        rows.append(row)
        if me == 0:
            print(f"{fmt_size(nbytes):>9}  gloo {row['gloo']['busbw'] / 1e9:.3f} GB/s  " + "  ".join(
                f"best {tr} {best_of(row, tr)[0]} {best_of(row, tr)[1] / row['gloo']['busbw']:.2f}x"
                for tr in transports), flush=True)

    if me == 0:
        labels = ["gloo"] + [c[0] for c in candidates]
        lines = [f"# All-reduce on one host, {p} processes, float32, metadata check {'on' if args.check else 'off'}",
                 "",
                 f"Command: `ringlet run -np {p} --transport {rt.transport.name} -- python {' '.join(sys.argv)}`",
                 f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; host: {os.uname().nodename}, "
                 f"{os.cpu_count()} cores; torch {torch.__version__}.",
                 "Each cell: median time of the slowest rank (µs; timing blocks of all implementations interleaved) / busbw (GB/s). busbw = 2(p−1)/p · bytes / time.",
                 "#wrong is the number of wrong elements in a check after the timed runs (integer data).",
                 "",
                 "The last columns: busbw of the best ringlet schedule per transport over bare Gloo's.",
                 "",
                 "| size | " + " | ".join(labels) + " | " + " | ".join(f"best {tr} / gloo" for tr in transports)
                 + " | #wrong |",
                 "|---|" + "---|" * (len(labels) + len(transports) + 1)]
        for row in rows:
            cells = [f"{row[l]['sec'] * 1e6:.0f} / {row[l]['busbw'] / 1e9:.3f}" for l in labels]
            ratios = [f"{best_of(row, tr)[1] / row['gloo']['busbw']:.2f} ({best_of(row, tr)[0]})" for tr in transports]
            wrong = sum(row[l]["wrong"] for l in labels)
            lines.append(f"| {fmt_size(row['bytes'])} | " + " | ".join(cells + ratios) + f" | {wrong} |")
        text = "\n".join(lines) + "\n"
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"p": p, "rows": rows}, f, indent=1)
    ringlet.shutdown()


if __name__ == "__main__":
    main()
