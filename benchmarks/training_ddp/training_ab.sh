#!/usr/bin/env bash
# Interleaved A/B of training arms on the emulated cluster (4 hosts x 1 rank, 0.5 CPU, 1 Gbit/s): one
# line per (repetition, arm) with img/s per rank, so arms see the same machine noise. Needs root.
#   usage: benchmarks/training_ddp/training_ab.sh OUT.txt 'label|ENV=1 ENV2=x|mode [flags]' ...  (mode: stock-ddp, ddp, hvd;
#          flags go to examples/synthetic_benchmark.py, e.g. 'ddp --ddp-option bucket_cap_mb=5')
#   REPS=5, MODEL=cnn
#   e.g. benchmarks/training_ddp/training_ab.sh ab.txt 'torch|-|stock-ddp' 'ringlet|-|ddp' 'direct|RINGLET_ALGORITHM=direct|ddp'
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1; shift
RINGLET=.venv/bin/ringlet
PY=$(pwd)/.venv/bin/python
REPS=${REPS:-5}
MODEL=${MODEL:-cnn}
trap '"$RINGLET" cluster down >/dev/null 2>&1 || true' EXIT
"$RINGLET" cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5 --replace >/dev/null
args=(--model "$MODEL" --num-warmup-batches 15 --num-iters 4 --num-batches-per-iter 5)
echo "# $(date -u '+%F %H:%M UTC') commit $(git rev-parse --short HEAD): $0 $out $*  (REPS=$REPS MODEL=$MODEL)" >> "$out"
for rep in $(seq 1 "$REPS"); do
  for arm in "$@"; do
    IFS='|' read -r label envs mode <<< "$arm"  # $mode unquoted below: it may carry flags
    e=(); [ "$envs" != - ] && read -r -a e <<< "$envs"
    log=$(env "${e[@]}" "$RINGLET" run --cluster -np 4 -- "$PY" examples/synthetic_benchmark.py "${args[@]}" --mode $mode 2>&1)
    ips=$(sed -n 's/^img\/s per rank: \([0-9.]*\).*/\1/p' <<< "$log")
    algo=$(sed -n 's/^all-reduce algorithm in use: //p' <<< "$log")
    echo "$rep $label ${ips:-FAILED} ${algo:--}" | tee -a "$out"
  done
done
