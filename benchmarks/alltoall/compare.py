"""The before/after table from alternating runs of ``alltoall_bench.py`` (old code, new code, ...).

    python benchmarks/alltoall/compare.py results/one_host_4p_before_*.json -- results/one_host_4p_after_*.json

Per size and arm: the median over the runs of the arm's time divided by Gloo's ``all_to_all_single`` in
the same job (a ratio, so that the load of the moment cancels as far as it can), with the range over the
runs in brackets, and the median milliseconds.
"""
from __future__ import annotations

import json
import statistics
import sys

ARMS = (("before", "pairwise"), ("before", "auto"), ("before", "engine"), ("after", "pairwise"), ("after", "auto"),
        ("after", "recv"), ("after", "recv_unchecked"), ("after", "engine"), ("before", "mpi"), ("after", "mpi"))


def load(paths):
    return [json.load(open(p)) for p in paths]


def main() -> None:
    args = sys.argv[1:]
    cut = args.index("--")
    runs = {"before": load(args[:cut]), "after": load(args[cut + 1:])}
    sizes = [r["bytes"] for r in runs["before"][0]["rows"]]
    head = "| size per rank | " + " | ".join(f"{w} {a} / gloo" for w, a in ARMS) + " |"
    print(head)
    print("|---|" + "---|" * len(ARMS))
    for i, size in enumerate(sizes):
        cells = []
        for who, arm in ARMS:
            ratios = [r["rows"][i]["ms"][arm] / r["rows"][i]["ms"]["gloo"] for r in runs[who]
                      if arm in r["rows"][i]["ms"]]
            ms = [r["rows"][i]["ms"][arm] for r in runs[who] if arm in r["rows"][i]["ms"]]
            cells.append(f"{statistics.median(ratios):.2f} [{min(ratios):.1f}-{max(ratios):.1f}] "
                         f"({statistics.median(ms):.1f} ms)" if ratios else "-")
        print(f"| {size >> 10} KiB | " + " | ".join(cells) + " |")
    gloo = {w: [statistics.median(r["rows"][i]["ms"]["gloo"] for r in runs[w]) for i in range(len(sizes))]
            for w in runs}
    print("\nGloo's own all_to_all_single, median ms per size: "
          + "; ".join(f"{w}: " + ", ".join(f"{g:.2f}" for g in gloo[w]) for w in runs))


if __name__ == "__main__":
    main()
