"""Merge the soak's rank files and judge them against the pass criteria (:mod:`soak`).

    python benchmarks/soak/soak_summary.py OUT.json [--markdown]

Criteria: no wrong result and no exception on any rank; on every rank, private resident memory
(anonymous and file-backed) at the end less than 5% above the baseline sample (step 1,000, or the first
sample at a third of the run for runs shorter than 3,000 steps); open descriptors and both thread counts
the same in every sample from the first one after step 0 to the last (step 0 is taken before the first
collective, when lazily started threads may not exist yet).

The shared-memory part of the resident size is reported, not judged: it is the shm transport's rings,
allocated in full in ``/dev/shm`` when the job starts and counted in a process's resident size page by
page as the rings are first written (docs/testing.md, "The soak").
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RSS_GROWTH_LIMIT = 0.05
BASELINE_STEP = 1000
STEADY = ("fds", "threads", "threads_os")


def baseline(samples: list[dict], step: int = BASELINE_STEP) -> dict:
    """The first sample at ``step`` or later (at a third of the run when the run is shorter than 3 x step)."""
    last = samples[-1]["step"]
    want = step if last >= 3 * step else last // 3
    return next(s for s in samples if s["step"] >= want)


def judge_rank(rec: dict, base_step: int = BASELINE_STEP) -> dict:
    """One rank's figures: RSS at the baseline and at the end, its growth, the steady counts first/last."""
    samples = rec["samples"]
    base, end = baseline(samples, base_step), samples[-1]
    steady = [s for s in samples if s["step"] > 0] or samples
    out = {"rank": rec["rank"], "errors": rec["error_count"], "exceptions": rec["exceptions"],
           "baseline_step": base["step"], "rss_base": base["rss_private"], "rss_end": end["rss_private"],
           "rss_growth": (end["rss_private"] - base["rss_private"]) / base["rss_private"],
           "rss_total_base": base["rss"], "rss_total_end": end["rss"],
           "rss_total_growth": (end["rss"] - base["rss"]) / base["rss"], "rss_step0": samples[0]["rss_private"],
           "shmem_base": base["rss_shmem"], "shmem_end": end["rss_shmem"],
           "gc_objects_base": base["gc_objects"], "gc_objects_end": end["gc_objects"],
           "wall_seconds": rec["wall_seconds"]}
    for k in STEADY:
        vals = [s[k] for s in steady]
        out[f"{k}_step0"], out[f"{k}_first"], out[f"{k}_last"] = samples[0][k], vals[0], vals[-1]
        out[f"{k}_constant"] = min(vals) == max(vals)
    return out


def verdict(ranks: list[dict], rss_limit: float = RSS_GROWTH_LIMIT) -> dict:
    """Passed: no error on any rank, RSS growth below ``rss_limit`` on every rank, steady counts."""
    errors = sum(r["errors"] for r in ranks)
    growth = max(r["rss_growth"] for r in ranks)
    steady = all(r[f"{k}_constant"] for r in ranks for k in STEADY)
    return {"errors": errors, "max_rss_growth": growth, "rss_limit": rss_limit, "resources_constant": steady,
            "passed": errors == 0 and growth < rss_limit and steady}


def merge(out: str, world: int) -> dict:
    """Read ``OUT.rank0..`` and write ``OUT``: every rank's record plus the judgement."""
    recs = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(world)]
    merged = judged(recs)
    Path(out).write_text(json.dumps(merged, indent=1))
    return merged


