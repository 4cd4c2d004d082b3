#!/usr/bin/env bash
# Straggler detection on 4 emulated hosts (1 Gbit/s, 0.5 CPU each, one rank per host) training a small CNN
# with ringlet's DDP, three cases: h3 at 0.2 CPU (compute straggler), h3's link at 100 Mbit/s (network-bound),
# equal hosts for 500 steps (no warning). Writes results/<case>.log (the job's straggler lines),
# results/<case>/rank-R.json (each rank's numbers) and results/results.json. Needs root and an otherwise idle
# machine; run it from a checkout whose .venv has ringlet installed editable from that checkout
# (RINGLET_BIN / RINGLET_PY override the ringlet and python it uses).
#   usage: flock /tmp/ringlet-cluster.lock bash benchmarks/straggler/straggler_cluster.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
R=${RINGLET_BIN:-.venv/bin/ringlet}
PY=${RINGLET_PY:-$PWD/.venv/bin/python}
OUT=$PWD/benchmarks/straggler/results
rm -rf "$OUT" && mkdir -p "$OUT"
trap '"$R" cluster down >/dev/null 2>&1 || true' EXIT
"$R" cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5 --replace >/dev/null
stamp="$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
run_case() {  # name, steps, batch
  local name=$1 steps=$2 batch=$3 t0
  t0=$(date +%s)
  { echo "# $stamp; 4 emulated hosts, 1 Gbit/s, 0.5 CPU; case $name"
    "$R" run --cluster -np 4 -- "$PY" "$PWD/benchmarks/straggler/train.py" --out "$OUT/$name" \
      --steps "$steps" --batch "$batch" 2>&1 | grep -E "straggler|Error|error" || true
    echo "# wall seconds: $(( $(date +%s) - t0 ))"; } | tee "$OUT/$name.log"
}
"$R" cluster cpus 0.2 --host h3 >/dev/null
run_case cpu 40 128
"$R" cluster cpus 0.5 --host h3 >/dev/null
"$R" cluster link 100mbit --host h3 >/dev/null
run_case link 60 32
"$R" cluster link 1gbit --host h3 >/dev/null
run_case equal 500 16
"$PY" - "$OUT" "$stamp" <<'PYEOF'
import json, sys
from pathlib import Path
out, stamp = Path(sys.argv[1]), sys.argv[2]
res = {"date": stamp, "cases": {}}
for case in ("cpu", "link", "equal"):
    ranks = [json.loads(p.read_text()) for p in sorted((out / case).glob("rank-*.json"))]
    log = (out / f"{case}.log").read_text().splitlines()
    r0 = next((r for r in ranks if r["rank"] == 0), {})
    res["cases"][case] = {
        "warnings": [x for x in log if "straggler" in x],
        "named_on_rank0": r0.get("named", []),
        "steps": r0.get("steps"), "seconds": r0.get("seconds"),
        "per_rank": {r["rank"]: {"host": r["host"], "compute_s": r["summary"].get("c"),
                                 "wait_s": r["summary"].get("w"), "step_s": r["summary"].get("s"),
                                 "score": r["scores"].get(str(r["rank"])),
                                 "links": {p: {"MB": round(v[0] / 1e6, 1), "blocked_share": round(v[2] / v[1], 3)}
                                           for p, v in r["summary"].get("l", {}).items() if v[1] > 0}}
                     for r in ranks}}
(out / "results.json").write_text(json.dumps(res, indent=1))
print(json.dumps({c: {"named": [(n["kind"], n["host"], n["step"]) for n in v["named_on_rank0"]],
                      "warnings": len(v["warnings"])} for c, v in res["cases"].items()}))
PYEOF
"$R" cluster down >/dev/null
