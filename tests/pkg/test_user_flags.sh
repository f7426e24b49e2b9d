#!/usr/bin/env bash
# `make CC=clang CFLAGS=-O2` builds a working library: the user's CC and
# CFLAGS replace the defaults, the project's own flags (language level,
# warnings, PIC, visibility, OpenMP) still apply. Builds the library and one
# example into a temporary build directory, checks the compile lines, the
# exported symbols, and runs the example.
set -u
command -v clang >/dev/null || { echo "SKIP: clang not installed (make test installs it)"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
b=$tmp/build
if ! make --no-print-directory -j2 BUILD="$b" CC=clang CFLAGS=-O2 lib "$b/examples/two_ranks" >"$tmp/log" 2>&1; then
  tail -40 "$tmp/log"; echo "FAIL: make CC=clang CFLAGS=-O2 did not build"; exit 1
fi
compiles=$(grep -E '^clang .* -c ' "$tmp/log")
n=$(echo "$compiles" | grep -c .)
bad=$(echo "$compiles" | grep -v -- ' -O2' ; echo "$compiles" | grep -E -- ' -O3| -O0' ;
      echo "$compiles" | grep -v -- '-fvisibility=hidden' ; echo "$compiles" | grep -v -- '-std=gnu11')
omp=$(grep -E '^clang .*cpu_parallel\.c' "$tmp/log" | grep -c -- '-fopenmp')
echo "clang compiled $n files with -O2 and the project's flags; cpu_parallel.c with -fopenmp: $omp"
rc=0
[ "$n" -ge 10 ] || { echo "FAIL: expected the library's compile lines in the log"; rc=1; }
[ -z "$bad" ] || { echo "FAIL: compile lines without -O2, -std=gnu11, -fvisibility=hidden, or with -O3:"; echo "$bad" | head -5; rc=1; }
[ "$omp" -eq 1 ] || { echo "FAIL: cpu_parallel.c was not compiled with -fopenmp"; rc=1; }
make --no-print-directory -s BUILD="$b" CC=clang CFLAGS=-O2 check-exports || rc=1
"$b/examples/two_ranks" || { echo "FAIL: the example built with clang failed"; rc=1; }
exit $rc
