#!/usr/bin/env bash
# A Ray cluster on 2 emulated hosts (1 Gbit/s, 0.5 CPU each): the head on rgl-h0, a worker node on rgl-h1,
# one CPU each for Ray, so that 2 workers land one per host. Runs the digits example with RayExecutor
# (Horovod-style) and with Ray Train's TorchTrainer (ringlet's DDP), the references under `ringlet run
# --cluster`, and a worker killed mid-run. Writes results/*.log. Needs root; run from a checkout whose
# .venv holds ringlet (editable, from this checkout) and the ray extra (scripts/install-ray.sh).
#   usage: flock /tmp/ringlet-cluster.lock bash benchmarks/ray/ray_cluster.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${RINGLET_BIN:-$PWD/.venv/bin/ringlet}
PY=${RINGLET_PY:-$PWD/.venv/bin/python}
RAY=$(dirname "$PY")/ray
OUT=$PWD/benchmarks/ray/results
rm -rf "$OUT" && mkdir -p "$OUT"
# Ray 2.60 turns token authentication on (the token in ~/.ray/auth_token); every node and driver must use it.
export PYTHONPATH=$PWD/src:$PWD/examples RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token
stop() {
    "$R" cluster exec h1 -- "$RAY" stop --force >/dev/null 2>&1
    "$R" cluster exec h0 -- "$RAY" stop --force >/dev/null 2>&1
    "$R" cluster down >/dev/null 2>&1 || true
}
trap stop EXIT
"$R" cluster up --hosts 2 --link 1gbit --cpus-per-host 0.5 --replace >/dev/null || exit 1
H0=10.213.0.1 H1=10.213.0.2
stamp="$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
echo "# $stamp; 2 emulated hosts, 1 Gbit/s, 0.5 CPU; ray $("$PY" -c 'import ray; print(ray.__version__)')" | tee "$OUT/setup.log"
t0=$(date +%s)
"$R" cluster exec h0 -- "$RAY" start --head --node-ip-address $H0 --port 6379 --num-cpus 1 \
    --include-dashboard=false >>"$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
"$R" cluster exec h1 -- "$RAY" start --address $H0:6379 --node-ip-address $H1 --num-cpus 1 \
    >>"$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
echo "# ray cluster up in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/setup.log"
"$R" cluster exec h0 -- "$RAY" status 2>&1 | grep -E "node_|CPU" | tee -a "$OUT/setup.log"
case_() {  # name, command...
    local name=$1 t0; shift; t0=$(date +%s)
    { echo "# $stamp; $name: $*"; "$@" 2>&1 | grep -E "accuracy|hosts|PeerError|Error|error" | grep -v "is ignored"
      echo "# wall seconds: $(( $(date +%s) - t0 ))"; } | tee "$OUT/$name.log"
}
case_ executor "$R" cluster exec h0 -- "$PY" examples/ray_digits.py --workers 2 --epochs 5 --address $H0:6379
case_ trainer "$R" cluster exec h0 -- "$PY" examples/ray_digits.py --workers 2 --epochs 5 --address $H0:6379 \
    --trainer --storage /tmp/ringlet-ray-results
case_ kill_rank1 "$R" cluster exec h0 -- "$PY" benchmarks/ray/kill_actor.py --address $H0:6379 --rank 1
"$R" cluster exec h1 -- "$RAY" stop --force >/dev/null 2>&1
"$R" cluster exec h0 -- "$RAY" stop --force >/dev/null 2>&1
case_ ringlet_run_hvd "$R" run --cluster -np 2 -- "$PY" examples/train_digits_hvd.py --epochs 5
case_ ringlet_run_ddp "$R" run --cluster -np 2 -- "$PY" examples/train_digits_ddp.py --epochs 5
