#!/bin/sh
# `make serve`, the README's first command, builds only what it runs (the daemon and the command
# line, not the tests and benchmarks) and serves LMCache's protocol too, where LMCache's
# workers look for `lmcache server`. Reads what make would run (make -n), running nothing.
#
# Usage: test_make_serve.sh SOURCE_DIR. Exit 77 (skipped) without make.
set -eu

[ $# -eq 1 ] || { echo "usage: $0 SOURCE_DIR" >&2; exit 2; }
src=$1
command -v make >/dev/null 2>&1 || { echo "skipped: make is not installed" >&2; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# An existing cache file, so that make does not plan the configure step.
mkdir -p "$tmp/b" && : > "$tmp/b/CMakeCache.txt"
out=$(make -n -s -C "$src" serve BUILD="$tmp/b" 2>&1)
rc=0
echo "$out" | grep -q -- "cmake --build $tmp/b -j [0-9]* --target kvpoold kvpool_cli\$" ||
    { echo "FAIL: make serve does not build just kvpoold and kvpool:"; rc=1; }
echo "$out" | grep -q -- "^$tmp/b/bin/kvpoold --lmcache tcp://127.0.0.1:5555\$" ||
    { echo "FAIL: make serve does not serve LMCache on tcp://127.0.0.1:5555:"; rc=1; }
# ARGS replaces the options, as the README says.
make -n -s -C "$src" serve BUILD="$tmp/b" ARGS="--l1-size 4GiB" 2>&1 |
    grep -q -- "^$tmp/b/bin/kvpoold --l1-size 4GiB\$" ||
    { echo "FAIL: make serve ARGS=... does not pass ARGS"; rc=1; }
[ $rc -eq 0 ] && echo "ok: make serve builds kvpoold and kvpool and serves LMCache too" ||
    echo "$out"
exit $rc
