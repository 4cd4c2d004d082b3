#!/usr/bin/env bash
# Issue 18: the cost model against measurement, and `auto` against every fixed algorithm, on the emulated
# cluster. For each shape: calibrate (`ringlet tune`), then `ringlet bench` sweeps of every all-reduce
# algorithm and `auto` with the profile installed (RINGLET_PROFILE), predictions beside the measurements:
# 4 B-256 KiB with 200 timed calls per row (each timed block then spans several 100 ms CPU-quota
# periods, so a throttled period is not the whole block), and 1 MiB-256 MiB with the default counts.
# Needs root and an otherwise idle machine.
#   usage: sudo benchmarks/prediction_suite.sh OUTDIR [4x1_1gbit] [2x2_1gbit] [4x1_10gbit] [2x2_10gbit]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: prediction_suite.sh OUTDIR [SHAPE...]}; shift
mkdir -p "$OUT"
shapes=("$@"); [ ${#shapes[@]} -gt 0 ] || shapes=(4x1_1gbit 2x2_1gbit 4x1_10gbit 2x2_10gbit)
CLUSTER=(.venv/bin/ringlet cluster)
ALGOS=auto,ring,tree,halving_doubling,recursive_doubling,direct,hierarchical,torus
trap '"${CLUSTER[@]}" down >/dev/null 2>&1 || true' EXIT
sweep() {  # shape profile name first-size last-size extra-args...
  local shape=$1 prof=$2 name=$3 b=$4 e=$5; shift 5
  { echo "\$ RINGLET_PROFILE=$prof ringlet bench --cluster --transport torch --algorithms $ALGOS -b $b -e $e -f 4 $* --predict $prof"
    RINGLET_PROFILE="$prof" .venv/bin/ringlet bench --no-progress --cluster --transport torch --algorithms "$ALGOS" \
      -b "$b" -e "$e" -f 4 "$@" --predict "$prof" --json "$OUT/${name}_$shape.json"; } 2>&1 | tee "$OUT/${name}_$shape.txt"
}
for shape in "${shapes[@]}"; do
  hosts=${shape%%x*}; rest=${shape#*x}; per=${rest%%_*}; link=${rest#*_}
  "${CLUSTER[@]}" up --hosts "$hosts" --ranks-per-host "$per" --link "$link" --replace >/dev/null
  prof="$OUT/profile_$shape.json"
  { echo "\$ ringlet tune --cluster --transport torch --out $prof"
    /usr/bin/time -f "wall %e s" .venv/bin/ringlet tune --cluster --transport torch --out "$prof"; } 2>&1 | tee "$OUT/tune_$shape.txt"
  sweep "$shape" "$prof" bench_small 4 256K -n 200
  sweep "$shape" "$prof" bench "1M" 256M
done
