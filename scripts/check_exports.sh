#!/usr/bin/env bash
# The shared library exports exactly the functions its public headers declare.
#
# Usage: scripts/check_exports.sh [--allow SYMBOL]... LIBRARY.so HEADER...
#
# From the headers: every function declaration (comments, preprocessor lines
# and bodies of static inline functions removed; typedefs and static
# functions skipped) must carry SBN_API. From the library: the defined
# dynamic symbols (nm -D --defined-only). Fails on a declaration without
# SBN_API, on a declared function the library does not export (missing), and
# on an exported symbol no header declares (extra: an internal function or a
# test hook leaking out). --allow names a symbol exported on purpose without
# a public declaration (libsyncbn's table for its backend library).
set -euo pipefail
allow=""
while [ "${1:-}" = --allow ]; do allow+="$2"$'\n'; shift 2; done
lib=$1; shift
[ -f "$lib" ] || { echo "check_exports: $lib not found" >&2; exit 2; }

declared=$(perl -e '
  my (%names, @bad);
  for my $h (@ARGV) {
    local $/; open my $f, "<", $h or die "$h: $!"; my $s = <$f>;
    $s =~ s{/\*.*?\*/}{ }gs;                      # block comments
    $s =~ s{//[^\n]*}{}g;                         # line comments
    $s =~ s{^[ \t]*#(?:[^\n]*\\\n)*[^\n]*}{}mg;   # preprocessor lines
    $s =~ s{extern\s+"C"\s*\{}{}g;
    $s =~ s{(\{(?:[^{}]++|(?1))*\})}{;}g;         # bodies (inline functions, structs, enums)
    for my $st (split /;/, $s) {
      $st =~ s/^\s+|\s+$//g;
      next if $st eq "" || $st !~ /\(/ || $st =~ /^(typedef|static)\b/;
      $st =~ /(\w+)\s*\(/ or next;
      my $name = $1;
      next if $name eq "SBN_API";
      push @bad, "$h: $name is declared without SBN_API" unless $st =~ /^SBN_API\b/;
      $st =~ /^SBN_API\b[^(]*?\b(\w+)\s*\(/ and $name = $1;
      $names{$name} = 1;
    }
  }
  print STDERR "$_\n" for @bad;
  print "$_\n" for sort keys %names;
  exit(@bad ? 1 : 0);
' "$@") || { echo "FAIL: public declarations without SBN_API (above)"; exit 1; }

exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtDdBbRrVvWwi]$/ {print $3}' | sed 's/@.*//' | sort -u)

extra=$(comm -13 <(printf '%s\n%s' "$declared" "$allow" | grep . | sort -u) <(echo "$exported"))
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
nd=$(echo "$declared" | grep -c .) ne=$(echo "$exported" | grep -c .)
echo "check_exports: $lib exports $ne symbols; $# headers declare $nd functions${allow:+; allowed: $(echo $allow)}"
rc=0
if [ -n "$extra" ]; then
  echo "FAIL: exported but not declared in a public header (should be hidden):"
  echo "$extra" | sed 's/^/  /'; rc=1
fi
if [ -n "$missing" ]; then
  echo "FAIL: declared in a public header but not exported:"
  echo "$missing" | sed 's/^/  /'; rc=1
fi
[ $rc -eq 0 ] && echo "OK: exported symbols == public declarations"
exit $rc
