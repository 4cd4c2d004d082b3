#!/usr/bin/env bash
# A real Slurm (Debian's slurm-wlm and munge) on the 4 emulated hosts of `ringlet cluster`: slurmctld and one
# slurmd per host (each in its host's network namespace, node name rgl-hN), then
#   - srun -N 4 -n 4 and -N 2 -n 4 of examples/train_digits_ddp.py and examples/train_digits_hvd.py (ringlet.init()
#     forms the world from the step's variables alone), next to `ringlet run --cluster` as the reference;
#   - `ringlet run` inside salloc (node launchers placed with srun);
#   - the failure modes a real srun can produce (no secret; a rendezvous host that does not answer) and a
#     process inside an allocation but outside any step (a world of one, never hijacked);
# and tears everything down (daemons, munged if it started it, the cluster). Writes results/*.txt.
# Needs root; installs the packages with apt-get when they are missing. Run it alone on the machine:
#   usage: sudo [PY=/path/to/venv/bin/python] flock /tmp/ringlet-cluster.lock benchmarks/slurm/slurm_cluster.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PY=${PY:-$ROOT/.venv/bin/python}
EPOCHS=${EPOCHS:-5}
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
OUT=$ROOT/benchmarks/slurm/results
W=/tmp/ringlet-slurm
STATE=/run/ringlet/cluster.json
mkdir -p "$OUT"
umount -R -l "$W/cgroup" 2>/dev/null  # a bind of the cgroup file system from an interrupted run: never rm -rf through it
rm -rf "$W" && mkdir -p "$W"
PIDS=()
STARTED_MUNGE=0
RINGLET=("$PY" -m ringlet.cli.main)
R() { "${RINGLET[@]}" "$@"; }
X() { local h=$1; shift; "$PY" "$ROOT/src/ringlet/cluster/_rsh.py" --state "$STATE" --argv "$h" "$@"; }  # run in host h
IN_H0=("$PY" "$ROOT/src/ringlet/cluster/_rsh.py" --state "$STATE" --argv h0)

