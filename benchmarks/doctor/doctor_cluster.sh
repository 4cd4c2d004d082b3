#!/usr/bin/env bash
# `ringlet doctor` on 4 emulated hosts (1 Gbit/s, 0.5 CPU each) with one host made slow twice: host h3 at
# 0.2 CPU, then h3's link at 100 Mbit/s. Writes results/{cpu,link}.{txt,json}. Needs root and an otherwise
# idle machine; run it from a checkout whose .venv has ringlet installed editable from that checkout.
#   usage: sudo benchmarks/doctor/doctor_cluster.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
R=.venv/bin/ringlet
OUT=$(pwd)/benchmarks/doctor/results
mkdir -p "$OUT"
trap '"$R" cluster down >/dev/null 2>&1 || true' EXIT
"$R" cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5 --replace >/dev/null
stamp="$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
check() {  # name, then the cluster change that makes h3 slow
  local name=$1; shift
  "$R" "$@" >/dev/null
  { echo "# $stamp; 4 emulated hosts, 1 Gbit/s, 0.5 CPU; then: ringlet $*"
    echo "\$ ringlet doctor --cluster --json benchmarks/doctor/results/$name.json"
    "$R" doctor --cluster --json "$OUT/$name.json"; } 2>&1 | tee "$OUT/$name.txt"
}
check cpu cluster cpus 0.2 --host h3
"$R" cluster cpus 0.5 --host h3 >/dev/null
check link cluster link 100mbit --host h3
