"""Merge the soak's rank files and judge them against the pass criteria (:mod:`soak`).

    python benchmarks/soak_summary.py OUT.json [--markdown]

Criteria: no wrong result and no exception on any rank; on every rank, resident memory at the end at
most 5% above the baseline sample (step 1,000, or the first sample at a third of the run for runs shorter
than 3,000 steps); open descriptors and both thread counts the same in every sample from the first one
after step 0 to the last (step 0 is taken before the first collective, when lazily started threads may
not exist yet).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RSS_GROWTH_LIMIT = 0.05
BASELINE_STEP = 1000
STEADY = ("fds", "threads", "threads_os")


def baseline(samples: list[dict]) -> dict:
    last = samples[-1]["step"]
    want = BASELINE_STEP if last >= 3 * BASELINE_STEP else last // 3
    return next(s for s in samples if s["step"] >= want)


def judge_rank(rec: dict) -> dict:
    """One rank's figures: RSS at the baseline and at the end, its growth, the steady counts first/last."""
    samples = rec["samples"]
    base, end = baseline(samples), samples[-1]
    steady = [s for s in samples if s["step"] > 0] or samples
    out = {"rank": rec["rank"], "errors": rec["error_count"], "exceptions": rec["exceptions"],
           "baseline_step": base["step"], "rss_base": base["rss"], "rss_end": end["rss"],
           "rss_growth": (end["rss"] - base["rss"]) / base["rss"], "rss_step0": samples[0]["rss"],
           "gc_objects_base": base["gc_objects"], "gc_objects_end": end["gc_objects"],
           "wall_seconds": rec["wall_seconds"]}
    for k in STEADY:
        vals = [s[k] for s in steady]
        out[f"{k}_step0"], out[f"{k}_first"], out[f"{k}_last"] = samples[0][k], vals[0], vals[-1]
        out[f"{k}_constant"] = min(vals) == max(vals)
    return out


def verdict(ranks: list[dict]) -> dict:
    errors = sum(r["errors"] for r in ranks)
    growth = max(r["rss_growth"] for r in ranks)
    steady = all(r[f"{k}_constant"] for r in ranks for k in STEADY)
    return {"errors": errors, "max_rss_growth": growth, "resources_constant": steady,
            "passed": errors == 0 and growth < RSS_GROWTH_LIMIT and steady}


def merge(out: str, world: int) -> dict:
    """Read ``OUT.rank0..`` and write ``OUT``: every rank's record plus the judgement."""
    recs = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(world)]
    ranks = [judge_rank(r) for r in recs]
    counts: dict = {}
    for r in recs:
        for k, v in r["counts"].items():
            counts[k] = counts.get(k, 0) + v
    merged = {"transport": recs[0]["transport"], "size": world, "options": recs[0]["options"],
              "groups": recs[0]["groups"], "wall_seconds": max(r["wall_seconds"] for r in recs),
              "payload_bytes": sum(r["payload_bytes"] for r in recs),
              "wire_sent": sum(r["wire_sent"] for r in recs), "calls": counts, "ranks": ranks,
              "verdict": verdict(ranks), "errors": [e for r in recs for e in r["errors"]][:100],
              "records": recs}
    Path(out).write_text(json.dumps(merged, indent=1))
    return merged


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def print_summary(m: dict) -> None:
    v, o = m["verdict"], m["options"]
    print(f"soak: {o['ops']} steps on {m['size']} ranks over {m['transport']} in {m['wall_seconds']:.0f}s; "
          f"{sum(v2 for k, v2 in m['calls'].items() if ':' not in k)} calls, payload {_mib(m['payload_bytes'])} MiB, "
          f"wire sent {_mib(m['wire_sent'])} MiB")
    print(f"soak: {v['errors']} errors; max RSS growth {100 * v['max_rss_growth']:.2f}% (limit "
          f"{100 * RSS_GROWTH_LIMIT:.0f}%); fds and threads constant: {v['resources_constant']}")
    for r in m["ranks"]:
        print(f"  rank {r['rank']}: rss {_mib(r['rss_base'])} -> {_mib(r['rss_end'])} MiB "
              f"({100 * r['rss_growth']:+.2f}% from step {r['baseline_step']}), fds {r['fds_first']}->{r['fds_last']}, "
              f"threads {r['threads_first']}->{r['threads_last']} (os {r['threads_os_first']}->{r['threads_os_last']}), "
              f"gc objects {r['gc_objects_base']}->{r['gc_objects_end']}")
    for e in m["errors"][:10]:
        print(f"  error: {e}")
    print("soak: PASSED" if v["passed"] else "soak: FAILED", flush=True)


def markdown_row(m: dict) -> str:
    """One README table row: transport, steps, calls, bytes, errors, RSS, fds, threads, wall time."""
    rk, v = m["ranks"], m["verdict"]
    calls = sum(n for k, n in m["calls"].items() if ":" not in k)
    rss_b = sum(r["rss_base"] for r in rk) / len(rk)
    rss_e = sum(r["rss_end"] for r in rk) / len(rk)
    fds = f"{min(r['fds_first'] for r in rk)}-{max(r['fds_first'] for r in rk)} / " \
          f"{min(r['fds_last'] for r in rk)}-{max(r['fds_last'] for r in rk)}"
    thr = f"{min(r['threads_os_first'] for r in rk)}-{max(r['threads_os_first'] for r in rk)} / " \
          f"{min(r['threads_os_last'] for r in rk)}-{max(r['threads_os_last'] for r in rk)}"
    return (f"| {m['transport']} | {m['options']['ops']} | {calls} | {m['payload_bytes'] / 2**30:.1f} GiB | "
            f"{m['wire_sent'] / 2**30:.1f} GiB | {v['errors']} | {_mib(rss_b)} | {_mib(rss_e)} | "
            f"{100 * v['max_rss_growth']:+.2f}% | {fds} | {thr} | {m['wall_seconds'] / 60:.1f} min |")


def main() -> None:
    ap = argparse.ArgumentParser(description="Print a merged soak result (OUT written by soak.py).")
    ap.add_argument("out")
    ap.add_argument("--markdown", action="store_true", help="print the README table row instead")
    a = ap.parse_args()
    m = json.loads(Path(a.out).read_text())
    print(markdown_row(m) if a.markdown else "", end="\n" if a.markdown else "")
    if not a.markdown:
        print_summary(m)


if __name__ == "__main__":
    main()
