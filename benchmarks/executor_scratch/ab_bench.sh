#!/bin/bash
# Alternate two source trees (OLD: a `git worktree` of the commit before, NEW: this checkout) in ringlet
# bench, round after round. Usage: OLD=/tmp/old/src NEW=$PWD/src ab_bench.sh TRANSPORT ROUNDS OUTDIR [bench args]
tr=$1; rounds=$2; out=$3; shift 3; mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for arm in old new; do
    if [ $arm = old ]; then src=$OLD; else src=$NEW; fi
    PYTHONPATH=$src .venv/bin/python -m ringlet.cli.main bench -np 4 --transport "$tr" --no-progress \
      --json "$out/${arm}_$r.json" "$@" > "$out/${arm}_$r.txt" 2>&1
    echo "$arm $r rc=$?"
  done
done
