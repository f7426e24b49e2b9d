#!/usr/bin/env bash
# Install the Debian packages a target needs, only those missing.
# Usage: scripts/deps.sh PACKAGE...
#        scripts/deps.sh --check PACKAGE...   only print the missing ones
#                                              (nothing where there is no dpkg)
set -euo pipefail
check=0
[ "${1:-}" = --check ] && { check=1; shift; }
[ $check = 1 ] && ! command -v dpkg-query >/dev/null && exit 0
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
[ $check = 1 ] && { echo "${missing[*]}"; exit 0; }
echo "deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
