"""Ask a Prometheus server the ready queries of docs/metrics.md over its HTTP API; write query and answer.

    python benchmarks/metrics/query.py --url http://127.0.0.1:9090 --out answers.json [--window 30s]

Writes ``{"time", "prometheus", "targets", "queries": [{"name", "query", "result"}]}``, each result as
Prometheus gives it (``[{"metric": {labels}, "value": [time, "value"]}]``). Exits 3 (and writes nothing)
while the job's metrics are not there yet: no step counted on every target, or a query failing.
Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.parse
import urllib.request


def queries(window: str) -> list[tuple[str, str]]:
    w = window
    return [
        ("steps per rank", "ringlet_steps_total"),
        ("exposed-communication share per rank",
         f"rate(ringlet_exposed_comm_seconds_total[{w}]) / rate(ringlet_step_seconds_sum[{w}])"),
        ("mean step seconds per rank", f"rate(ringlet_step_seconds_sum[{w}]) / rate(ringlet_step_seconds_count[{w}])"),
        ("p99 all-reduce latency, seconds",
         f'histogram_quantile(0.99, sum by (le) (rate(ringlet_collective_latency_seconds_bucket{{op="allreduce"}}[{w}])))'),
        ("bytes per second by algorithm", f"sum by (algorithm) (rate(ringlet_collective_bytes_total[{w}]))"),
        ("straggler score", "sort_desc(max by (rank, host) (ringlet_straggler_score))"),
        ("algorithm switches", "sum by (kind) (ringlet_algorithm_switches_total)"),
        ("records the ring dropped", "sum(ringlet_flight_records_dropped_total)"),
        ("liveness", "sum by (rank) (ringlet_liveness_up)"),
    ]


def get(url: str, path: str, params: dict | None = None) -> dict:
    q = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}{path}{q}", timeout=10) as resp:
        body = json.loads(resp.read().decode())
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {body}")
    return body["data"]


def ask(url: str, window: str) -> dict | None:
    now = time.time()
    out = []
    for name, query in queries(window):
        out.append({"name": name, "query": query, "result": get(url, "/api/v1/query", {"query": query, "time": now})["result"]})
    targets = [{"scrape_url": t["scrapeUrl"], "health": t["health"]} for t in get(url, "/api/v1/targets")["activeTargets"]]
    steps = out[0]["result"]
    if not steps or any(float(r["value"][1]) < 1 for r in steps) or any(t["health"] != "up" for t in targets):
        return None
    version = get(url, "/api/v1/status/buildinfo").get("version", "")
    return {"time": now, "prometheus": version, "targets": targets, "queries": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--window", default="30s")
    args = ap.parse_args()
    try:
        answer = ask(args.url, args.window)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        print(f"query.py: {exc}", file=sys.stderr)
        return 3
    if answer is None:
        return 3
    d = os.path.dirname(os.path.abspath(args.out))
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(answer, fh, indent=1)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
