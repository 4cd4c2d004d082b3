"""The bed's own noise in the units of the cost model's accuracy target: one ``ringlet bench`` sweep taken as the
"prediction" of a repeat of the same sweep (same cluster, same commit, same profile), per algorithm.

    python benchmarks/cost_model/repeat_error.py --label "4x1, 1 Gbit/s" A_small.json A.json -- B_small.json B.json

Both sides list the same sweeps in the same order. For every algorithm: the mean absolute relative
difference ``|A − B| / B`` of the in-place times at ≥ 1 MiB and below, as :mod:`prediction_error` reports
the model's error against measurement, so the two tables read side by side: a model cannot be shown to
be closer to a measurement than a second measurement is.
"""
from __future__ import annotations

import argparse
import json
import sys

from prediction_error import MiB, Errors, table


def _rows(paths: list[str]) -> dict[tuple[str, int], float]:
    out = {}
    for path in paths:
        with open(path) as fh:
            for row in json.load(fh).get("rows", []):
                impl = str(row.get("impl", ""))
                if impl.startswith("ringlet:") and row.get("ip_us"):
                    out[(impl.split(":", 1)[1], int(row["size"]))] = float(row["ip_us"])
    return out


def errors(a: dict, b: dict) -> dict[str, Errors]:
    """Per algorithm, ``|a − b| / b`` of the rows both have, split at 1 MiB."""
    found: dict[str, tuple[list, list]] = {}
    for key in sorted(set(a) & set(b)):
        algo, size = key
        large, small = found.setdefault(algo, ([], []))
        (large if size >= MiB else small).append(abs(a[key] - b[key]) / b[key])
    return {k: Errors(tuple(lg), tuple(sm)) for k, (lg, sm) in found.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="run A's JSON files, '--', run B's")
    ap.add_argument("--label", default="repeat")
    args = ap.parse_args(argv)
    raw = sys.argv[1:] if argv is None else argv
    if "--" not in raw:
        ap.error("separate run A's files from run B's with --")
    cut = raw.index("--")
    a_files = [f for f in raw[:cut] if f.endswith(".json")]
    b_files = [f for f in raw[cut + 1:] if f.endswith(".json")]
    a, b = _rows(a_files), _rows(b_files)
    if not set(a) & set(b):
        ap.error("the two runs have no rows in common")
    sys.stdout.write(table([(args.label, errors(a, b))]).replace("predicted", "first run's") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
