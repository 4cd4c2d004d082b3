"""Re-predict a measured ``ringlet bench --predict`` sweep with a profile refitted offline: the per-call
timings a profile already holds (``info["per_call"]``: whole all-reduces of one element per rank; and
``info["large_calls"]``) go through today's :func:`ringlet.tuning.fit.fit_per_call` and ``fit_kappa``,
and every predicted row is predicted again with the refitted network (same segment as before, checked
as the sweep was). The measurements are untouched;
``auto``'s choices in them were made with the old profile. ``--cpus SCOPE:CORES`` sets who shares the
processors (``machine:2``) for a profile written before it was measured.

    python benchmarks/cost_model/refit_predictions.py PROFILE.json BENCH.json [BENCH.json ...] --out-dir DIR [--cpus machine:2]

``--as-is`` keeps the profile's constants and only predicts again: what a change of the model itself
does to a sweep already measured (at the segments that sweep ran).

Writes ``DIR/profile.json`` (the refitted profile) and, per input, ``DIR/<name>`` with the new predictions;
``benchmarks/cost_model/prediction_error.py`` reads those.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from ringlet.tuning.calibrate import large_call_predictor, per_call_parts
from ringlet.tuning.cost import predict_allreduce
from ringlet.tuning.fit import fit_kappa, fit_per_call
from ringlet.tuning.network import LINK_CLASSES, Cpus, LinkCost, Topology
from ringlet.tuning.profile import Profile


def refit(profile: Profile, cpus: Cpus | None = None) -> Profile:
    """The profile with ``op``, the α scale, ``epsilon`` and ``kappa`` fitted from its own per-call and
    large-call timings."""
    host_of = profile.fingerprint.host_of()
    topology, p = Topology(host_of), len(host_of)
    base = dataclasses.replace(profile.network, op=0.0, epsilon=0.0, cpus=cpus or profile.network.cpus)
    calls = [(seen["measured"], *per_call_parts(algorithm, 4 * p, topology, base))
             for algorithm, seen in profile.info["per_call"].items() if algorithm != "fit"]
    op, scale, epsilon = fit_per_call(calls)
    links = {c: LinkCost(base[c].alpha * scale, base[c].beta) for c in LINK_CLASSES}
    network = dataclasses.replace(base, links=links, op=op, epsilon=epsilon, kappa=0.0)
    kappa = refit_kappa(profile, network, topology)
    info = dict(profile.info, refit={"op": op, "alpha_scale": scale, "epsilon": epsilon, "kappa": kappa,
                                     "from": "benchmarks/cost_model/refit_predictions.py"})
    return Profile(profile.fingerprint, dataclasses.replace(network, kappa=kappa), info)


def refit_kappa(profile: Profile, network, topology: Topology) -> float:
    """``kappa`` fitted again from the large calls the profile holds (0 for a profile without them)."""
    large = {a: v for a, v in profile.info.get("large_calls", {}).items() if a != "fit"}
    if not large:
        return 0.0
    predict = large_call_predictor(network, topology, profile.info["large_calls"]["fit"]["bytes"],
                                   {a: (v.get("algorithm", a), v["segment_bytes"]) for a, v in large.items()})
    return fit_kappa([v["measured"] for v in large.values()], predict,
                     max(network[c].beta for c in LINK_CLASSES) or 1e-9)


def repredict(profile: Profile, path: str, out: str) -> int:
    with open(path) as fh:
        data = json.load(fh)
    topology, done = Topology(profile.fingerprint.host_of()), 0
    for row in data["rows"]:
        extra = row.get("extra") or {}
        if "predicted_us" not in extra:
            continue
        algorithm = row["impl"].split(":", 1)[1]
        pred = predict_allreduce(algorithm, row["size"], topology, profile.network,
                                 segment_bytes=extra["pred_segment_bytes"], checked=True)
        us = pred.seconds * 1e6
        measured = row[extra["pred_against"]]
        extra.update(predicted_us=us, pred_err=(us - measured) / measured)
        done += 1
    data.setdefault("meta", {})["refit"] = profile.info["refit"]
    with open(out, "w") as fh:
        json.dump(data, fh, indent=1)
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("benches", nargs="+")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--cpus", default=None, help="SCOPE:CORES, e.g. machine:2 (default: the profile's)")
    ap.add_argument("--as-is", action="store_true", help="keep the profile's constants (no refit)")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    cpus = None
    if args.cpus:
        scope, _, cores = args.cpus.partition(":")
        cpus = Cpus(scope, float(cores or 1))
    if args.as_is:
        prof = Profile.load(args.profile)
        prof.info["refit"] = {"as_is": True, "from": "benchmarks/cost_model/refit_predictions.py"}
    else:
        prof = refit(Profile.load(args.profile), cpus)
        fit = prof.info["refit"]
        print(f"{args.profile}: op {fit['op'] * 1e6:.1f} us, alpha x{fit['alpha_scale']:.3f}, "
              f"epsilon {fit['epsilon'] * 1e6:.1f} us, kappa {fit['kappa'] * 1e9:.4f} ns/B")
    prof.save(os.path.join(args.out_dir, os.path.basename(args.profile)))
    for path in args.benches:
        n = repredict(prof, path, os.path.join(args.out_dir, os.path.basename(path)))
        print(f"  {path}: {n} rows re-predicted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
