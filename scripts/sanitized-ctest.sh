#!/bin/sh
# Runs ctest in a sanitizer build and fails if any process wrote a sanitizer report.
#
# Usage: scripts/sanitized-ctest.sh BUILD_DIR [ctest arguments...]
#
# The caller sets ASAN_OPTIONS, UBSAN_OPTIONS and TSAN_OPTIONS (see the Makefile); this script
# appends log_path to each, so that every report lands in BUILD_DIR/sanitizer-reports/. A test
# fails by itself when its own process reports, but a daemon that a test killed, or whose exit
# status it does not look at, would otherwise report into a log nobody reads. The reports are
# printed at the end and any report fails the run, even when ctest passed.
set -eu

[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [ctest args...]" >&2; exit 2; }
build=$(cd "$1" && pwd)
shift
reports="$build/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"

export ASAN_OPTIONS="${ASAN_OPTIONS:-}:log_path=$reports/asan"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-}:log_path=$reports/ubsan"
export TSAN_OPTIONS="${TSAN_OPTIONS:-}:log_path=$reports/tsan"

rc=0
(cd "$build" && ctest --output-on-failure "$@") || rc=$?

found=0
for f in "$reports"/*; do
    [ -e "$f" ] || continue
    found=$((found + 1))
    echo "==== sanitizer report $f" >&2
    cat "$f" >&2
done
if [ "$found" -gt 0 ]; then
    echo "sanitized-ctest: $found sanitizer report(s) in $reports" >&2
    [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
