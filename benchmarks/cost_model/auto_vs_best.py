"""``auto`` against every fixed all-reduce algorithm measured in the same ``ringlet bench`` run.

    python benchmarks/cost_model/auto_vs_best.py bench.json[:LABEL] ... [--out table.md]

Per size: the time of ``ringlet:auto`` over the best fixed algorithm's (in-place and out-of-place
times averaged, as both ran in the same job), the best and worst fixed algorithms, and auto's rank
among all of them. The target: within 10% of the best at every size, and never the worst.

Where the sweep ran with ``--predict PROFILE`` and that file is at hand, two more columns tell the
choice from the timing: the algorithm ``auto`` chose (the profile's model, as ``RINGLET_PROFILE`` installed
it), and that algorithm's own fixed row over the best. ``auto``'s row and the row of the algorithm it ran
are two timings of the same calls, so where they differ the difference is the bed's noise.
"""
from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

from ringlet.tuning import select
from ringlet.tuning.model import Model
from ringlet.tuning.profile import Profile


def _time(row: dict) -> float:
    return (row["ip_us"] + row["oop_us"]) / 2


def _chooser(meta: dict):
    """``size -> algorithm`` under the profile the sweep predicted with, or None where there is none."""
    argv = meta.get("argv") or []
    if "--predict" not in argv:
        return None
    path = argv[argv.index("--predict") + 1]
    if not os.path.exists(path):
        return None
    profile = Profile.load(path)
    model, host_of = Model(profile.network), profile.fingerprint.host_of()
    caps = select.Capabilities(native_small=meta.get("transport") == "mpi")  # as the transports declare
    return lambda size: select.allreduce(select.AUTO, len(host_of), size, host_of, caps, model)


def table(path: str, label: str) -> list[str]:
    data = json.load(open(path))
    rows, choose = data["rows"], _chooser(data.get("meta") or {})
    by_size: dict[int, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["collective"] == "allreduce" and r["impl"].startswith("ringlet:"):
            by_size[r["size"]][r["impl"].split(":", 1)[1]] = _time(r)
    out = []
    for size in sorted(by_size):
        times = by_size[size]
        if "auto" not in times or len(times) < 2:
            continue
        fixed = {k: v for k, v in times.items() if k != "auto"}
        best, worst = min(fixed, key=fixed.get), max(fixed, key=fixed.get)
        ratio = times["auto"] / fixed[best]
        rank = 1 + sum(v < times["auto"] for v in fixed.values())
        ok = ratio <= 1.10 and times["auto"] < fixed[worst]
        chosen = choose(size) if choose else None
        extra = f" {chosen} | {fixed[chosen] / fixed[best]:.2f} |" if chosen in fixed else " | |"
        out.append(f"| {label} | {size} | {times['auto']:.0f} | {best} {fixed[best]:.0f} | {worst} {fixed[worst]:.0f} "
                   f"| {ratio:.2f} | {rank}/{len(times)} | {'yes' if ok else 'no'} |{extra}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="bench JSON files, each PATH or PATH:LABEL")
    ap.add_argument("--out", help="write the markdown here (default: stdout)")
    args = ap.parse_args()
    lines = ["| cluster | size (B) | auto (us) | best fixed (us) | worst fixed (us) | auto / best | auto's rank "
             "| within 10% and not worst | auto's choice | its fixed row / best |",
             "|---|---:|---:|---|---|---:|---:|:-:|---|---:|"]
    for item in args.inputs:
        path, _, label = item.partition(":")
        lines += table(path, label or path)
    text = "\n".join(lines) + "\n"
    if args.out:
        open(args.out, "w").write(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
