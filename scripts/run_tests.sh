#!/usr/bin/env bash
# Run each test (a binary in BUILD/tests, or a shell command after "cmd:"),
# each bounded by a timeout so a hang fails instead of stalling CI.
# A test that exits 77 could not run here (a tool is missing) and counts as
# skipped. Ends with "N passed, M failed[, K skipped]"; exits non-zero if
# any test failed.
set -u
build=$1; shift
fails=(); skips=(); n=0
export PYTHONUNBUFFERED=1
run_one() { # name, command...
  local name=$1; shift
  n=$((n + 1))
  echo "=== $name"
  local t0=$SECONDS
  timeout --kill-after=10 "${TEST_TIMEOUT:-600}" "$@"
  local rc=$?
  if [ $rc -eq 0 ]; then echo "--- PASS $name ($((SECONDS - t0)) s)"
  elif [ $rc -eq 77 ]; then echo "--- SKIP $name"; skips+=("$name")
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
[ ${#skips[@]} -eq 0 ] || echo "skipped: ${skips[*]}"
[ ${#fails[@]} -eq 0 ] || echo "failed: ${fails[*]}"
summary="$((n - ${#fails[@]} - ${#skips[@]})) passed, ${#fails[@]} failed"
[ ${#skips[@]} -eq 0 ] || summary+=", ${#skips[@]} skipped"
echo "$summary"
[ ${#fails[@]} -eq 0 ]
