#!/bin/sh
# What building and installing leave in the source tree is ignored by git: the build
# directories, and what `pip install ./python` writes next to the package (python/build/,
# python/kvpool.egg-info/). Checks the ignore rules only (git check-ignore --no-index), so it
# needs no such files to exist.
#
# Usage: test_gitignore.sh SOURCE_DIR. Exit 77 (skipped) without git or outside a checkout.
set -eu

[ $# -eq 1 ] || { echo "usage: $0 SOURCE_DIR" >&2; exit 2; }
src=$1

command -v git >/dev/null 2>&1 || { echo "skipped: git is not installed" >&2; exit 77; }
git -C "$src" rev-parse --git-dir >/dev/null 2>&1 ||
    { echo "skipped: $src is not a git checkout" >&2; exit 77; }

rc=0
for path in build/CMakeCache.txt build-asan/lib/libkvpool.so \
    python/build/lib/kvpool/__init__.py python/kvpool.egg-info/PKG-INFO \
    python/kvpool/__pycache__/client.cpython-311.pyc python/dist/kvpool-1.0.0.tar.gz; do
    if ! git -C "$src" check-ignore -q --no-index "$path"; then
        echo "FAIL: $path is not ignored by git (.gitignore)" >&2
        rc=1
    fi
done
[ "$rc" -ne 0 ] || echo "build and pip leftovers are ignored"
exit "$rc"
