#!/usr/bin/env bash
# The MPI tests of `make test` (entries of EXTRA_TEST_CMDS in mk/mpi.mk).
# Each mpirun is bounded by `timeout`, so a hang fails instead of stalling
# CI; every part prints its evidence; exit status non-zero on any failure.
# Usage: tests/mpi/run_mpi.sh BUILD equivalence|faults|setup|algorithms|kill|torch
#        tests/mpi/run_mpi.sh BUILD cuda PROGRAM   (test_cuda_mpi: GPU or emulated)
set -u
build=$1; what=$2
# Open MPI refuses root without these (CI containers run as root); the test
# machine has 2 cores, so 3 and 4 ranks need --oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe)
fails=0
# Under LeakSanitizer (make check-asan), the runs in which a rank times out
# add tests/sanitize/lsan_abandoned.supp: what Open MPI allocated for the
# operations the timed-out ranks abandon (reasons in that file).
abandoning() {
  case "${LSAN_OPTIONS:-}" in
  *suppressions=*)
    local base=${LSAN_OPTIONS#*suppressions=}; base=${base%%:*}
    local both; both=$(mktemp); cat "$base" "$(dirname "$0")/../sanitize/lsan_abandoned.supp" >"$both"
    LSAN_OPTIONS=${LSAN_OPTIONS/suppressions=$base/suppressions=$both} "$@"; local rc=$?
    rm -f "$both"; return $rc ;;
  *) "$@" ;;
  esac
}
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

case "$what" in
cuda)
  # Processes sharing a GPU through the MPI group (the host-staged path);
  # the program prints SKIP without a GPU.
  prog=$3
  for np in 2 3 4; do
    echo "### mpirun -np $np $(basename "$prog")"
    timeout -k 5 600 "${MPIRUN[@]}" -np "$np" "$prog" 12 || fail "np=$np (exit $?)"
  done ;;
equivalence)
  for np in 1 2 3 4; do
    echo "### mpirun -np $np test_mpi_equivalence"
    timeout -k 5 300 "${MPIRUN[@]}" -np "$np" "$build/tests/mpi/test_mpi_equivalence" 24 || fail "np=$np (exit $?)"
  done ;;
faults)
  # P = 2 runs the two-rank path (point to point, src/comm/mpi_pair.h),
  # P >= 3 the all-reduce: every fault at both. The mismatch at P = 2 runs
  # with the two-rank path on and off (SYNCBN_MPI_PAIR=0), and the two
  # must give the same statuses and messages.
  logs=()
  for np in 2 3; do
    for pair in 1 0; do
      [ "$np" = 2 ] || [ "$pair" = 1 ] || continue
      echo "### SYNCBN_MPI_PAIR=$pair mpirun -np $np test_mpi_faults mismatch"
      log=$(mktemp); logs+=("$log")
      SYNCBN_MPI_PAIR=$pair timeout -k 5 60 "${MPIRUN[@]}" -x SYNCBN_MPI_PAIR -np "$np" "$build/tests/mpi/test_mpi_faults" mismatch >"$log" 2>&1; rc=$?
      cat "$log"
      [ $rc -eq 0 ] || fail "mismatch np=$np SYNCBN_MPI_PAIR=$pair (exit $rc)"
    done
  done
  # statuses and messages without the times
  strip() { grep -v '^paths:' "$1" | sed 's/ in [0-9.]* s (limit/ (limit/'; }
  grep -H '^paths:' "${logs[0]}" "${logs[1]}" | sed 's/^[^:]*:/  /'
  if diff <(strip "${logs[0]}") <(strip "${logs[1]}"); then
    echo "  np=2 mismatch: the same $(grep -c '^      "' "${logs[0]}") messages with the two-rank path on and off"
  else
    fail "np=2 mismatch: messages differ between the two-rank path on and off (diff above)"
  fi
  rm -f "${logs[@]}"
  for np in 2 3; do
    echo "### mpirun -np $np test_mpi_faults timeout"
    abandoning timeout -k 5 60 "${MPIRUN[@]}" -np "$np" "$build/tests/mpi/test_mpi_faults" timeout || fail "timeout np=$np (exit $?)"
  done
  for np in 2 4; do
    for rep in 1 2; do
      echo "### mpirun -np $np test_mpi_faults timeout_exact (run $rep)"
      abandoning timeout -k 5 60 "${MPIRUN[@]}" -np "$np" "$build/tests/mpi/test_mpi_faults" timeout_exact || fail "timeout_exact np=$np (exit $?)"
    done
  done
  for np in 2 3; do
    echo "### SYNCBN_TIMEOUT=1e30 mpirun -np $np test_mpi_faults forever"
    SYNCBN_TIMEOUT=1e30 timeout -k 5 60 "${MPIRUN[@]}" -x SYNCBN_TIMEOUT -np "$np" "$build/tests/mpi/test_mpi_faults" forever || fail "forever np=$np (exit $?)"
  done ;;
