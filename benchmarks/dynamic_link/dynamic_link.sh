#!/usr/bin/env bash
# Issue-18 measurement, dynamic adjustment: ringlet's DDP (adapt=Adapt(every=EVERY)) trains while the
# emulated link drops from FAST to SLOW T1 seconds into the run and comes back T2 seconds in; in the same
# job every fixed configuration of CONFIGS is measured at each rate (dynamic_link.py fixed), and
# dynamic_link_summary.py lines it all up: steps to the first switch, step time after it against the best
# fixed configuration at that rate. Calibration profiles are made at each rate (ringlet tune); the
# adaptive run starts from FAST's, as a job would that was calibrated before the link changed.
#   usage: sudo benchmarks/dynamic_link/dynamic_link.sh        (the emulated cluster: needs root and an idle machine)
#          LOCAL=1 benchmarks/dynamic_link/dynamic_link.sh     (one host, -np ${NP:-2}, no link changes: a smoke run)
#   knobs (environment): OUT, MODEL=cnn, STEPS=400, EVERY=10, FAST=10gbit, SLOW=1gbit, T1=150, T2=300,
#   HOSTS=4, PER_HOST=1, CPUS (per host; default an equal share), CONFIGS, ROUNDS=3, BLOCK=5, SETTLE=5,
#   ADAPT_ARGS (more dynamic_link.py adapt options, e.g. --no-tune), RINGLET and PY (default .venv's).
set -euo pipefail
cd "$(dirname "$0")/../.."
RINGLET=${RINGLET:-.venv/bin/ringlet}
PY=${PY:-$(pwd)/.venv/bin/python}
LOCAL=${LOCAL:-0}
OUT=${OUT:-benchmarks/dynamic_link/results/$([ "$LOCAL" = 1 ] && echo local || echo "${HOSTS:-4}x${PER_HOST:-1}")}
MODEL=${MODEL:-cnn}
STEPS=${STEPS:-400}
EVERY=${EVERY:-10}
FAST=${FAST:-10gbit}
SLOW=${SLOW:-1gbit}
T1=${T1:-150}
T2=${T2:-300}
HOSTS=${HOSTS:-4}
PER_HOST=${PER_HOST:-1}
CPUS=${CPUS:-}
CONFIGS=${CONFIGS:-"auto:25 ring:25 ring:4 ring:1 halving_doubling:25 halving_doubling:4 recursive_doubling:4 tree:4 tree:1 hierarchical:25 hierarchical:4"}
ROUNDS=${ROUNDS:-3}
BLOCK=${BLOCK:-5}
SETTLE=${SETTLE:-5}
ADAPT_ARGS=${ADAPT_ARGS:-}  # e.g. --no-tune
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cfg=(); for c in $CONFIGS; do cfg+=(--config "$c"); done
stamp() { date +%s.%N; }

if [ "$LOCAL" = 1 ]; then
  run=("$RINGLET" run -np "${NP:-2}" --)
  tune=("$RINGLET" tune -np "${NP:-2}")
  rates=(local)
else
  run=("$RINGLET" run --cluster --)
  tune=("$RINGLET" tune --cluster)
  rates=("$FAST" "$SLOW")
  trap '"$RINGLET" cluster down >/dev/null 2>&1 || true' EXIT
  "$RINGLET" cluster up --hosts "$HOSTS" --ranks-per-host "$PER_HOST" --link "$FAST" ${CPUS:+--cpus-per-host "$CPUS"} --replace
fi

# Calibrate, then measure every fixed configuration, at each rate.
for rate in "${rates[@]}"; do
  [ "$LOCAL" = 1 ] || "$RINGLET" cluster link "$rate"
  "${tune[@]}" --out "$OUT/profile_$rate.json" 2>&1 | tee "$OUT/tune_$rate.log"
  { echo "\$ RINGLET_PROFILE=$OUT/profile_$rate.json ${run[*]} python benchmarks/dynamic_link/dynamic_link.py fixed ..."
    RINGLET_PROFILE="$OUT/profile_$rate.json" "${run[@]}" "$PY" benchmarks/dynamic_link/dynamic_link.py fixed --model "$MODEL" \
      "${cfg[@]}" --rounds "$ROUNDS" --block "$BLOCK" --out "$OUT/fixed_$rate.json"; } 2>&1 | tee "$OUT/fixed_$rate.log"
done

# The adaptive run, from the first rate's profile; the link changes under it (not in LOCAL mode).
[ "$LOCAL" = 1 ] || "$RINGLET" cluster link "$FAST"
links=$OUT/links.txt
echo "$(stamp) ${rates[0]}" > "$links"
RINGLET_PROFILE="$OUT/profile_${rates[0]}.json" RINGLET_TIMELINE="$OUT/adapt_timeline_{rank}.json" \
  "${run[@]}" "$PY" benchmarks/dynamic_link/dynamic_link.py adapt --model "$MODEL" --steps "$STEPS" --every "$EVERY" $ADAPT_ARGS \
  --out "$OUT/adapt.json" > "$OUT/adapt.log" 2>&1 &
job=$!
changer=
if [ "$LOCAL" != 1 ]; then
  # Stamped before the change: `ringlet cluster link` takes 1.6 s idle (more under load), and the new rate
  # is in force before it returns.
  ( sleep "$T1"; echo "$(stamp) $SLOW" >> "$links"; "$RINGLET" cluster link "$SLOW"
    sleep $((T2 - T1)); echo "$(stamp) $FAST" >> "$links"; "$RINGLET" cluster link "$FAST" ) &
  changer=$!
fi
status=0
wait "$job" || status=$?
[ -n "$changer" ] && { kill "$changer" 2>/dev/null || true; wait "$changer" 2>/dev/null || true; }
tail -5 "$OUT/adapt.log"
[ "$status" = 0 ] || { echo "the adaptive run failed ($status): $OUT/adapt.log" >&2; exit "$status"; }
grep -E "switch at step|DistributedDataParallel: step" "$OUT/adapt.log" > "$OUT/switches.log" || true

fixed=(); for rate in "${rates[@]}"; do fixed+=(--fixed "$rate=$OUT/fixed_$rate.json"); done
"$PY" benchmarks/dynamic_link/dynamic_link_summary.py --adapt "$OUT/adapt.json" --links "$links" "${fixed[@]}" \
  --settle "$SETTLE" --out "$OUT/summary.md"
