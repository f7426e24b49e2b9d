#!/usr/bin/env bash
# Run each test (a binary in BUILD/tests, or a shell command after "cmd:"),
# each bounded by a timeout so a hang fails instead of stalling CI.
# Prints a summary; exits non-zero if any test failed.
set -u
build=$1; shift
fails=(); n=0
export PYTHONUNBUFFERED=1
run_one() { # name, command...
  local name=$1; shift
  n=$((n + 1))
  echo "=== $name"
  local t0=$SECONDS
  timeout --kill-after=10 "${TEST_TIMEOUT:-600}" "$@"
  local rc=$?
  if [ $rc -eq 0 ]; then echo "--- PASS $name ($((SECONDS - t0)) s)"
  else echo "--- FAIL $name (exit $rc, $((SECONDS - t0)) s)"; fails+=("$name"); fi
}
for t in "$@"; do
  case "$t" in
    cmd:*) run_one "${t#cmd:}" bash -c "${t#cmd:}" ;;
    *) run_one "$t" "$build/tests/$t" ;;
  esac
done
[ -x "$build/tests/torch_peer" ] && run_one torch_peer /usr/bin/python3 tests/torch_peer.py "$build/tests/torch_peer"
echo
if [ ${#fails[@]} -eq 0 ]; then echo "ALL $n TESTS PASSED"; exit 0; fi
echo "FAILED ${#fails[@]} of $n: ${fails[*]}"; exit 1
