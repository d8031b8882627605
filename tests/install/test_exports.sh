#!/bin/sh
# The library's ABI surface: every exported symbol is kvp_*, carries the KVPOOL_1.0 version
# (src/client/libkvpool.map), and every KVP_EXPORT function of the public headers is exported.
# Usage: test_exports.sh LIBKVPOOL_SO INCLUDE_DIR
set -eu
lib=$1
inc=$2
if ! command -v nm >/dev/null 2>&1; then
    echo "skipped: nm (binutils) is not installed" >&2
    exit 77
fi
syms=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWwDdBbRr]$/ {print $3}')
[ -n "$syms" ] || { echo "FAIL: $lib exports no function" >&2; exit 1; }
bad=$(printf '%s\n' "$syms" | grep -v '^kvp_[a-z0-9_]*@@KVPOOL_1\.0$' || true)
if [ -n "$bad" ]; then
    echo "FAIL: symbols outside kvp_*@@KVPOOL_1.0:" >&2
    printf '%s\n' "$bad" >&2
    exit 1
fi
# Each function the headers export must be in the library, and nothing else.
want=$(sed -n 's/^KVP_EXPORT [^(]*[ *]\(kvp_[a-z0-9_]*\)(.*/\1/p' "$inc"/kvpool.h "$inc"/kvpool_paged.h |
    sort -u)
have=$(printf '%s\n' "$syms" | sed 's/@@.*//' | sort -u)
if [ "$want" != "$have" ]; then
    echo "FAIL: exported functions differ from the headers' KVP_EXPORT declarations" >&2
    echo "headers only:" >&2
    printf '%s\n' "$want" | grep -vxF "$have" >&2 || true
    echo "library only:" >&2
    printf '%s\n' "$have" | grep -vxF "$want" >&2 || true
    exit 1
fi
echo "ok: $(printf '%s\n' "$have" | wc -l) functions, all kvp_*@@KVPOOL_1.0"
