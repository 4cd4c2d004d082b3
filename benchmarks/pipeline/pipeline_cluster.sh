#!/usr/bin/env bash
# Pipelines against data parallelism on 4 emulated hosts x 1 rank (0.5 CPU each, 1 Gbit/s links), paired in
# one job: benchmarks/pipeline/paired_pipeline.py with its default arms (torch DDP, ringlet DDP, ringlet's
# Pipeline 2x2 and 4x1 with 1F1B, 4x1 with GPipe, torch.distributed.pipelining 2x2 and 4x1).
# Needs root and an otherwise idle machine. Run it from a checkout whose .venv has ringlet installed editable
# from that same checkout (the ranks on the emulated hosts do not inherit PYTHONPATH: they import ringlet
# through .venv/bin/python).
#   usage: sudo benchmarks/pipeline/pipeline_cluster.sh [more arguments for paired_pipeline.py]
#   ROUNDS=8 rounds; NAME=paired_cluster (the results' file names); OUT=dir (default benchmarks/pipeline/results)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/pipeline/results}
ROUNDS=${ROUNDS:-8}
NAME=${NAME:-paired_cluster}
RINGLET=.venv/bin/ringlet
PY=$(pwd)/.venv/bin/python
"$PY" -c 'import os, ringlet; assert os.path.realpath(ringlet.__file__).startswith(os.path.realpath("src")), ringlet.__file__' \
  || { echo "the .venv's ringlet is not this checkout's src/ (see the usage above)" >&2; exit 1; }
mkdir -p "$OUT"
case "$OUT" in /*) ;; *) OUT=$(pwd)/$OUT ;; esac
log=$OUT/$NAME.txt
json=$OUT/$NAME.json
trap '"$RINGLET" cluster down >/dev/null 2>&1 || true' EXIT
"$RINGLET" cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5 --replace >/dev/null
cmd=(run --cluster -np 4 -- "$PY" benchmarks/pipeline/paired_pipeline.py --rounds "$ROUNDS" --out "$json" "$@")
stamp="$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
shown="ringlet ${cmd[*]/$PY/python}"
shown=${shown/$(pwd)\//}
{ echo "# $stamp, 4 emulated hosts x 1 rank, 0.5 CPU and 1 Gbit/s each"
  echo "\$ $shown"
  "$RINGLET" "${cmd[@]}"; } 2>&1 | tee "$log"
# the JSON starts with the same date, commit and command
"$PY" - "$json" "$stamp" "$shown" <<'PY'
import json, sys
path, stamp, command = sys.argv[1:]
data = json.load(open(path))
json.dump({"date": stamp, "command": command, **data}, open(path, "w"), indent=1)
PY
