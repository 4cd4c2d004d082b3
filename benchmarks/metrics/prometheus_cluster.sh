#!/usr/bin/env bash
# A real Prometheus server scraping a 4-rank training job on the emulated cluster (4 hosts, 1 Gbit/s,
# 0.5 CPU each): ringlet's DDP on the synthetic CNN with `ringlet run --cluster --metrics-port 9400`
# (each host's agent serves its rank's metrics), Debian's Prometheus scraping the four hosts every 2 s,
# the ready queries of docs/metrics.md asked over Prometheus's HTTP API every 5 s while the job runs.
# Writes results/answers.json (the last complete answer: queries and results), results/job.txt and
# results/prometheus.txt. Prometheus runs in host h0's network namespace (the only way onto the
# cluster's network: the bridge has no address in the root namespace) but outside its CPU quota.
# Needs root and an otherwise idle machine; takes the cluster for a few minutes.
#   usage: flock /tmp/ringlet-cluster.lock sudo benchmarks/metrics/prometheus_cluster.sh
#   RINGLET_VENV=DIR: the virtualenv with ringlet installed (default .venv)
#   SLOW_HOST_CPUS=C: give host h3 C CPUs (e.g. 0.2) instead of 0.5, so that the straggler score moves
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${RINGLET_VENV:-.venv}
R=$VENV/bin/ringlet
PY=$VENV/bin/python
PORT=9400
OUT=$(pwd)/benchmarks/metrics/results
mkdir -p "$OUT"
benchmarks/metrics/install_prometheus.sh > "$OUT/prometheus.txt"
WORK=$(mktemp -d /tmp/ringlet-prometheus-XXXXXX)
PROM="" JOB=""
cleanup() {
    [ -z "$JOB" ] || kill "$JOB" 2>/dev/null || true
    [ -z "$PROM" ] || kill "$PROM" 2>/dev/null || true
    "$R" cluster down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
"$R" cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5 --replace >/dev/null
[ -z "${SLOW_HOST_CPUS:-}" ] || "$R" cluster cpus "$SLOW_HOST_CPUS" --host h3 >/dev/null
"$R" cluster status --json > "$WORK/cluster.json"
# h0's namespace, and the Prometheus configuration: every host's agent at its address, port $PORT
NS0=$("$PY" - "$WORK/cluster.json" "$PORT" "$WORK/prometheus.yml" <<'PYEOF'
import json, sys
hosts = json.load(open(sys.argv[1]))["hosts"]
targets = ", ".join(f'"{h["addr"]}:{sys.argv[2]}"' for h in hosts)
with open(sys.argv[3], "w") as fh:
    fh.write("global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\nscrape_configs:\n"
             f"  - job_name: ringlet\n    static_configs:\n      - targets: [{targets}]\n")
print(hosts[0]["name"])
PYEOF
)
ip netns exec "$NS0" prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/data" \
    --web.listen-address=127.0.0.1:9090 > "$WORK/prometheus.log" 2>&1 &
PROM=$!
stamp="$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
CMD=("$R" run --cluster -np 4 --metrics-port "$PORT" -- "$PY" examples/synthetic_benchmark.py --model cnn
     --mode ddp --num-warmup-batches 5 --num-batches-per-iter 10 --num-iters 8)
"${CMD[@]}" > "$WORK/job.log" 2>&1 &
JOB=$!
asked=0
while kill -0 "$JOB" 2>/dev/null; do
    sleep 5
    if ip netns exec "$NS0" "$PY" benchmarks/metrics/query.py --url http://127.0.0.1:9090 \
           --out "$WORK/answers.json" 2>>"$WORK/query.log"; then
        asked=$((asked + 1))
    fi
done
set +e; wait "$JOB"; status=$?; set -e
JOB=""
{ echo "# $stamp; 4 emulated hosts, 1 Gbit/s, 0.5 CPU; exit status $status; $asked complete answers"
  echo "\$ ringlet run --cluster -np 4 --metrics-port $PORT -- python examples/synthetic_benchmark.py --model cnn --mode ddp --num-warmup-batches 5 --num-batches-per-iter 10 --num-iters 8"
  tail -n 30 "$WORK/job.log"; } > "$OUT/job.txt"
tail -n 5 "$WORK/prometheus.log" >> "$OUT/prometheus.txt"
[ -f "$WORK/answers.json" ] || { echo "no complete answer from Prometheus; see $OUT/job.txt" >&2; tail -5 "$WORK/query.log" >&2; exit 1; }
cp "$WORK/answers.json" "$OUT/answers.json" && chmod 644 "$OUT/answers.json"
"$PY" - "$OUT/answers.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"Prometheus {d['prometheus']}: " + ", ".join(f"{t['scrape_url']} {t['health']}" for t in d["targets"]))
for q in d["queries"]:
    vals = "; ".join(", ".join(f"{k}={v}" for k, v in sorted(r["metric"].items()) if k not in ("__name__", "job", "instance"))
                     + f" -> {float(r['value'][1]):.4g}" for r in q["result"]) or "(empty)"
    print(f"{q['name']}: {q['query']}\n    {vals}")
PYEOF
exit "$status"