setup)
  # Making groups: an invalid SYNCBN_TIMEOUT is refused by the constructor
  # on every rank; a split that fails on one rank fails on all at once.
  for v in abc 0 2x; do
    for np in 2 3; do
      echo "### SYNCBN_TIMEOUT='$v' mpirun -np $np test_mpi_group_setup bad_timeout"
      SYNCBN_TIMEOUT=$v timeout -k 5 60 "${MPIRUN[@]}" -x SYNCBN_TIMEOUT -np "$np" "$build/tests/mpi/test_mpi_group_setup" bad_timeout || fail "bad_timeout '$v' np=$np (exit $?)"
    done
  done
  for np in 2 3; do
    echo "### mpirun -np $np test_mpi_group_setup bad_timeout_one"
    abandoning timeout -k 5 60 "${MPIRUN[@]}" -np "$np" "$build/tests/mpi/test_mpi_group_setup" bad_timeout_one || fail "bad_timeout_one np=$np (exit $?)"
  done
  for np in 2 3 4; do
    echo "### mpirun -np $np test_mpi_group_setup split_fault"
    abandoning timeout -k 5 120 "${MPIRUN[@]}" -np "$np" "$build/tests/mpi/test_mpi_group_setup" split_fault || fail "split_fault np=$np (exit $?)"
  done ;;
algorithms)
  # Reproducibility: the same bits whatever reduction algorithm the engine
  # runs. The MPI backend's collectives are MPI_Iallreduce (Open MPI's
  # libnbc: coll_libnbc_iallreduce_algorithm 1 ring, 2 binomial, 3
  # rabenseifner, 4 recursive doubling); the blocking MPI_Allreduce
  # algorithms (coll_tuned_allreduce_algorithm) are forced too, for the
  # engine's own sums the test prints as evidence that the order matters.
  # Each run checks every result bitwise against the threads backend and the
  # correctly rounded exact sum, so all runs agree with each other.
  for np in 3 4; do
    for alg in 1 2 3 4; do
      echo "### np=$np coll_libnbc_iallreduce_algorithm=$alg coll_tuned_allreduce_algorithm=$((alg + 2))"
      log=$(mktemp)
      timeout -k 5 120 "${MPIRUN[@]}" -np "$np" --mca coll_libnbc_iallreduce_algorithm "$alg" \
        --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm $((alg + 2)) \
        "$build/tests/mpi/test_mpi_equivalence" 6 >"$log" 2>&1; rc=$?
      grep -E "^(FAIL|np=)|engine" "$log"
      # on failure: the end of the output, and any sanitizer report (a rank
      # that exits first prints it well before the others' last lines)
      [ $rc -eq 0 ] || { tail -30 "$log"; grep -A40 "^==[0-9]*==ERROR" "$log" | head -80; fail "np=$np algorithm $alg (exit $rc)"; }
      rm -f "$log"
    done
  done ;;
kill)
  # A rank that dies (SIGKILL) mid-training: the job must end, non-zero,
  # within bounded time, with mpirun's message naming the rank. A rank that
  # stops (SIGSTOP: alive but gone) must make the others time out after
  # SYNCBN_TIMEOUT with the library's message naming it.
  log=$(mktemp); trap 'rm -f "$log"' EXIT
  expect_end() { # name, max seconds, pattern..., -- command...
    local name=$1 max=$2; shift 2
    local pats=(); while [ "$1" != "--" ]; do pats+=("$1"); shift; done; shift
    local t0=$SECONDS
    timeout -k 5 90 "$@" >"$log" 2>&1; local rc=$?
    local took=$((SECONDS - t0))
    sed 's/^/    | /' "$log"
    echo "  $name: exit status $rc after $took s (must be non-zero, not 124 from timeout, within $max s)"
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $took -gt "$max" ]; then fail "$name: exit $rc after $took s"; fi
    for p in "${pats[@]}"; do
      if grep -q -- "$p" "$log"; then echo "  $name: found \"$p\""; else fail "$name: no \"$p\" in the output"; fi
    done
  }
  # (P = 2: the two-rank path; P = 3: the all-reduce)
  for np in 2 3; do
    echo "### rank 1 SIGKILLs itself at step 3 (mpirun -np $np, default behaviour)"
    expect_end "kill np=$np" 30 "step 2 ok" "exited on signal 9" -- \
      "${MPIRUN[@]}" -np "$np" "$build/tests/mpi/test_mpi_faults" kill
    echo "### rank 1 SIGSTOPs itself at step 3 (mpirun -np $np, SYNCBN_TIMEOUT=2)"
    abandoning expect_end "stop np=$np" 30 "step 2 ok" "SBN_STATUS_TIMEOUT" "timed out after 2 s in forward of layer #0" "waiting for rank(s) 1" -- \
      env SYNCBN_TIMEOUT=2 "${MPIRUN[@]}" -x SYNCBN_TIMEOUT -np "$np" "$build/tests/mpi/test_mpi_faults" stop
  done ;;
torch)
  timeout -k 5 300 /usr/bin/python3 tests/mpi/torch_peer_mpi.py "$build/tests/mpi/torch_peer_mpi" || fail "torch peer (exit $?)" ;;
*)
  echo "unknown part $what"; exit 2 ;;
esac
[ $fails -eq 0 ] && echo "MPI $what: all passed" || echo "MPI $what: $fails failure(s)"
[ $fails -eq 0 ]
