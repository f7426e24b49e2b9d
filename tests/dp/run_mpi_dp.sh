#!/usr/bin/env bash
# The data-parallel equivalence over 2 and 4 MPI processes (oversubscribed).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 SYNCBN_TIMEOUT=60
for np in 2 4; do
  echo "mpirun -np $np $1"
  timeout 180 mpirun --oversubscribe -np "$np" "$1" || exit 1
done
