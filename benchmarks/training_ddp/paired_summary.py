"""A table of one ``paired_ddp.py`` run: per arm, step time, samples/s of the whole job, the step-time
ratio to the first arm, and the share of the step that is exposed communication, taken as
``1 - local / step`` against the run's ``local`` arm (the same model trained with no communication).

An arm's step time here is its mean ratio to the first arm times the first arm's median step: arms that
synchronise every few steps (local SGD, DiLoCo) have blocks with and without a synchronisation, and the
median block would hide the synchronisations.

    python benchmarks/training_ddp/paired_summary.py paired.txt --ranks 4 --batch 32
"""
from __future__ import annotations

import argparse
import re

_LINE = re.compile(r"^(?P<arm>\S+): step (?P<ms>[\d.]+) ms median")
_RATIO = re.compile(r"step time vs \S+: mean (?P<r>[\d.]+) \+- (?P<se>[\d.]+)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    args = parser.parse_args()
    rows = []
    with open(args.path) as f:
        for line in f:
            m = _LINE.match(line.strip())
            if m:
                r = _RATIO.search(line)
                rows.append((m["arm"], float(m["ms"]), r and r["r"], r and r["se"]))
    base = rows[0][1] if rows else 0.0
    rows = [(arm, base * float(r) if r is not None else ms, r, se) for arm, ms, r, se in rows]
    local = next((ms for arm, ms, _, _ in rows if arm == "local"), None)
    print("| arm | step ms | samples/s (job) | step vs first arm | exposed communication |")
    print("|---|---|---|---|---|")
    for arm, ms, r, se in rows:
        ratio = "1" if r is None else f"{float(r):.3f} ± {float(se):.3f}"
        exposed = "" if local is None or arm == "local" else f"{max(0.0, 1 - local / ms):.0%}"
        print(f"| {arm} | {ms:.1f} | {args.ranks * args.batch / ms * 1e3:.0f} | {ratio} | {exposed} |")


if __name__ == "__main__":
    main()
