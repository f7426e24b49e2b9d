#!/usr/bin/env bash
# Messages and bytes each rank sends per layer collective, counted by Open
# MPI's PML monitoring (every point-to-point message the engine's collective
# algorithms send), for P = 2 .. 64 ranks on this machine (oversubscribed).
# A run with K collectives minus a run with none, divided by K.
#   bench/mpi_scaling.sh BUILD [Ps] [Cs]
set -u
build=${1:-build}; Ps=${2:-"2 4 8 16 32 64"}; Cs=${3:-"64 1024 4096"}; K=20
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=$build/bench/syncbn-bench-mpi-count
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
# per-rank totals "msgs bytes" of the point-to-point traffic of the
# collectives ("I" lines of the monitoring report, printed at MPI_Finalize on
# stdout) and of the library's own messages on its communicator ("E" lines:
# the two-rank exchange at P = 2; the raw runs send none)
counts() { # mode C K P
  mpirun --oversubscribe -np "$4" --mca pml_monitoring_enable 2 --mca pml_monitoring_enable_output 1 \
    "$bin" "$1" "$2" "$3" >"$dir/err" 2>&1 || { echo "run failed: $*" >&2; exit 1; }
  awk -F'\t' -v P="$4" '$1 == "I" || $1 == "E" { split($4, b, " "); split($5, m, " "); bytes[$2] += b[1]; msgs[$2] += m[1] }
       END { for (r = 0; r < P; r++) printf "%d %d\n", msgs[r], bytes[r] }' "$dir/err"
}
echo "| mode | P | C | payload bytes | msgs/rank max | msgs/rank mean | bytes/rank max | bytes/rank mean | bytes max / payload |"
echo "|---|---|---|---|---|---|---|---|---|"
for mode in lib raw; do
  for P in $Ps; do
    for C in $Cs; do
      base=$(counts "$mode" "$C" 0 "$P"); full=$(counts "$mode" "$C" "$K" "$P")
      paste <(echo "$base") <(echo "$full") | awk -v K=$K -v P=$P -v C=$C -v mode=$mode '
        { m = ($3 - $1) / K; b = ($4 - $2) / K; if (m > mm) mm = m; if (b > bm) bm = b; ms += m; bs += b; n++ }
        END { v = 2 * C + 1; # the wire payload: raw doubles; syncbn: two-rank exchange at P = 2,
              # else integer lanes (2 per value + 10 control lanes; the first call of a run is binned)
              payload = (mode == "raw" ? 8 * v : P == 2 ? 8 * v + 32 : 16 * v + 80);
              printf "| %s | %d | %d | %d | %.1f | %.2f | %.0f | %.0f | %.2f |\n", mode == "lib" ? "syncbn" : "raw MPI_Iallreduce",
                     P, C, payload, mm, ms / n, bm, bs / n, bm / payload }'
    done
  done
done
