"""Line up a ``dynamic_link.py adapt`` run with the link changes made during it and with the fixed
configurations measured at each rate (see dynamic_link.sh):

    python benchmarks/dynamic_link/dynamic_link_summary.py --adapt A.json --links LINKS.txt \\
        --fixed 10gbit=F10.json --fixed 1gbit=F1.json [--settle 5] [--guard 5] [--out SUMMARY.md]

``LINKS.txt``: one line per rate in force, ``EPOCH RATE`` (the rate at the start first). Per phase (a
stretch at one rate) it reports the steps from the change to the first switch, the switches, and the
median step time after the phase's last switch (``--settle`` steps later) against the best and the worst
fixed configuration at that rate: the ratio to the best is what "within 10%" is about. That median leaves
out the steps that start within ``--guard`` seconds before the next change: a stamp can lag the change it
records (a stamp written after `ringlet cluster link` returns is 1.6-3.5 s late).
"""
from __future__ import annotations

import argparse
import json
import statistics


def phases(links: list[tuple[float, str]], steps: list[dict]) -> list[dict]:
    """The run's steps split at the link changes: [{rate, start, end, steps}]."""
    out = []
    for k, (start, rate) in enumerate(links):
        end = links[k + 1][0] if k + 1 < len(links) else float("inf")
        mine = [s for s in steps if start <= s["epoch"] - s["seconds"] < end]
        if mine:
            out.append({"rate": rate, "start": start, "end": end, "steps": mine})
    return out


def best_and_worst(fixed: dict) -> tuple[dict, dict]:
    rows = sorted(fixed["configs"], key=lambda r: r["median_s"])
    return rows[0], rows[-1]


def summarize(run: dict, links: list[tuple[float, str]], fixed: dict[str, dict], settle: int,
              guard: float = 0.0) -> list[str]:
    lines = [f"model {run['model']}, {run['ranks']} ranks, a round every {run['every']} steps; profile {run['profile']}",
             "", "| phase | rate | steps | first switch after | switches | step ms after the last switch | "
             "best fixed (ms) | ratio | worst fixed (ms) |", "|---|---|---|---|---|---|---|---|---|"]
    for i, ph in enumerate(phases(links, run["steps"])):
        first, last = ph["steps"][0]["step"], ph["steps"][-1]["step"]
        sws = [s for s in run["switches"] if first <= s["step"] <= last]
        after = (sws[-1]["step"] if sws else first) + settle
        times = [s["seconds"] for s in ph["steps"]
                 if s["step"] >= after and s["epoch"] - s["seconds"] < ph["end"] - guard]
        ms = statistics.median(times) * 1e3 if times else float("nan")
        delay = f"{sws[0]['step'] - first} steps" if sws and i > 0 else ("-" if not sws else "start")
        what = "; ".join(f"{s['step']}: {s['op']} {s['old']} -> {s['new']}" for s in sws) or "none"
        if ph["rate"] in fixed:
            best, worst = best_and_worst(fixed[ph["rate"]])
            b, w = best["median_s"] * 1e3, worst["median_s"] * 1e3
            cols = [f"{b:.1f} ({best['algorithm']}:{best['cap_mb']:g})", f"{ms / b:.3f}",
                    f"{w:.1f} ({worst['algorithm']}:{worst['cap_mb']:g})"]
        else:
            cols = ["-", "-", "-"]
        lines.append(f"| {i} | {ph['rate']} | {first}-{last} | {delay} | {what} | {ms:.1f} | " + " | ".join(cols) + " |")
    for rate, f in fixed.items():
        lines += ["", f"fixed configurations at {rate} (median step ms): " + ", ".join(
            f"{r['algorithm']}:{r['cap_mb']:g} {r['median_s'] * 1e3:.1f}" for r in sorted(f["configs"],
                                                                                       key=lambda r: r["median_s"]))]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--adapt", required=True)
    parser.add_argument("--links", required=True)
    parser.add_argument("--fixed", action="append", default=[], metavar="RATE=PATH")
    parser.add_argument("--settle", type=int, default=5)
    parser.add_argument("--guard", type=float, default=5.0, help="seconds before a change left out")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    with open(args.adapt) as f:
        run = json.load(f)
    with open(args.links) as f:
        links = [(float(a), b) for a, b in (line.split() for line in f if line.strip())]
    fixed = {}
    for spec in args.fixed:
        rate, _, path = spec.partition("=")
        with open(path) as f:
            fixed[rate] = json.load(f)
    text = "\n".join(summarize(run, links, fixed, args.settle, args.guard))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
