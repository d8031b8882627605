#!/bin/sh
# Installs a build into a temporary prefix and checks that the result works from there alone:
# bin/kvpool runs with an empty LD_LIBRARY_PATH and loads the installed libkvpool.so.1 (RPATH),
# pkg-config finds kvpool.pc and reports the project version, and a C program built with
# `pkg-config --cflags --libs kvpool` against the installed headers and library runs.
#
# Usage: test_install.sh BUILD_DIR VERSION LIBDIR CC [CFLAGS...]
#   LIBDIR is the build's CMAKE_INSTALL_LIBDIR; CFLAGS are the build's sanitizer flags, which
#   a program linking a sanitized libkvpool.so needs too. Exit 77 (skipped) without pkg-config.
set -eu

[ $# -ge 4 ] || { echo "usage: $0 BUILD_DIR VERSION LIBDIR CC [CFLAGS...]" >&2; exit 2; }
build=$1 version=$2 libdir=$3 cc=$4
shift 4

fail() { echo "FAIL: $*" >&2; exit 1; }

command -v pkg-config >/dev/null 2>&1 || { echo "skipped: pkg-config is not installed" >&2; exit 77; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-install-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "cmake --install $build --prefix $prefix"; }

for f in bin/kvpool bin/kvpoold "$libdir/libkvpool.so.1" include/kvpool.h \
    include/kvpool_paged.h "$libdir/pkgconfig/kvpool.pc"; do
    [ -e "$prefix/$f" ] || fail "$f is not installed"
done

# The CLI runs from the prefix alone, and it is the installed library it loads, not one that
# the loader would find elsewhere.
out=$(env LD_LIBRARY_PATH= "$prefix/bin/kvpool" --version 2>&1) ||
    fail "installed bin/kvpool --version: $out"
case $out in
*"$version"*) ;;
*) fail "installed bin/kvpool --version printed '$out', expected version $version" ;;
esac
deps=$(env LD_LIBRARY_PATH= LD_TRACE_LOADED_OBJECTS=1 "$prefix/bin/kvpool" 2>&1) || true
echo "$deps" | grep -q "libkvpool.so.1 => $prefix/bin/../$libdir/libkvpool.so.1" ||
    fail "installed bin/kvpool does not load $prefix/$libdir/libkvpool.so.1:
$deps"

export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
got=$(pkg-config --modversion kvpool) || fail "pkg-config --modversion kvpool"
[ "$got" = "$version" ] || fail "pkg-config --modversion kvpool: '$got', expected '$version'"
flags=$(pkg-config --cflags --libs kvpool) || fail "pkg-config --cflags --libs kvpool"

cat >"$tmp/prog.c" <<'PROG'
#include <stdio.h>
#include <kvpool.h>
#include <kvpool_paged.h>

int main(void)
{
    unsigned v = kvp_version();

    printf("%u.%u.%u\n", (v >> 16) & 0xffu, (v >> 8) & 0xffu, v & 0xffu);
    return 0;
}
PROG
# shellcheck disable=SC2086 # flags is a list of words
"$cc" -std=c11 "$@" -o "$tmp/prog" "$tmp/prog.c" $flags -Wl,-rpath,"$prefix/$libdir" ||
    fail "cannot build a program with: $cc $* prog.c $flags"
got=$(env LD_LIBRARY_PATH= "$tmp/prog") || fail "the program built against the prefix failed"
[ "$got" = "$version" ] || fail "kvp_version() of the installed library: '$got', expected '$version'"

echo "installed into $prefix: bin/kvpool $version runs, pkg-config kvpool $version, program linked"
