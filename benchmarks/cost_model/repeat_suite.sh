#!/usr/bin/env bash
# Issue 18: the bed's run-to-run noise against the cost model's error. For each shape: calibrate once
# (`ringlet tune`), then the sweeps of benchmarks/cost_model/prediction_suite.sh twice in a row (runs A and B, the
# same profile installed), then the model's error against each run and run A against run B
# (benchmarks/cost_model/repeat_error.py). Needs root and an otherwise idle machine.
#   usage: sudo [BURST=port|96K|] benchmarks/cost_model/repeat_suite.sh OUTDIR [4x1_1gbit] [4x1_10gbit] ...
# BURST as in prediction_suite.sh (default port).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: repeat_suite.sh OUTDIR [SHAPE...]}; shift
mkdir -p "$OUT"
shapes=("$@"); [ ${#shapes[@]} -gt 0 ] || shapes=(4x1_1gbit)
source benchmarks/cost_model/suite_lib.sh
for shape in "${shapes[@]}"; do
  calibrate "$shape"
  for run in A B; do
    sweep "$shape" "bench_small_$run" 4 256K -n 200
    sweep "$shape" "bench_$run" 1M 256M
  done
  { for run in A B; do
      .venv/bin/python benchmarks/cost_model/prediction_error.py "$OUT/bench_small_${run}_$shape.json:$shape run $run" \
        "$OUT/bench_${run}_$shape.json:$shape run $run"; echo; done
    .venv/bin/python benchmarks/cost_model/repeat_error.py --label "$shape A vs B" "$OUT/bench_small_A_$shape.json" \
      "$OUT/bench_A_$shape.json" -- "$OUT/bench_small_B_$shape.json" "$OUT/bench_B_$shape.json"; } > "$OUT/noise_$shape.md"
done
