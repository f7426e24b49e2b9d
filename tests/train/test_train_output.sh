#!/usr/bin/env bash
# What syncbn-train shows and draws:
#  - on a terminal 50 columns wide, every progress line fits in 49 columns and shows an ETA;
#  - the plot gets only the modes that ran, and the paths as gnuplot arguments (a
#    stand-in gnuplot, SYNCBN_GNUPLOT, records its arguments and script).
set -u
bin=$(realpath "${1:-build/tools/syncbn-train}")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if [ "$2" -eq 0 ]; then echo "  ok    $1"; else echo "  FAIL  $1"; fail=1; fi; }

run="--bn sync --ranks 2 --batch 4 --epochs 1 --train-size 256 --test-size 64"
timeout -k 5 120 script -qec "stty cols 50 rows 20; $bin $run --out $tmp/tty" "$tmp/typescript" >/dev/null 2>&1
rc=$?
tr '\r' '\n' <"$tmp/typescript" | grep 'epoch 1/1' >"$tmp/bars"
n=$(wc -l <"$tmp/bars"); widest=$(awk '{ if (length($0) > w) w = length($0) } END { print w + 0 }' "$tmp/bars")
echo "    $n progress lines, widest $widest columns; last: $(tail -1 "$tmp/bars")"
[ $rc -eq 0 ] && [ "$n" -gt 0 ] && [ "$widest" -le 49 ] && grep -q 'ETA [0-9]*:[0-9][0-9]' "$tmp/bars"
check "the progress bar fits a 50-column terminal and shows an ETA" $?

cat >"$tmp/fakeplot" <<'SH'
#!/bin/sh
# records its arguments (one per line, NUL-free) and the script it reads
for a in "$@"; do printf '%s\n---\n' "$a"; done >"$FAKE_OUT.args"
cat >"$FAKE_OUT.script"
SH
chmod +x "$tmp/fakeplot"
for mode in sync local both; do
  FAKE_OUT="$tmp/$mode" SYNCBN_GNUPLOT="$tmp/fakeplot" timeout -k 5 120 "$bin" --bn $mode --ranks 2 --batch 4 \
    --epochs 1 --train-size 64 --test-size 32 --quiet --out "$tmp/o-$mode" >/dev/null 2>&1
  modes=$(awk -v RS='\n---\n' 'NR == 6' "$tmp/$mode.args")
  echo "    --bn $mode: modes passed to the plot: '$modes'"
  case $mode in sync) want=syncbn ;; local) want=localbn ;; both) want="syncbn localbn" ;; esac
  [ "$modes" = "$want" ]
  check "--bn $mode: the legend lists only '$want'" $?
done
grep -q "$tmp/o-both" "$tmp/both.script"
check "no path is pasted into the gnuplot script" $(( $? == 0 ))

[ $fail -eq 0 ] && echo "syncbn-train output checks passed" || echo "FAILED"
exit $fail
