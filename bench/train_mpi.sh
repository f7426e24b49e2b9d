#!/usr/bin/env bash
# End-to-end cost of synchronization: syncbn-train steps per second with
# --bn sync against --bn local, P MPI processes, the two modes alternating
# (REPS runs each) so load changes hit both alike; median of the runs.
#   bench/train_mpi.sh BUILD [Ps] [REPS]
set -u
build=${1:-build}; Ps=${2:-"2 4"}; reps=${3:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
batch=4; train=${TRAIN_SIZE:-512}
echo "| MPI ranks | per-rank batch | steps/epoch | --bn local steps/s | --bn sync steps/s | sync / local |"
echo "|---|---|---|---|---|---|"
for P in $Ps; do
  declare -A rate=()
  for rep in $(seq "$reps"); do
    for bn in local sync; do
      # images/s over the epoch, as the trainer reports it
      ips=$(mpirun --oversubscribe -np "$P" "$build/tools/syncbn-train" --bn "$bn" --epochs 1 --batch $batch \
              --train-size $train --test-size 64 --out "$out" 2>&1 | awk '/epoch  1/ { print $(NF-1) }')
      rate[$bn]="${rate[$bn]:-} $ips"
    done
  done
  med() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
  l=$(echo "${rate[local]}" | med); s=$(echo "${rate[sync]}" | med)
  awk -v P=$P -v b=$batch -v n=$train -v l="$l" -v s="$s" 'BEGIN {
    printf "| %d | %d | %d | %.2f | %.2f | %.3f |\n", P, b, n / (P * b), l / (P * b), s / (P * b), s / l }'
  unset rate
done
