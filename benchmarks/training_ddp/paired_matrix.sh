#!/usr/bin/env bash
# The default dense path against torch's DDP: each model paired in one job with torch DDP, ringlet's
# DDP and the Horovod-style DistributedOptimizer, in two jobs per model: without hvd.init() in the job
# (torch, ringlet, ringlet forced to the backend's own all-reduce) and with it (torch, ringlet, hvd).
# Sufficient factors are off in every ringlet arm (the same bytes as torch's DDP; what they buy is in
# benchmarks/horovod_optimizer). Needs root and an otherwise idle machine.
#   usage: sudo benchmarks/training_ddp/paired_matrix.sh [cnn] [mlp] [transformer]   (default: all three)
#   ROUNDS=8 rounds per job; OUT=dir (default benchmarks/training_ddp/results)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/training_ddp/results}
ROUNDS=${ROUNDS:-8}
RINGLET=.venv/bin/ringlet
PY=$(pwd)/.venv/bin/python
mkdir -p "$OUT"
models=("$@"); [ ${#models[@]} -eq 0 ] && models=(cnn mlp transformer)
trap '"$RINGLET" cluster down >/dev/null 2>&1 || true' EXIT
"$RINGLET" cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5 --replace >/dev/null

arms_for() {  # model, job (nohvd | hvd)
  local dense=":sufficient_factors=off"
  if [ "$2" = nohvd ]; then
    echo "torch ringlet$dense ringlet$dense,algorithm=native"
  else
    echo "torch ringlet$dense hvd$dense"
  fi
}

for model in "${models[@]}"; do
  for job in nohvd hvd; do
    read -r -a arms <<< "$(arms_for "$model" "$job")"
    log=$OUT/paired_${model}_${job}.txt
    cmd=(run --cluster -np 4 -- "$PY" benchmarks/training_ddp/paired_ddp.py --model "$model"
         --rounds "$ROUNDS" --warmup 10 "${arms[@]}")
    { echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
      echo "\$ ringlet ${cmd[*]/$PY/python}"
      "$RINGLET" "${cmd[@]}"; } 2>&1 | tee "$log"
  done
done
