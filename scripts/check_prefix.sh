#!/usr/bin/env bash
# Every global symbol the static archives define starts with sbn_ (a program
# linking libsyncbn.a cannot clash with an internal helper named like one of
# its own functions, e.g. a "dp_pack"). Usage: scripts/check_prefix.sh ARCHIVE...
set -euo pipefail
all=$(nm -g --defined-only "$@" 2>/dev/null | awk 'NF == 3 {print $3}' | sort -u)
bad=$(echo "$all" | grep -v -e '^sbn_' -e '^$' || true)
echo "check_prefix: $(echo "$all" | grep -c .) global symbols in $*"
if [ -n "$bad" ]; then echo "FAIL: global symbols without the sbn_ prefix:"; echo "$bad" | sed 's/^/  /'; exit 1; fi
echo "OK: every global symbol starts with sbn_"
