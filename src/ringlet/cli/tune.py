"""``ringlet tune``: calibrate the network model of a job's cluster and save its profile.

Outside a job it launches itself (``-np``, ``--transport``, ``--hosts``, ``--cluster`` as for
``ringlet bench``); inside one every rank calibrates (:func:`ringlet.tuning.calibrate.calibrate`) and
rank 0 prints the constants and the fingerprint and saves the profile (default: the per-user cache,
where ``ringlet.init()`` of a job with the same fingerprint finds it).

    ringlet tune -np 4 --transport shm
    ringlet tune --cluster --out cluster-4x1.json
"""
from __future__ import annotations

import dataclasses
import sys

import click

from ..bench.job import inside_job, relaunch
from ..launch import LaunchError

_NOISY = 0.25  # RMS relative residual beyond which the fit is reported as unreliable


@click.command("tune", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-np", "--np", "np_", type=int, default=None,
              help="Ranks to launch (outside a job; default: all slots of --hosts/--cluster, else 2).")
@click.option("--transport", default=None, help="torch, shm or mpi (outside a job; default: as ringlet run).")
@click.option("-H", "--hosts", default=None, help="Host list NAME:SLOTS,... (outside a job).")
@click.option("--cluster", is_flag=True, help="Run on the emulated hosts of `ringlet cluster up`.")
@click.option("--out", "out", default="", help="Profile path (default: the per-user cache, "
              "$RINGLET_PROFILE_DIR or ~/.cache/ringlet/profiles/<fingerprint>.json).")
@click.option("--quick", is_flag=True, help="The quick plan (what RINGLET_TUNE=auto runs at init).")
def tune_cli(np_, transport, hosts, cluster, out, quick):
    """Measure alpha and beta per link class and gamma on this cluster; save the profile."""
    if not inside_job():
        try:
            sys.exit(relaunch("tune", np_, transport, hosts, cluster))
        except LaunchError as exc:
            raise click.ClickException(str(exc)) from None
    sys.exit(_tune_in_job(out, "quick" if quick else "full"))


def _tune_in_job(out: str, plan: str) -> int:
    import ringlet
    from ringlet.engine.probe import Prober
    from ringlet.tuning.calibrate import calibrate
    from ringlet.tuning.profile import cache_path

    rt = ringlet.init(options=dataclasses.replace(ringlet.Options.from_env(), tune="off"))
    prof = calibrate(Prober(rt), plan)
    if rt.rank == 0:
        path = out or cache_path(prof.fingerprint)
        prof.save(path)
        fp = prof.fingerprint
        print(f"# ringlet tune: {fp.describe()}, plan {plan}, {prof.info['seconds']:.1f} s", flush=True)
        print(prof.network.table())
        info = prof.info
        print("steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in info.get("step_seconds", {}).items()))
        print(f"executing one schedule (chain fit, not in the table): {info['op_overhead'] * 1e6:.2f} us")
        per_call = dict(info.get("per_call", {}))
        fit = per_call.pop("fit", None)
        for algorithm, v in sorted(per_call.items()):
            checked = f", checked {v['checked'] * 1e6:.1f} us" if "checked" in v else ""
            ends = f", {v['endpoints']:g} endpoint loads" if "endpoints" in v else ""
            print(f"per call, {algorithm}: measured {v['measured'] * 1e6:.1f} us{checked}, chain constants predict "
                  f"{v['predicted'] * 1e6:.1f} us{ends}")
        if fit:
            check = (f", check {fit['check'] * 1e6:.1f} us (back-to-back agreements: "
                     f"{info['check_overhead'] * 1e6:.1f} us)") if "check" in fit else ""
            eps = f", epsilon {fit['epsilon'] * 1e6:.1f} us" if "epsilon" in fit else ""
            print(f"per-call fit: op {fit['op'] * 1e6:.1f} us, alpha x{fit['alpha_scale']:.3f}{eps}{check} (in the table)")
        large = dict(info.get("large_calls", {}))
        kfit = large.pop("fit", None)
        for algorithm, v in large.items():
            print(f"large call, {algorithm} ({v['segment_bytes'] >> 10} KiB segments): measured "
                  f"{v['measured'] * 1e3:.2f} ms, without kappa predicted {v['predicted'] * 1e3:.2f} ms")
        if kfit:
            print(f"per-byte fit at {kfit['bytes'] >> 10} KiB: kappa {kfit['kappa'] * 1e9:.4f} ns/B (in the table)")
            split = kfit.get("per_class") or {}
            if split:
                verdict = (f"split: {split['intra_bound'] * 1e9:.4f} within hosts, {split['kappa_inter'] * 1e9:.4f} "
                           "between (in the table)" if split["split"] else "kept")
                print(f"per link class: the intra shift bounds kappa at {split['intra_bound'] * 1e9:.4f} ns/B; {verdict}")
        wire = info.get("wire") or {}
        if wire:
            verdict = ("the processors bind: inter beta and kappa from them (in the table)" if wire["split"]
                       else "the links bind: unchanged")
            print(f"lone transfer at {wire['bytes'] >> 10} KiB: {wire['lone_s'] * 1e3:.2f} ms against the shift "
                  f"pattern's {wire['shift_s'] * 1e3:.2f} ms, {wire['lone_beta'] * 1e9:.4f} against "
                  f"{wire['shift_beta'] * 1e9:.4f} ns/B; {verdict}")
        for cls, fit in sorted(info["fit"].items()):
            print(f"fit {cls}: {len(info['samples'][cls]['points'])} samples, {fit['dropped']} dropped, "
                  f"RMS relative residual {100 * fit['residual']:.0f}%")
            if fit["residual"] > _NOISY:
                print(f"# warning: the {cls} timings scatter {100 * fit['residual']:.0f}% around the fit (a busy "
                      "machine or an unsteady link); calibrate again when it is quiet", flush=True)
        print(f"fingerprint {fp.key}  (ranks {fp.ranks}, layout {list(fp.layout)}, transport {fp.transport})")
        print(f"saved {path}", flush=True)
    ringlet.shutdown()
    return 0
