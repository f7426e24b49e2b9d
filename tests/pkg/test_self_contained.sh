#!/usr/bin/env bash
# The repository explains itself: code comments, headers and docs point at
# files in the repository (ARCHITECTURE.md, README.md, BENCHMARKS.md), never
# at design notes, issue numbers or specification documents kept elsewhere,
# nor at headers that do not exist. Fails listing each offending line.
set -u
self=tests/pkg/test_self_contained.sh
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  files=$(git ls-files --cached --others --exclude-standard | grep -v -x "$self")
else
  files=$(find . -type f -not -path './build*' -not -path './.git/*' | sed 's|^\./||' | grep -v -x "$self")
fi
# Built from pieces so that this file does not match itself.
d=DESIGN; i=issue; s=seed
pat="$d §|$d\.md|\b$i [0-9]|\b$i #[0-9]|the ${s}s\b|${s}s'|\b$s 00[0-9]|\.\./shared/"
hits=$(echo "$files" | xargs -d '\n' grep -n -I -E "$pat" 2>/dev/null)
for h in $(echo "$files" | xargs -d '\n' grep -o -h -I -E '\bsyncbn_[a-z]+\.h\b' 2>/dev/null | sort -u); do
  [ -f "include/$h" ] || hits+=$'\n'"$(echo "$files" | xargs -d '\n' grep -n -I -F "$h" | sed "s/\$/   <- include\/$h does not exist/")"
done
hits=$(echo "$hits" | grep .)
n=$(echo "$files" | grep -c .)
if [ -n "$hits" ]; then
  echo "FAIL: references outside the repository (or to missing headers):"
  echo "$hits" | head -40
  exit 1
fi
echo "OK: $n files checked, no references to documents outside the repository or missing headers"
