#!/usr/bin/env bash
# The GPU check: every GPU test, compute-sanitizer on the kernel tests, the
# GPU benchmark and PyTorch's kernel chain on the same shapes, each log in
# LOGDIR, a pass/fail summary at the end (LOGDIR/summary.txt). Well under
# 10 minutes on one H100.
#
#   scripts/gpu-check.sh --stage          on the build machine (nvcc, no GPU
#                                         needed): `make`, then copy the GPU
#                                         programs and the shared libraries
#                                         they need (but libnccl and the driver)
#                                         into build/gpu, and pack that folder
#                                         as build/gpu.tar.xz (about 9 MB; the
#                                         folder is 90 MB: fat binaries and
#                                         OpenBLAS)
#   GPU_CHECK_VARIANTS="NAME:FLAGS ..." scripts/gpu-check.sh --stage
#                                         also stages benchmark variants:
#                                         the kernels compiled (sm_90) with
#                                         FLAGS added (e.g. b1:-DSBN_CUDA_BATCH=1;
#                                         several flags separated by commas),
#                                         as build/gpu/bench/syncbn-bench-gpu-NAME
#                                         and build/gpu/tests/test_cuda_kernels-NAME;
#                                         the check runs both after the benchmark
#   scripts/gpu-check.sh LOGDIR [--pack]  on the GPU machine: runs from
#                                         build/gpu (unpacked from
#                                         build/gpu.tar.xz when only that came
#                                         along), else builds first (make -j)
#
# --pack leaves at most 6 files in LOGDIR (summary.txt, the benchmark, torch
# and speedup logs, everything in gpu-check-logs.tar.gz), for runners that
# return few files. Exit status: 0 when every step passed or skipped.
#
# With the device tool of this workplace (the build travels; see
# BENCHMARKS.md for the numbers it produced):
#   here:   scripts/gpu-check.sh --stage
#   there:  run(command="bash scripts/gpu-check.sh $OUT --pack", carry=["build/gpu.tar.xz"])
#
# Environment: PYTHON (the python with CUDA PyTorch; default python3),
# GPU_CHECK_BENCH_ARGS (e.g. "--iters 10"), GPU_CHECK_SKIP_BENCH=1,
# GPU_CHECK_BUDGET (seconds for everything, default 540: later steps get what
# is left, and are skipped when nothing is), GPU_CHECK_SANITIZE_MORE (more
# programs for compute-sanitizer than the kernel tests), GPU_CHECK_PROFILE
# (shapes for scripts/gpu-profile.sh, run last: profile.log).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

STAGE=build/gpu

