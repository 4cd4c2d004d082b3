#!/usr/bin/env bash
# Issue 18: the cost model against measurement, and `auto` against every fixed algorithm, on the emulated
# cluster. For each shape: calibrate (`ringlet tune`), then `ringlet bench` sweeps of every all-reduce
# algorithm and `auto` with the profile installed (RINGLET_PROFILE), predictions beside the measurements:
# 4 B-256 KiB with 200 timed calls per row (each timed block then spans several 100 ms CPU-quota
# periods, so a throttled period is not the whole block), and 1 MiB-256 MiB with the default counts.
# Needs root and an otherwise idle machine.
#   usage: sudo [BURST=port|96K|] benchmarks/cost_model/prediction_suite.sh OUTDIR [4x1_1gbit] [2x2_1gbit] [4x1_10gbit] [2x2_10gbit]
# BURST sets the links' token bucket (`ringlet cluster up --burst`). The default, port, is what the results
# in benchmarks/cost_model/results ran on; BURST= (empty) is the emulator's default of 2 ms of traffic.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: prediction_suite.sh OUTDIR [SHAPE...]}; shift
mkdir -p "$OUT"
shapes=("$@"); [ ${#shapes[@]} -gt 0 ] || shapes=(4x1_1gbit 2x2_1gbit 4x1_10gbit 2x2_10gbit)
source benchmarks/cost_model/suite_lib.sh
for shape in "${shapes[@]}"; do
  calibrate "$shape"
  sweep "$shape" bench_small 4 256K -n 200
  sweep "$shape" bench 1M 256M
done
