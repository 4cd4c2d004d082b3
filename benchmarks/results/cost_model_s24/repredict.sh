#!/usr/bin/env bash
# Session 24: session 23's measured sweeps predicted again by today's model, with their own profiles as
# they are (no refit) and at the segments they ran: what the held-step stages change, on data measured
# before the change. Writes repredicted/<run>/ and repredicted/errors.md.
set -euo pipefail
cd "$(dirname "$0")/../../.."
S23=benchmarks/results/cost_model_s23 OUT=benchmarks/results/cost_model_s24/repredicted
args=()
for shape in 4x1_1gbit 2x2_1gbit 4x1_10gbit 2x2_10gbit; do
  .venv/bin/python benchmarks/refit_predictions.py --as-is "$S23/attempt10/profile_$shape.json" \
    "$S23/attempt10/bench_small_$shape.json" "$S23/attempt10/bench_$shape.json" --out-dir "$OUT/attempt10_$shape" >/dev/null
  args+=("$OUT/attempt10_$shape/bench_small_$shape.json:$shape attempt 10" "$OUT/attempt10_$shape/bench_$shape.json:$shape attempt 10")
done
for shape in 2x2_1gbit 2x2_10gbit; do
  for run in A B; do
    .venv/bin/python benchmarks/refit_predictions.py --as-is "$S23/repeat_$shape/profile_$shape.json" \
      "$S23/repeat_$shape/bench_small_${run}_$shape.json" "$S23/repeat_$shape/bench_${run}_$shape.json" \
      --out-dir "$OUT/repeat_${shape}_$run" >/dev/null
    args+=("$OUT/repeat_${shape}_$run/bench_small_${run}_$shape.json:$shape repeat $run"
           "$OUT/repeat_${shape}_$run/bench_${run}_$shape.json:$shape repeat $run")
  done
done
.venv/bin/python benchmarks/prediction_error.py "${args[@]}" --out "$OUT/errors.md" \
  --command "benchmarks/results/cost_model_s24/repredict.sh (session 23's sweeps, predicted again at their segments)"
