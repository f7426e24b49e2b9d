#!/usr/bin/env bash
# `make install` into a temporary prefix, then programs built against the
# installed files both ways a user would: pkg-config + cc, and CMake's
# find_package(syncbn CONFIG). Checks the installed layout (versioned
# libraries and links, SONAMEs, headers, pkg-config and CMake files,
# syncbn-train), that libsyncbn.so does not depend on MPI and a threads-only
# program does not load libmpi, that DESTDIR staging installs the same files
# with the final PREFIX inside, and runs every consumer (the MPI one under
# mpirun). Usage: tests/pkg/test_install.sh BUILD
set -u
build=${1:-build}
for t in pkg-config cmake readelf; do
  command -v $t >/dev/null || { echo "SKIP: $t not installed (make test installs it)"; exit 77; }
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
src=tests/pkg/consumer
CC=${CC:-cc}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }
version=$(sed -n 's/^#define SYNCBN_VERSION_\(MAJOR\|MINOR\|PATCH\) //p' include/syncbn.h | paste -sd.)
major=${version%%.*}
with_mpi=0; [ -n "$(nm -D "$build/libsyncbn_mpi.so" 2>/dev/null | grep ' U MPI_')" ] && with_mpi=1

echo "### make install PREFIX=$prefix (version $version, MPI part: $with_mpi)"
make --no-print-directory -s install BUILD="$build" PREFIX="$prefix" >"$tmp/install.log" 2>&1 \
  || { cat "$tmp/install.log"; echo "FAIL: make install"; exit 1; }
