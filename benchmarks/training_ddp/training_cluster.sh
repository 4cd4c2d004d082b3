#!/usr/bin/env bash
# Issue-4 measurement: data-parallel training on 4 emulated hosts x 1 rank (0.5 CPU each, 1 Gbit/s links),
# ringlet (Horovod-style DistributedOptimizer and ringlet's DistributedDataParallel) against torch's stock
# DistributedDataParallel on Gloo, in the same run, modes interleaved; plus 1-rank baselines for scaling
# efficiency. ringlet runs write timelines; `ringlet report` turns them into hidden/exposed communication.
# Needs root and an otherwise idle machine.
#   usage: sudo benchmarks/training_ddp/training_cluster.sh [cnn] [mlp]     (default: both)
#   REPS=2 repetitions numbered from REP_FIRST=1; NP1=0 skips the 1-rank baselines (to add repetitions later);
#   OUT=dir writes there instead of benchmarks/training_ddp/results/cluster_4x1_1gbit
set -euo pipefail
cd "$(dirname "$0")/../.."
R=benchmarks/training_ddp/results
OUT=${OUT:-$R/cluster_4x1_1gbit}
mkdir -p "$OUT"
RINGLET=.venv/bin/ringlet
PY=$(pwd)/.venv/bin/python
REPS=${REPS:-2}
REP_FIRST=${REP_FIRST:-1}
NP1=${NP1:-1}
MODES=${MODES:-"stock-ddp ddp hvd"}
models=("$@"); [ ${#models[@]} -eq 0 ] && models=(cnn mlp)
trap '"$RINGLET" cluster down >/dev/null 2>&1 || true' EXIT

"$RINGLET" cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5 --replace
for model in "${models[@]}"; do
  # 10 warm-up batches: DDP tries its candidate algorithms in the first ~9 steps (see README, DDP tuning)
  args=(--model "$model" --num-warmup-batches 10 --num-iters 4 --num-batches-per-iter 5)
  for mode in $MODES; do  # one rank on one 0.5-CPU host: the scaling-efficiency baseline
    [ "$NP1" = 1 ] || break
    log=$OUT/${model}_${mode}_np1.log
    { echo "\$ ringlet run --cluster -np 1 -- python examples/synthetic_benchmark.py ${args[*]} --mode $mode"
      "$RINGLET" run --cluster -np 1 -- "$PY" examples/synthetic_benchmark.py "${args[@]}" --mode "$mode"; } 2>&1 | tee "$log"
  done
  for rep in $(seq "$REP_FIRST" $((REP_FIRST + REPS - 1))); do
    for mode in $MODES; do
      log=$OUT/${model}_${mode}_np4_r$rep.log
      trace=$OUT/${model}_${mode}_r$rep.trace.json
      env=()
      [ "$mode" != stock-ddp ] && env=(env RINGLET_TIMELINE="$(pwd)/$trace")
      { echo "\$ ${env[*]} ringlet run --cluster -np 4 -- python examples/synthetic_benchmark.py ${args[*]} --mode $mode"
        "${env[@]}" "$RINGLET" run --cluster -np 4 -- "$PY" examples/synthetic_benchmark.py "${args[@]}" --mode "$mode"; } 2>&1 | tee "$log"
      if [ "$mode" != stock-ddp ]; then
        "$RINGLET" report --skip 10 "$trace" > "$OUT/${model}_${mode}_r$rep.report.txt"
        tail -2 "$OUT/${model}_${mode}_r$rep.report.txt"
      fi
    done
  done
done