def judged(recs: list[dict], base_step: int = BASELINE_STEP) -> dict:
    """The merged result of the ranks' records ``recs``, RSS growth judged from ``base_step``."""
    world = len(recs)
    ranks = [judge_rank(r, base_step) for r in recs]
    counts: dict = {}
    for r in recs:
        for k, v in r["counts"].items():
            counts[k] = counts.get(k, 0) + v
    merged = {"transport": recs[0]["transport"], "size": world, "options": recs[0]["options"],
              "groups": recs[0]["groups"], "wall_seconds": max(r["wall_seconds"] for r in recs),
              "payload_bytes": sum(r["payload_bytes"] for r in recs),
              "wire_sent": sum(r["wire_sent"] for r in recs), "calls": counts, "ranks": ranks,
              "verdict": verdict(ranks, recs[0]["options"].get("rss_limit", RSS_GROWTH_LIMIT)),
              "errors": [e for r in recs for e in r["errors"]][:100],
              "records": recs}
    return merged


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def print_summary(m: dict) -> None:
    v, o = m["verdict"], m["options"]
    print(f"soak: {o['ops']} steps on {m['size']} ranks over {m['transport']} in {m['wall_seconds']:.0f}s; "
          f"{sum(v2 for k, v2 in m['calls'].items() if ':' not in k)} calls, payload {_mib(m['payload_bytes'])} MiB, "
          f"wire sent {_mib(m['wire_sent'])} MiB")
    print(f"soak: {v['errors']} errors; max private RSS growth {100 * v['max_rss_growth']:.2f}% (limit "
          f"{100 * v['rss_limit']:.0f}%); fds and threads constant: {v['resources_constant']}")
    for r in m["ranks"]:
        print(f"  rank {r['rank']}: private rss {_mib(r['rss_base'])} -> {_mib(r['rss_end'])} MiB "
              f"({100 * r['rss_growth']:+.2f}% from step {r['baseline_step']}), shmem {_mib(r['shmem_base'])} -> "
              f"{_mib(r['shmem_end'])} MiB, fds {r['fds_first']}->{r['fds_last']}, "
              f"threads {r['threads_first']}->{r['threads_last']} "
              f"(os {r['threads_os_first']}->{r['threads_os_last']}), "
              f"gc objects {r['gc_objects_base']}->{r['gc_objects_end']}")
    for e in m["errors"][:10]:
        print(f"  error: {e}")
    print("soak: PASSED" if v["passed"] else "soak: FAILED", flush=True)


def _span(rk: list[dict], key: str) -> str:
    lo, hi = min(r[key] for r in rk), max(r[key] for r in rk)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def markdown_row(m: dict) -> str:
    """One README table row: transport, steps, calls, bytes, errors, private RSS (mean over ranks) at the
    baseline and the end with the largest growth, total RSS growth, shmem, fds, threads, wall time."""
    rk, v = m["ranks"], m["verdict"]
    calls = sum(n for k, n in m["calls"].items() if ":" not in k)
    mean = lambda key: _mib(sum(r[key] for r in rk) / len(rk))  # noqa: E731
    total = max(r["rss_total_growth"] for r in rk)
    return (f"| {m['transport']} | {m['options']['ops']} | {calls} | {m['payload_bytes'] / 2**30:.1f} GiB | "
            f"{m['wire_sent'] / 2**30:.1f} GiB | {v['errors']} | {mean('rss_base')} | {mean('rss_end')} | "
            f"{100 * v['max_rss_growth']:+.2f}% | {100 * total:+.2f}% | {mean('shmem_base')} -> {mean('shmem_end')} | "
            f"{_span(rk, 'fds_first')} / {_span(rk, 'fds_last')} | "
            f"{_span(rk, 'threads_os_first')} / {_span(rk, 'threads_os_last')} | {m['wall_seconds'] / 60:.1f} min |")


HEADER = ("| transport | steps | calls (all ranks) | payload | wire sent | errors | private RSS at step 1,000 "
          "(MiB, mean) | at the end | growth (max rank) | total RSS growth (max rank) | shmem (MiB, mean) | "
          "fds first / last | OS threads first / last | wall |\n|" + "---|" * 14)


def main() -> None:
    ap = argparse.ArgumentParser(description="Print a merged soak result (OUT written by soak.py).")
    ap.add_argument("out")
    ap.add_argument("--markdown", action="store_true", help="print the README table row instead")
    ap.add_argument("--baseline", type=int, default=BASELINE_STEP, help="step RSS growth is measured from")
    a = ap.parse_args()
    m = judged(json.loads(Path(a.out).read_text())["records"], a.baseline)
    if a.markdown:
        print(markdown_row(m))
    else:
        print_summary(m)


if __name__ == "__main__":
    main()
