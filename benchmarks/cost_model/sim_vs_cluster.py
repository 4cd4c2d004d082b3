"""The simulator against ringlet's own measurements: replay every measured all-reduce row of a
``ringlet bench --predict`` sweep with the calibration profile the sweep was predicted from.

    python benchmarks/cost_model/sim_vs_cluster.py PROFILE.json BENCH.json [BENCH.json ...] [--label L] [--out table.md]

Each ``ringlet:<algorithm>`` row is replayed by :func:`ringlet.sim.simulate` on the profile's topology
and network, at the row's size and with the segment the executor ran (``pred_segment_bytes``, written
by ``--predict``), plus the network's metadata ``check`` when the sweep's calls were checked (the
default; the replay counts the schedule and the per-call constant only). Per algorithm: the mean and
largest absolute relative error against the in-place time, split at 1 MiB. Issue 18's target: within
15 %.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from ringlet.sim import simulate
from ringlet.tuning.network import Topology
from ringlet.tuning.profile import Profile

MiB = 1 << 20
TARGET = 0.15


def errors(profile: Profile, paths: list[str], checked: bool = True) -> dict[str, tuple[list, list]]:
    """Per algorithm: (errors at ≥ 1 MiB, errors below), each ``(simulated − measured) / measured``."""
    topology, network = Topology(profile.fingerprint.host_of()), profile.network
    found: dict[str, tuple[list, list]] = {}
    for path in paths:
        with open(path) as fh:
            rows = json.load(fh)["rows"]
        for r in rows:
            extra = r.get("extra") or {}
            if "pred_segment_bytes" not in extra or not r["ip_us"] > 0:
                continue
            algorithm = r["impl"].split(":", 1)[1]
            got = simulate("allreduce", algorithm, r["size"], topology, network,
                           extra["pred_segment_bytes"], itemsize=4)
            seconds = got.seconds + (network.check if checked else 0.0)
            err = (seconds * 1e6 - r["ip_us"]) / r["ip_us"]
            large, small = found.setdefault(algorithm, ([], []))
            (large if r["size"] >= MiB else small).append(err)
    return found


def _mae(xs: list) -> float:
    return sum(abs(x) for x in xs) / len(xs) if xs else math.nan


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}"


def table(label: str, found: dict[str, tuple[list, list]]) -> list[str]:
    out = []
    for algorithm in sorted(found):
        large, small = found[algorithm]
        ok = "yes" if _mae(large) <= TARGET else "no"
        out.append(f"| {label} | {algorithm} | {len(large) + len(small)} | {_pct(_mae(large))} | "
                   f"{_pct(max((abs(x) for x in large), default=math.nan))} | {_pct(_mae(small))} | {ok} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("benches", nargs="+")
    ap.add_argument("--label", default="")
    ap.add_argument("--unchecked", action="store_true", help="the sweep ran with RINGLET_CHECK=0")
    ap.add_argument("--out", default="")
    ap.add_argument("--append", action="store_true", help="add rows to --out without a header")
    args = ap.parse_args(argv)
    profile = Profile.load(args.profile)
    lines = [] if args.append else [
        "| cluster | algorithm | rows | sim MAE ≥ 1 MiB (%) | max ≥ 1 MiB (%) | sim MAE < 1 MiB (%) | ≤ 15 % at ≥ 1 MiB |",
        "|---|---|---:|---:|---:|---:|:-:|"]
    lines += table(args.label or profile.fingerprint.describe(), errors(profile, args.benches, not args.unchecked))
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "a" if args.append else "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
