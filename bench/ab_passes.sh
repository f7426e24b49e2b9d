#!/bin/bash
# A/B of the CPU kernel passes between a base revision and the working tree,
# robust to a host whose memory bandwidth moves by 2x from minute to minute:
# both builds of syncbn-bench-passes run alternately, and what is compared is
# each pass's `rul` column (ruler time / pass time, the ruler timed in the same
# seconds as the pass), the middle of the runs, as variant / base.
#
# Keep a control in the shapes: a pass the change cannot touch (the
# channels-first passes for a change to the rows layout). When the control
# moves by as much as the passes under test, the run says nothing.
#
# Usage: bench/ab_passes.sh [--base REV] [--runs N] [--isa NAME] [SHAPE-PREFIX ...]
#   --base REV   what to compare against (default HEAD)
#   --runs N     runs of each build, alternating (default 3)
#   --isa NAME   the kernels' instruction-set level (syncbn-bench-passes --isa)
#   SHAPE-PREFIX syncbn-bench-passes --only prefixes (default: the whole list)
# Prints per shape, layout, dtype and pass the rul values of both builds, then
# the geometric mean of variant / base per layout and pass.
set -euo pipefail
base=HEAD runs=3 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --isa) extra+=(--isa "$2"); shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=("")
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

git -C "$root" worktree add --detach -q "$work/base" "$base"
make -C "$work/base" -j2 build/bench/syncbn-bench-passes >/dev/null
make -C "$root" -j2 build/bench/syncbn-bench-passes >/dev/null
cp "$work/base/build/bench/syncbn-bench-passes" "$work/bin-base"
cp "$root/build/bench/syncbn-bench-passes" "$work/bin-var"

for ((i = 1; i <= runs; i++)); do
  for v in base var; do
    for s in "${shapes[@]}"; do
      if [ -n "$s" ]; then "$work/bin-$v" --threads 2 --reps 21 "${extra[@]}" --only "$s"
      else "$work/bin-$v" --threads 2 --reps 21 "${extra[@]}"; fi
    done | sed "s/^/$v /" >> "$work/out"
  done
done

# lines: "base|var shape ly dtype | ms eff rul | ms eff rul | ..."
awk '
  ($1 == "base" || $1 == "var") && $5 == "|" && $6 ~ /^[0-9.]+$/ {
    split("stats norm bred belt", name, " ")
    for (p = 0; p < 4; p++) {
      key = $2 " " $3 " " $4 " " name[p + 1]
      vals[$1, key] = vals[$1, key] " " $(8 + 4 * p)
      group[key] = $3 " " name[p + 1]
    }
  }
  function mid(s,   a, n, i, j, t) {
    n = split(s, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return a[int((n + 1) / 2)]
  }
  END {
    for (k in group) {
      b = mid(vals["base", k]); v = mid(vals["var", k])
      printf "1 %-34s base%s  var%s\n", k, vals["base", k], vals["var", k]
      if (b > 0 && v > 0) { sum[group[k]] += log(v / b); cnt[group[k]]++ }
    }
    for (g in sum) printf "2 %-12s variant / base, rul: %.3f (geometric mean of %d)\n", g, exp(sum[g] / cnt[g]), cnt[g]
  }' "$work/out" | sort -k1,1 -k2 | cut -c3-