teardown() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ "$STARTED_MUNGE" = 1 ] && [ -f /run/munge/munged.pid ] && kill "$(cat /run/munge/munged.pid)" 2>/dev/null
  R cluster down >/dev/null 2>&1
  umount -R -l "$W/cgroup" 2>/dev/null
  cp "$W"/*.log "$OUT/" 2>/dev/null
  return 0
}
trap teardown EXIT

# --- packages and munge ----------------------------------------------------------------------------------
if ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >"$W/apt.log" 2>&1 || { echo "apt-get failed"; exit 1; }
fi
mkdir -p /run/munge /var/lib/munge /var/log/munge && chown munge:munge /run/munge /var/lib/munge /var/log/munge
[ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key && chown munge:munge /etc/munge/munge.key; }
if ! munge -n </dev/null >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged --force && STARTED_MUNGE=1
fi
munge -n </dev/null | unmunge >/dev/null || { echo "munge does not work"; exit 1; }

# --- the emulated hosts and slurm.conf -------------------------------------------------------------------
R cluster up --hosts 4 --ranks-per-host 1 --link 1gbit --cpus-per-host 0 --replace >/dev/null || exit 1
NODES=$("$PY" -c "import json; print(' '.join(h['name'] + '=' + h['addr'] for h in json.load(open('$STATE'))['hosts']))")
H0_ADDR=$(echo "$NODES" | tr ' ' '\n' | head -1 | cut -d= -f2)
cat >"$W/slurm.conf" <<EOF
ClusterName=ringlet
SlurmctldHost=rgl-h0($H0_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$W/ctld
SlurmdSpoolDir=$W/spool-%n
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/slurmd-%n.pid
SlurmctldLogFile=$W/slurmctld.log
SlurmdLogFile=$W/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
$(for n in $NODES; do echo "NodeName=${n%%=*} NodeAddr=${n#*=} CPUs=4 State=UNKNOWN"; done)
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
mkdir -p "$W/ctld" "$W"/spool-rgl-h{0,1,2,3} "$W/cgroup"
# slurmd loads its cgroup plugin even with proctrack/linuxproc and task/none, and `ip netns exec` remounts /sys
# without the cgroup file system: a bind of it outside /sys (made before entering, so every host sees it)
# and cgroup.conf pointing there.
mount --rbind /sys/fs/cgroup "$W/cgroup" || exit 1
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then CG=cgroup/v2; else CG=cgroup/v1; fi
printf 'CgroupPlugin=%s\nCgroupMountpoint=%s\n' "$CG" "$W/cgroup" >"$W/cgroup.conf"
export SLURM_CONF=$W/slurm.conf
# Started as plain commands (not through the shell function X), so that each $! is the daemon itself.
"$PY" "$ROOT/src/ringlet/cluster/_rsh.py" --state "$STATE" --argv h0 slurmctld -D -i >"$W/slurmctld.out" 2>&1 &
PIDS+=($!)
for i in 0 1 2 3; do
  "$PY" "$ROOT/src/ringlet/cluster/_rsh.py" --state "$STATE" --argv "h$i" slurmd -D -N "rgl-h$i" >"$W/slurmd-h$i.out" 2>&1 &
  PIDS+=($!)
done
up=0
for _ in $(seq 60); do
  if [ "$(X h0 sinfo -h -t idle -o '%D' 2>/dev/null)" = "4" ]; then up=1; break; fi
  sleep 1
done
X h0 sinfo >"$OUT/sinfo.txt" 2>&1
if [ "$up" != 1 ]; then echo "the 4 slurmd never became idle; see $OUT/sinfo.txt and the logs"; exit 1; fi

# --- the runs --------------------------------------------------------------------------------------------
export RINGLET_JOB_SECRET=$("$PY" -c 'import secrets; print(secrets.token_hex(32))')
stamp="$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
job() {  # name, then the command (run inside host h0, where srun and salloc reach slurmctld)
  local name=$1 t0=$SECONDS; shift
  { echo "# $stamp"; echo "\$ $*"; timeout 420 "$@"; echo "exit status: $?, $((SECONDS - t0)) s"; } >"$OUT/$name.txt" 2>&1
  echo "$name: $(grep -h 'test accuracy' "$OUT/$name.txt" | head -1) $(tail -1 "$OUT/$name.txt")"
}
for ex in ddp hvd; do
  job "srun-N4-n4-$ex" "${IN_H0[@]}" srun -N 4 -n 4 "$PY" "examples/train_digits_$ex.py" --epochs "$EPOCHS"
  job "srun-N2-n4-$ex" "${IN_H0[@]}" srun -N 2 -n 4 "$PY" "examples/train_digits_$ex.py" --epochs "$EPOCHS"
done
job salloc-N4-n4-ringlet-run-ddp "${IN_H0[@]}" salloc -N 4 -n 4 "$PY" -m ringlet.cli.main run -- "$PY" examples/train_digits_ddp.py --epochs "$EPOCHS"
job salloc-N2-n4-ringlet-run-ddp "${IN_H0[@]}" salloc -N 2 -n 4 "$PY" -m ringlet.cli.main run -- "$PY" examples/train_digits_ddp.py --epochs "$EPOCHS"
INIT='import ringlet; ringlet.init(); print("world of", ringlet.size())'
job fail-no-secret "${IN_H0[@]}" env -u RINGLET_JOB_SECRET srun -N 2 -n 4 "$PY" -c "$INIT"
job fail-no-answer "${IN_H0[@]}" env RINGLET_SLURM_ADDR=10.213.0.250 RINGLET_SLURM_TIMEOUT=5 srun -N 2 -n 4 "$PY" -c "$INIT"
job allocation-not-a-step "${IN_H0[@]}" salloc -N 2 -n 4 "$PY" -c "$INIT"
for ex in ddp hvd; do
  job "reference-ringlet-run-cluster-np4-$ex" "${RINGLET[@]}" run --cluster -np 4 -- "$PY" "examples/train_digits_$ex.py" --epochs "$EPOCHS"
done
{ for f in "$OUT"/[a-z]*-*.txt; do echo "== $(basename "$f"): $(grep -hc 'ringlet.init under Slurm' "$f") task errors; $(grep -h 'test accuracy\|world of' "$f" | head -2 | tr '\n' ' ')$(tail -1 "$f")"; done; } >"$OUT/summary.txt"
cat "$OUT/summary.txt"