for l in libsyncbn libsyncbn_mpi; do
  f=$prefix/lib/$l.so.$version
  [ -f "$f" ] && [ ! -L "$f" ] || fail "$f missing"
  [ "$(readlink "$prefix/lib/$l.so.$major")" = "$l.so.$version" ] || fail "$l.so.$major does not link to $l.so.$version"
  [ "$(readlink "$prefix/lib/$l.so")" = "$l.so.$major" ] || fail "$l.so does not link to $l.so.$major"
  [ -f "$prefix/lib/$l.a" ] || fail "$l.a missing"
  soname=$(readelf -d "$f" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
  [ "$soname" = "$l.so.$major" ] && ok "$l.so.$version, SONAME $soname, links .so.$major and .so, $l.a" || fail "$l SONAME '$soname'"
done
for f in include/syncbn.h include/syncbn_mpi.h lib/pkgconfig/syncbn.pc lib/pkgconfig/syncbn-mpi.pc \
         lib/cmake/syncbn/syncbn-config.cmake lib/cmake/syncbn/syncbn-config-version.cmake bin/syncbn-train; do
  [ -f "$prefix/$f" ] || fail "$f not installed"
done
"$prefix/bin/syncbn-train" --help >/dev/null 2>&1 && ok "installed syncbn-train --help runs" || fail "installed syncbn-train --help"

needed=$(readelf -d "$prefix/lib/libsyncbn.so.$version" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "libsyncbn.so NEEDED: $needed"
echo "$needed" | grep -q -E 'mpi|open-rte|open-pal' && fail "libsyncbn.so depends on MPI" || ok "libsyncbn.so has no MPI dependency"
if [ $with_mpi = 1 ]; then
  readelf -d "$prefix/lib/libsyncbn_mpi.so.$version" | grep -q 'NEEDED.*\[libsyncbn.so.'"$major"'\]' \
    && ok "libsyncbn_mpi.so needs libsyncbn.so.$major" || fail "libsyncbn_mpi.so does not link libsyncbn.so.$major"
fi

# A threads-only program must not load libmpi (or hwloc, libgfortran's MPI
# friends): the loader's own log of what it initializes.
no_mpi_loaded() { # binary
  local libs; libs=$(LD_DEBUG=libs "$1" 2>&1 >/dev/null | sed -n 's/.*calling init: //p')
  echo "$libs" | grep -q "libsyncbn.so.$major" || { fail "$1 did not load libsyncbn.so.$major"; return; }
  if echo "$libs" | grep -q -E 'libmpi|open-rte|open-pal'; then fail "$1 loaded MPI: $(echo "$libs" | grep -E 'mpi|open-')"
  else ok "$(basename "$1") loaded libsyncbn.so.$major and $(($(echo "$libs" | grep -c .) - 1)) other libraries, none of MPI"; fi
}

mpirun_np() { # np binary
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 120 \
    mpirun --oversubscribe -np "$1" "$2"
}

echo "### pkg-config + $CC"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
echo "pkg-config --cflags --libs syncbn: $(pkg-config --cflags --libs syncbn)"
# shellcheck disable=SC2046
$CC -o "$tmp/pc_threads" "$src/threads_consumer.c" $(pkg-config --cflags syncbn) \
    $(pkg-config --libs syncbn) -lm -Wl,-rpath,"$prefix/lib" || fail "pkg-config build of threads_consumer"
if [ -x "$tmp/pc_threads" ]; then
  ldd "$tmp/pc_threads" | grep -q "libsyncbn.so.$major => $prefix/lib/" || fail "pc_threads does not resolve the installed libsyncbn"
  "$tmp/pc_threads" || fail "pc_threads"
  no_mpi_loaded "$tmp/pc_threads"
fi
# The static archive with the dependencies pkg-config --static lists.
# shellcheck disable=SC2046
$CC -o "$tmp/pc_static" "$src/threads_consumer.c" $(pkg-config --cflags syncbn) \
    -Wl,-Bstatic -lsyncbn -Wl,-Bdynamic $(pkg-config --static --libs syncbn | sed 's/ -lsyncbn\b//') -lm \
  || fail "static build with pkg-config --static"
if [ -x "$tmp/pc_static" ]; then
  ldd "$tmp/pc_static" | grep -q libsyncbn && fail "pc_static links libsyncbn.so"
  "$tmp/pc_static" >/dev/null && ok "static link (libsyncbn.a + pkg-config --static) runs" || fail "pc_static"
fi
if [ $with_mpi = 1 ]; then
  echo "pkg-config --cflags --libs syncbn-mpi: $(pkg-config --cflags --libs syncbn-mpi)"
  # shellcheck disable=SC2046
  $CC -o "$tmp/pc_mpi" "$src/mpi_consumer.c" $(pkg-config --cflags syncbn-mpi) \
      $(pkg-config --libs syncbn-mpi) -lm -Wl,-rpath,"$prefix/lib" || fail "pkg-config build of mpi_consumer"
  [ -x "$tmp/pc_mpi" ] && { mpirun_np 3 "$tmp/pc_mpi" || fail "mpirun -np 3 pc_mpi"; }
fi

echo "### CMake: find_package(syncbn CONFIG)"
if cmake -S "$src" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$CC" >"$tmp/cmake.log" 2>&1 \
   && cmake --build "$tmp/cmake" >>"$tmp/cmake.log" 2>&1; then
  ok "cmake configure + build"
  "$tmp/cmake/threads_consumer" || fail "cmake threads_consumer"
  ldd "$tmp/cmake/threads_consumer" | grep -q "libsyncbn.so.$major => $prefix/lib/" || fail "cmake threads_consumer does not resolve the installed libsyncbn"
  no_mpi_loaded "$tmp/cmake/threads_consumer"
  if [ $with_mpi = 1 ]; then
    if [ -x "$tmp/cmake/mpi_consumer" ]; then mpirun_np 2 "$tmp/cmake/mpi_consumer" || fail "mpirun -np 2 cmake mpi_consumer"
    else fail "syncbn::mpi not found by CMake although the MPI part was built"; fi
  fi
else
  cat "$tmp/cmake.log"; fail "cmake consumer"
fi
# A request the installation cannot satisfy fails with the package's message.
mkdir -p "$tmp/bad"
printf 'cmake_minimum_required(VERSION 3.13)\nproject(bad C)\nfind_package(syncbn %s CONFIG REQUIRED)\n' "$((major + 1)).0" > "$tmp/bad/CMakeLists.txt"
cmake -S "$tmp/bad" -B "$tmp/bad/b" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/bad.log" 2>&1 \
  && fail "find_package(syncbn $((major + 1)).0) accepted version $version" \
  || ok "find_package(syncbn $((major + 1)).0) refused (installed $version)"

echo "### DESTDIR staging"
make --no-print-directory -s install BUILD="$build" DESTDIR="$tmp/stage" PREFIX=/opt/syncbn >"$tmp/stage.log" 2>&1 || { cat "$tmp/stage.log"; fail "make install DESTDIR"; }
a=$(cd "$prefix" && find . | sort) b=$(cd "$tmp/stage/opt/syncbn" 2>/dev/null && find . | sort)
[ "$a" = "$b" ] && ok "DESTDIR install has the same $(echo "$a" | grep -c .) entries" || fail "DESTDIR install differs: $(diff <(echo "$a") <(echo "$b") | head -5)"
grep -q '^prefix=/opt/syncbn$' "$tmp/stage/opt/syncbn/lib/pkgconfig/syncbn.pc" && ! grep -rq "$tmp/stage" "$tmp/stage/opt/syncbn/lib/pkgconfig" \
  && ok "staged syncbn.pc names the final prefix" || fail "staged syncbn.pc: $(grep prefix= "$tmp/stage/opt/syncbn/lib/pkgconfig/syncbn.pc")"

echo "### make uninstall"
make --no-print-directory -s uninstall BUILD="$build" PREFIX="$prefix" >"$tmp/uninstall.log" 2>&1 || { cat "$tmp/uninstall.log"; fail "make uninstall"; }
left=$(find "$prefix" -not -type d)
[ -z "$left" ] && ok "make uninstall removed every installed file" || fail "make uninstall left: $(echo $left | head -c 300)"

[ $fails -eq 0 ] && echo "OK: install, pkg-config and CMake consumers" || echo "FAILED: $fails check(s)"
[ $fails -eq 0 ]
