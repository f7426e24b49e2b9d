#!/usr/bin/env bash
# The README's Python steps on a clean environment: `make python-install`
# into a new venv (that sees Debian's torch), then, from outside the source
# tree, the package loads its bundled libsyncbn.so and the DDP example trains
# on 2 processes it spawns itself, and on 2 processes started like a
# launcher would (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, env://).
# Usage: tests/python/test_install.sh BUILD_DIR
set -u
build=$1
repo=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

make --no-print-directory -s python-install VENV="$tmp/venv" BUILD="$build" > "$tmp/install.log" 2>&1 \
  || { cat "$tmp/install.log"; fail "make python-install"; }
echo "  ok    make python-install VENV=$tmp/venv"
cd "$tmp"
unset PYTHONPATH SYNCBN_LIBRARY
where=$("$tmp/venv/bin/python" -c 'import syncbn, syncbn.torch; print(syncbn.library_path)') \
  || fail "import syncbn.torch in the venv"
case "$where" in
  "$tmp/venv/"*) echo "  ok    the venv's syncbn loads its bundled library: $where" ;;
  *) fail "syncbn loaded $where, not the copy bundled in the venv" ;;
esac
# A build with CUDA support bundles libsyncbn_cuda.so.1 too, and the bundled
# libsyncbn opens it (no GPU here: OK with 0 devices, not NOT_BUILT).
if [ -f "$repo/$build/libsyncbn_cuda.so.1" ] || [ -f "$build/libsyncbn_cuda.so.1" ]; then
  cuda=$("$tmp/venv/bin/python" -c 'import ctypes
from syncbn import _lib
n = ctypes.c_int(-1)
print(_lib.lib.sbn_status_name(_lib.lib.sbn_cuda_device_count(ctypes.byref(n))).decode(), n.value)') \
    || fail "sbn_cuda_device_count through the venv's package"
  case "$cuda" in
    "SBN_STATUS_OK "*) echo "  ok    the bundled libsyncbn_cuda.so.1 loads: sbn_cuda_device_count -> $cuda" ;;
    *) fail "the venv's package does not reach its bundled libsyncbn_cuda.so.1: $cuda" ;;
  esac
fi

out=$(SYNCBN_NUM_THREADS=1 timeout 120 "$tmp/venv/bin/python" "$repo/examples/python/ddp_cpu.py" --steps 10 2>&1) \
  || { echo "$out"; fail "examples/python/ddp_cpu.py (spawned processes)"; }
echo "$out" | sed 's/^/        /'
echo "$out" | grep -q "2 processes, syncbn.torch.SyncBatchNorm; running_mean identical on every rank: True" \
  || fail "the example did not train 2 processes with syncbn's SyncBatchNorm"
echo "  ok    examples/python/ddp_cpu.py trains with SyncBatchNorm under DDP on 2 spawned processes"

port=$((20000 + RANDOM % 20000))
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port SYNCBN_NUM_THREADS=1 \
    timeout 120 "$tmp/venv/bin/python" "$repo/examples/python/ddp_cpu.py" --steps 3 > "$tmp/env$r.log" 2>&1 &
done
wait %1; rc0=$?; wait %2; rc1=$?
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q "identical on every rank: True" "$tmp/env0.log" \
  || { cat "$tmp/env0.log" "$tmp/env1.log"; fail "launcher-style start (env://), exit codes $rc0 $rc1"; }
echo "  ok    launcher-style start (RANK, WORLD_SIZE, MASTER_ADDR/PORT): $(tail -1 "$tmp/env0.log")"
echo "python install checks passed"
