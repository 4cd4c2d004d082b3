"""The cost model's error against measurement, per algorithm: a markdown table from ``ringlet bench
--predict`` JSON files.

    ringlet bench --cluster --algorithms all -b 4 -e 256M --predict auto --json 4x1_1gbit.json
    python benchmarks/cost_model/prediction_error.py 4x1_1gbit.json:"4 hosts x 1, 1 Gbit/s" 2x2_1gbit.json \
        --out errors.md

Each input is ``PATH`` or ``PATH:LABEL`` (default label: ranks, hosts and transport from the file);
inputs with the same label are one cluster (a small-size and a large-size sweep, say). For
every cluster and algorithm: the mean absolute relative error ``|predicted − measured| / measured`` of
the rows of at least 1 MiB and of the smaller ones, the largest of each, and whether the means meet the
targets (≤ 10 % at ≥ 1 MiB, ≤ 25 % below).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass

MiB = 1 << 20
TARGET_LARGE, TARGET_SMALL = 0.10, 0.25


@dataclass(frozen=True)
class Errors:
    """Absolute relative errors of one algorithm on one cluster, split at 1 MiB."""

    large: tuple[float, ...]
    small: tuple[float, ...]


def _mean(xs) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _label(meta: dict, path: str) -> str:
    if not meta:
        return path
    return f"{meta.get('ranks', '?')} ranks on {meta.get('hosts', '?')} host(s), {meta.get('transport', '?')}"


def read(path: str) -> tuple[str, dict[str, Errors]]:
    """``(label, errors per algorithm)`` of one bench JSON file; ``ValueError`` naming the file when it
    has no rows with predictions."""
    with open(path) as fh:
        data = json.load(fh)
    found: dict[str, tuple[list, list]] = {}
    for row in data.get("rows", []):
        extra = row.get("extra") or {}
        err = extra.get("pred_err")
        if err is None or not math.isfinite(err) or not str(row.get("impl", "")).startswith("ringlet:"):
            continue
        large, small = found.setdefault(row["impl"].split(":", 1)[1], ([], []))
        (large if row["size"] >= MiB else small).append(abs(err))
    if not found:
        raise ValueError(f"{path}: no rows with predictions (run ringlet bench with --predict)")
    return _label(data.get("meta", {}), path), {a: Errors(tuple(lg), tuple(sm)) for a, (lg, sm) in found.items()}


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}"


def _verdict(e: Errors) -> str:
    ok_large = not e.large or _mean(e.large) <= TARGET_LARGE
    ok_small = not e.small or _mean(e.small) <= TARGET_SMALL
    return "yes" if ok_large and ok_small else "no"


def table(clusters: list[tuple[str, dict[str, Errors]]]) -> str:
    """The markdown table: one row per cluster and algorithm."""
    out = ["| cluster | algorithm | rows | MAE ≥ 1 MiB (%) | max ≥ 1 MiB (%) | MAE < 1 MiB (%) | max < 1 MiB (%) "
           "| within target |",
           "|---|---|---:|---:|---:|---:|---:|:-:|"]
    for label, errors in clusters:
        for algo in sorted(errors):
            e = errors[algo]
            out.append(f"| {label} | {algo} | {len(e.large) + len(e.small)} | {_pct(_mean(e.large))} | "
                       f"{_pct(max(e.large, default=math.nan))} | {_pct(_mean(e.small))} | "
                       f"{_pct(max(e.small, default=math.nan))} | {_verdict(e)} |")
    out.append(f"\nMAE: mean absolute relative error of the predicted against the measured in-place time; "
               f"targets {100 * TARGET_LARGE:.0f} % at ≥ 1 MiB, {100 * TARGET_SMALL:.0f} % below.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="bench JSON files, each PATH or PATH:LABEL")
    ap.add_argument("--out", default="", help="write the markdown here (default: stdout)")
    ap.add_argument("--command", default="", help="the command that produced the inputs, recorded above the table")
    args = ap.parse_args(argv)
    merged: dict[str, dict[str, Errors]] = {}  # files with one label (two sweeps of one cluster) add up
    for item in args.inputs:
        path, _, label = item.partition(":")
        got_label, errors = read(path)
        into = merged.setdefault(label or got_label, {})
        for algo, e in errors.items():
            old = into.get(algo, Errors((), ()))
            into[algo] = Errors(old.large + e.large, old.small + e.small)
    clusters = list(merged.items())
    text = (f"Command: `{args.command}`\n\n" if args.command else "") + table(clusters) + "\n"
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