# A benchmark variant: the kernels with extra nvcc flags, in a copy of
# libsyncbn_cuda.a, linked as make links the benchmark.
stage_variant() {
  local name=$1 flags=${2//,/ } dir=build/variants/$1 # commas separate flags
  rm -rf "$dir" && mkdir -p "$dir"
  cp build/libsyncbn_cuda.a "$dir/"
  local nvcc
  nvcc=$(make -s print-nvcc)
  # the kernels, and the per-channel steps (which round as the CPU does: no FMA)
  for cu in $(make -s print-cuda-kernels) src/cuda/bn_finish.cu; do
    local extra=
    [ "$cu" = src/cuda/bn_finish.cu ] && extra=-fmad=false
    $nvcc -std=c++17 -O3 $extra $flags -gencode arch=compute_90,code=sm_90 -Iinclude -Xcompiler -fPIC,-fvisibility=hidden \
      -c "$cu" -o "$dir/$(basename "$cu").o"
  done
  (cd "$dir" && ar r libsyncbn_cuda.a ./*.cu.o)
  local link
  link=$(make -s -n -W bench/gpu/bench_gpu.c build/bench/syncbn-bench-gpu | grep -- '-o build/bench/syncbn-bench-gpu')
  link=${link//build\/libsyncbn_cuda.a/$dir\/libsyncbn_cuda.a}
  eval "${link//-o build\/bench\/syncbn-bench-gpu/-o $STAGE/bench/syncbn-bench-gpu-$name}"
  # the kernel test too, so that a variant's numerics are checked in the same run
  make -s build/tests/cuda/test_cuda_kernels.cu.o
  link=$(make -s -n -W tests/cuda/test_cuda_kernels.cu build/tests/cuda/test_cuda_kernels |
         grep -- '-o build/tests/cuda/test_cuda_kernels ')
  link=${link//build\/libsyncbn_cuda.a/$dir\/libsyncbn_cuda.a}
  eval "${link//-o build\/tests\/cuda\/test_cuda_kernels /-o $STAGE/tests/test_cuda_kernels-$name }"
  echo "variant $name ($flags): $STAGE/bench/syncbn-bench-gpu-$name, $STAGE/tests/test_cuda_kernels-$name"
}

stage() {
  set -e
  make -j"$(nproc)" >/dev/null
  rm -rf "$STAGE"
  mkdir -p "$STAGE/tests" "$STAGE/bench" "$STAGE/lib"
  local progs=()
  # the test commands, with their programs copied to build/gpu/tests
  make -s print-gpu-tests >"$STAGE/tests.list.in"
  for f in $(awk '{print $1}' "$STAGE/tests.list.in" | sort -u) build/bench/syncbn-bench-gpu build/tests/cuda/test_cuda_mpi; do
    [ -f "$f" ] && [ -x "$f" ] || continue
    case "$f" in */bench/*) cp "$f" "$STAGE/bench/" ;; *) cp "$f" "$STAGE/tests/" ;; esac
    progs+=("$f")
  done
  sed -E 's|^build/([^ ]*/)?|'"$STAGE"'/tests/|' "$STAGE/tests.list.in" >"$STAGE/tests.list"
  rm -f "$STAGE/tests.list.in"
  # the shared libraries of the build (programs that load them at run time)
  for l in build/lib*.so.[0-9]; do [ -e "$l" ] && cp -L "$l" "$STAGE/lib/"; done
  # shared libraries the programs need that a bare GPU machine may lack:
  # everything but the C runtime, the driver and libnccl (too large to
  # carry; the GPU machine's PyTorch ships one)
  for p in "${progs[@]}"; do
    ldd "$p" | awk '$3 ~ /^\// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*|libcuda.so*|libnccl.so*) ;;
      *) cp -L "$lib" "$STAGE/lib/" ;;
    esac
  done
  for v in ${GPU_CHECK_VARIANTS:-}; do stage_variant "${v%%:*}" "${v#*:}"; done
  echo "staged in $STAGE: $(find "$STAGE/tests" "$STAGE/bench" -type f | wc -l) programs; libraries: $(ls "$STAGE/lib" | tr '\n' ' ')"
  du -sh "$STAGE"
  tar -C build -cf - gpu | xz -6 -T2 >"$STAGE.tar.xz"
  ls -l "$STAGE.tar.xz"
}

# The packed stage, when it came along, replaces whatever build/gpu holds
# (a machine may keep an older one); unpacked with Python's tarfile, since a
# GPU machine may lack xz.
unpack_stage() {
  [ -f "$STAGE.tar.xz" ] || return 0
  rm -rf "$STAGE"
  "${PYTHON:-python3}" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$STAGE.tar.xz" build \
    && echo "unpacked $STAGE.tar.xz"
}

