#!/usr/bin/env bash
# The MoE table (baseline -> + compression -> + overlap -> + MoE) on 4 emulated hosts x 1 rank (0.5 CPU
# each, 1 Gbit/s links): first a 1-rank job on one emulated host (each row's samples/s alone: the
# denominator of scaling efficiency; no test), then the 4-rank job of every row with the test, reading
# the first job's JSON. Each job writes NAME.txt (date, commit and command first, then the output) and
# NAME.json. Needs root and an otherwise idle machine; about 5-7 minutes in all.
#   usage: sudo benchmarks/moe/moe_cluster.sh [more moe_table.py flags, given to both jobs]
#   OUT=dir (default benchmarks/moe/results)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/moe/results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RINGLET=.venv/bin/ringlet
PY=$(pwd)/.venv/bin/python
trap '"$RINGLET" cluster down >/dev/null 2>&1 || true' EXIT
"$RINGLET" cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5 --replace >/dev/null

job() {  # NAME NP FLAGS...: one job, its output in $OUT/NAME.txt
  local name=$1 np=$2
  shift 2
  local cmd=(run --cluster -np "$np" -- "$PY" benchmarks/moe/moe_table.py "$@" --json "$OUT/$name.json")
  # the profiler's start/stop lines and its allocator warning are left out of the file
  { echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -c safe.directory="$(pwd)" rev-parse --short HEAD)"
    echo "\$ ringlet ${cmd[*]/$PY/python}"
    "$RINGLET" "${cmd[@]}" 2>&1 | grep -v -e '^USDT:' -e 'CPUAllocator.cpp'; } | tee "$OUT/$name.txt"
}

job np1 1 --epochs 0 "$@"
job np4 4 --one-rank "$OUT/np1.json" "$@"
