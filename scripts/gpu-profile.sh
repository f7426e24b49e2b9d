#!/usr/bin/env bash
# Per-kernel profile of the GPU benchmark under Nsight Compute: duration,
# DRAM, L1 and SM throughput, occupancy and issue rate of every kernel of one
# forward and backward per configuration, summarized per kernel name and
# configuration; then the reductions' stall reasons.
#
#   scripts/gpu-profile.sh LOGDIR [SHAPE...]   (default: 32x2048x7x7 32x256x56x56
#                                               32x64x112x112 16384x1024)
# Each shape is profiled in float32 and bfloat16, both layouts (one ncu run
# each: the kernels of one warm-up and one timed forward and backward).
#
# Runs from the staged build (build/gpu, or build/gpu.tar.xz; see
# scripts/gpu-check.sh --stage). Writes LOGDIR/ncu-*.csv and prints the summaries.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
LOG=$1; shift
mkdir -p "$LOG"
PYTHON=${PYTHON:-python3}
if [ -f build/gpu.tar.xz ]; then
  rm -rf build/gpu
  "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' build/gpu.tar.xz build
fi
libpath="$here/build/gpu/lib:/usr/local/cuda/lib64"
ncclpy=$("$PYTHON" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$ncclpy" ] && libpath="$libpath:$ncclpy"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libpath"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ $# -gt 0 ] || set -- 32x2048x7x7 32x256x56x56 32x64x112x112 16384x1024
STALLS=$(for r in long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle barrier \
  not_selected selected no_instruction dispatch_stall; do
  printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' "$r"; done)
STALLS=${STALLS%,}
for shape in "$@"; do
  for dt in f32 bf16; do
    for ly in cf cl; do
      case $shape in *x*x*x*) ;; *) [ $ly = cl ] && continue ;; esac
      f="$LOG/ncu-$shape-$dt-$ly.csv"
      echo "== $shape $dt $ly"
      timeout 120 "$NCU" --clock-control none -k 'regex:reduce|merge|elemt|finish|zero|stats' \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section ComputeWorkloadAnalysis --csv --page details \
        build/gpu/bench/syncbn-bench-gpu --iters 1 --warmup 1 --no-nccl --only "$shape" --dtype $dt --layout $ly \
        >"$f" 2>"$f.err" || { echo "ncu failed: $(tail -n 2 "$f.err")"; continue; }
      "$PYTHON" bench/gpu/ncu_summary.py "$f" | grep -v '^ROW'
      # why the reductions wait: stall reasons per issued instruction (a
      # metric this ncu lacks fails this run only)
      timeout 120 "$NCU" --clock-control none -k 'regex:reduce' --metrics "$STALLS" --csv --page details \
        build/gpu/bench/syncbn-bench-gpu --iters 1 --warmup 1 --no-nccl --only "$shape" --dtype $dt --layout $ly \
        >"$f.stalls.csv" 2>"$f.stalls.err" &&
        "$PYTHON" bench/gpu/ncu_summary.py "$f.stalls.csv" | sed -n '/^stalls/,$p' ||
        echo "stall metrics failed: $(tail -n 2 "$f.stalls.err")"
    done
  done
done
