#!/usr/bin/env bash
# Reproduces the results in benchmarks/allreduce_cluster/results/: (a) one host, 4 ranks; (b) 4 emulated hosts x 1 rank
# at 1 Gbit/s; (c) 2 hosts x 2 ranks at 1 Gbit/s; (d) 4 hosts x 1 rank at 10 Gbit/s.
# Needs root (emulated hosts) and an otherwise idle machine: these are ratios of implementations measured in
# the same run, but a second workload on 2 cores still distorts latencies.
#   usage: sudo benchmarks/allreduce_cluster/cluster_suite.sh [a] [b] [c] [d]     (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."
R=benchmarks/allreduce_cluster/results
BENCH=(.venv/bin/ringlet bench --no-progress)
CLUSTER=(.venv/bin/ringlet cluster)
mkdir -p "$R"
parts=("$@")
has() { [ ${#parts[@]} -eq 0 ] || [[ " ${parts[*]} " == *" $1 "* ]]; }
trap '"${CLUSTER[@]}" down >/dev/null 2>&1 || true' EXIT

run() {  # run NAME ARGS...: the table to NAME.txt, headed by the command
    local name=$1; shift
    { echo "\$ ringlet bench $*"; "${BENCH[@]}" "$@" --json "$R/$name.json" --csv "$R/$name.csv"; } | tee "$R/$name.txt"
}

if has a; then
  # ringlet's shared-memory path beside MPICH's MPI_Allreduce and Gloo, one mpiexec job
  run a_1host_4r -np 4 --transport mpi --ringlet-transport shm --compare native,mpi \
      --algorithms auto,ring,tree,halving_doubling,recursive_doubling -b 4 -e 256M -f 4 \
      --plot "$R/a_1host_4r.png" --title "(a) 1 host, 4 ranks: ringlet on shm vs MPICH and Gloo"
fi
if has b; then
  "${CLUSTER[@]}" up --hosts 4 --link 1gbit --replace
  run b_4x1_1gbit_torch --cluster -np 4 --transport mpi --ringlet-transport torch --compare native,mpi \
      --algorithms auto,ring,tree,halving_doubling,recursive_doubling -b 4 -e 64M -f 4 --link-rate 1gbit \
      --plot "$R/b_4x1_1gbit_torch.png" --title "(b) 4 hosts x 1 rank, 1 Gbit/s: ringlet over Gloo p2p"
  run b_4x1_1gbit_mpi --cluster -np 4 --transport mpi --compare native,mpi \
      --algorithms auto,ring,tree,halving_doubling,recursive_doubling -b 4 -e 64M -f 4 --link-rate 1gbit \
      --plot "$R/b_4x1_1gbit_mpi.png" --title "(b) 4 hosts x 1 rank, 1 Gbit/s: ringlet over MPI p2p"
  # Small messages without CPU quotas: a busy-polling MPI rank burns its host's 0.5-CPU quota and is then
  # throttled for the rest of the 100 ms period, which swamps microsecond latencies.
  "${CLUSTER[@]}" up --hosts 4 --link 1gbit --cpus-per-host 0 --replace
  run b_4x1_1gbit_noquota_small --cluster -np 4 --transport mpi --compare native,mpi \
      --algorithms auto,recursive_doubling,halving_doubling -b 4 -e 64K -f 4 -n 300
fi
if has c; then
  "${CLUSTER[@]}" up --hosts 2 --ranks-per-host 2 --link 1gbit --replace
  run c_2x2_1gbit --cluster -np 4 --transport torch --compare native \
      --algorithms ring,hierarchical,halving_doubling,torus -b 64K -e 256M -f 4 --link-rate 1gbit \
      --plot "$R/c_2x2_1gbit.png" --title "(c) 2 hosts x 2 ranks, 1 Gbit/s"
fi
if has d; then
  "${CLUSTER[@]}" up --hosts 4 --link 10gbit --replace
  run d_4x1_10gbit --cluster -np 4 --transport torch --compare native \
      --algorithms ring,tree,halving_doubling -b 64K -e 256M -f 4 --link-rate 10gbit \
      --plot "$R/d_4x1_10gbit.png" --title "(d) 4 hosts x 1 rank, 10 Gbit/s"
fi