if [ "${1:-}" = --stage ]; then stage; exit $?; fi
[ $# -ge 1 ] || { echo "usage: $0 LOGDIR [--pack] | --stage" >&2; exit 2; }
LOG=$1; shift
PACK=0
[ "${1:-}" = --pack ] && PACK=1
mkdir -p "$LOG"
LOG=$(cd "$LOG" && pwd)
PYTHON=${PYTHON:-python3}
T0=$SECONDS
declare -a NAMES RESULTS

BUDGET=${GPU_CHECK_BUDGET:-540} # seconds for everything (the device tool allows 600 a command)
step() { # name timeout-seconds command... ; logs to LOG/name.log
  local name=$1 limit=$2; shift 2
  local t=$SECONDS left=$((BUDGET - (SECONDS - T0) - 15))
  if [ $left -lt 20 ]; then
    NAMES+=("$name"); RESULTS+=("SKIP(no time left in ${BUDGET}s)"); echo "--- SKIP $name (no time left)"; return
  fi
  [ "$limit" -gt $left ] && limit=$left
  echo "=== $name ($(date -u +%T), up to ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  local res=PASS
  if [ $rc -ne 0 ]; then res="FAIL(exit $rc)"; [ $rc -eq 124 ] && res="FAIL(timeout ${limit}s)"; fi
  grep -q '^SKIP' "$LOG/$name.log" && [ $rc -eq 0 ] && res=SKIP
  NAMES+=("$name"); RESULTS+=("$res")
  tail -n 3 "$LOG/$name.log" | sed 's/^/    /'
  echo "--- $res $name ($((SECONDS - t)) s)"
}

# ---- the build: staged, or made here ----
unpack_stage
if [ -f "$STAGE/tests.list" ]; then
  BENCH=$STAGE/bench/syncbn-bench-gpu
  TEST_CMDS=$(cat "$STAGE/tests.list")
  echo "using the staged build in $STAGE"
else
  # NCCL's header and library from PyTorch's nvidia-nccl wheel when the CUDA
  # toolkit has none
  if [ -z "${NCCL_HOME:-}" ] && [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
    NCCL_HOME=$("$PYTHON" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) && export NCCL_HOME
  fi
  step build 420 make -j"$(nproc)"
  BENCH=build/bench/syncbn-bench-gpu
  TEST_CMDS=$(make -s print-gpu-tests)
fi

# libraries: the staged ones, CUDA's, and libnccl from wherever it is
# (the CUDA toolkit, the system, or the nvidia-nccl wheel PyTorch uses)
libpath="$here/$STAGE/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && libpath="$libpath:$d"
done
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2' && ! ls /usr/local/cuda/lib*/libnccl.so.2 >/dev/null 2>&1; then
  ncclpy=$("$PYTHON" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$ncclpy" ] && libpath="$libpath:$ncclpy"
fi
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libpath"

step nvidia-smi 30 bash -c 'nvidia-smi; nvidia-smi -q -d CLOCK,POWER | head -60; uname -a'
{ echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; for p in $(echo "$TEST_CMDS" | awk '{print $1}' | sort -u) "$BENCH"; do [ -x "$p" ] && { echo "== $p"; ldd "$p" | grep -E 'not found|nccl|cudart'; }; done; } >"$LOG/libraries.log" 2>&1

# ---- every GPU test (each prints SKIP when it finds no GPU) ----
while IFS= read -r cmd; do
  [ -n "$cmd" ] || continue
  name=$(echo "$cmd" | awk '{n = $1; sub(/.*\//, "", n); for (i = 2; i <= NF; i++) n = n "-" $i; print n}')
  step "$name" 180 bash -c "$cmd"
done <<<"$TEST_CMDS"

# ---- MPI processes sharing the GPU (the host-staged path), where Open MPI is ----
MPI_PROG=build/tests/cuda/test_cuda_mpi
[ -f "$STAGE/tests.list" ] && MPI_PROG=$STAGE/tests/test_cuda_mpi
if command -v mpirun >/dev/null 2>&1 && [ -x "$MPI_PROG" ]; then
  step mpi-cuda 240 bash tests/mpi/run_mpi.sh build cuda "$MPI_PROG"
else
  echo "--- SKIP mpi-cuda (mpirun: $(command -v mpirun || echo 'not found'); $MPI_PROG: $([ -x "$MPI_PROG" ] && echo ok || echo missing))"
  NAMES+=(mpi-cuda); RESULTS+=("SKIP(no mpirun or no program)")
fi

# ---- the Python package on CUDA tensors (PyTorch with CUDA) ----
pylib=build/libsyncbn.so
[ -f "$STAGE/tests.list" ] && pylib=$STAGE/lib/libsyncbn.so.1
step python-cuda 240 env PYTHONPATH="$here/python:$here/tests/python" SYNCBN_LIBRARY="$here/$pylib" \
  "$PYTHON" tests/python/test_cuda.py

# ---- the benchmark and PyTorch's chain ----
if [ "${GPU_CHECK_SKIP_BENCH:-0}" != 1 ]; then
  if [ -x "$BENCH" ]; then
    step bench-gpu 300 "$BENCH" ${GPU_CHECK_BENCH_ARGS:-}
  else
    NAMES+=(bench-gpu); RESULTS+=("FAIL(not built: the CUDA layer's API is missing)")
  fi
  for vb in "$BENCH"-*; do
    [ -x "$vb" ] || continue
    vt=$(dirname "$(dirname "$vb")")/tests/test_cuda_kernels-${vb##*/syncbn-bench-gpu-}
    [ -x "$vt" ] && step "${vt##*/}" 120 "$vt"
    step "bench-${vb##*/syncbn-bench-gpu-}" 120 "$vb" --no-nccl ${GPU_CHECK_BENCH_ARGS:-}
  done
  step torch-chain 300 "$PYTHON" bench/gpu/torch_chain.py ${GPU_CHECK_BENCH_ARGS:-}
  if grep -q '^ROW ' "$LOG/bench-gpu.log" 2>/dev/null && grep -q '^ROW ' "$LOG/torch-chain.log" 2>/dev/null; then
    # GPU time against GPU time (both captured in graphs), then our calls
    # as a program makes them (the host's calls included)
    step speedup 30 bash -c '"$0" bench/gpu/combine.py "$1" "$2" --ours syncbn-graph && echo &&
      echo "--- without graphs: the library called directly (host calls included)" &&
      "$0" bench/gpu/combine.py "$1" "$2" --ours syncbn-none' "$PYTHON" "$LOG/bench-gpu.log" "$LOG/torch-chain.log"
  fi
fi

# ---- compute-sanitizer on the kernel tests (GPU_CHECK_SANITIZE_MORE: more) ----
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ]; then
  kernel_tests=$(echo "$TEST_CMDS" | awk '{print $1}' | grep -E '/test_[a-z_]*kernels?$' | sort -u)
  for t in $kernel_tests ${GPU_CHECK_SANITIZE_MORE:-}; do
    [ -x "$t" ] || continue
    # --quick: the cases up to 500000 values (every kernel, dtype, layout and
    # odd shape), so both tools fit the budget
    for tool in memcheck racecheck; do
      step "$tool-$(basename "$t")" 240 "$SAN" --tool "$tool" --error-exitcode 3 "$t" --quick
    done
  done
else
  NAMES+=(compute-sanitizer); RESULTS+=("FAIL(not found)")
fi

# ---- optional: Nsight Compute per-kernel profile of some shapes ----
# (GPU_CHECK_PROFILE="32x256x56x56 ..."; scripts/gpu-profile.sh's summary)
if [ -n "${GPU_CHECK_PROFILE:-}" ]; then
  step profile 300 bash scripts/gpu-profile.sh "$LOG/prof" $GPU_CHECK_PROFILE
fi

# ---- summary ----
{
  echo "gpu-check $(date -u '+%F %T') UTC, $((SECONDS - T0)) s, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  fails=0
  for i in "${!NAMES[@]}"; do
    printf '  %-40s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    case "${RESULTS[$i]}" in FAIL*) fails=$((fails + 1)) ;; esac
  done
  echo "$(( ${#NAMES[@]} - fails )) passed or skipped, $fails failed"
} | tee "$LOG/summary.txt"
fails=$(grep -c 'FAIL' "$LOG/summary.txt")

if [ $PACK = 1 ]; then
  (cd "$LOG" && tar czf gpu-check-logs.tar.gz --exclude=gpu-check-logs.tar.gz *.log $([ -d prof ] && echo prof) &&
     find . -maxdepth 1 -name '*.log' ! -name 'bench-gpu.log' ! -name 'torch-chain.log' ! -name 'speedup.log' -delete &&
     rm -rf prof)
fi
[ "$fails" -eq 0 ]
