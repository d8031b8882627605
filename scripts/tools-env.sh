#!/bin/sh
# Create (once) the Python virtual environment of the tools the tests take from PyPI:
# kubernetes-validate (Kubernetes' OpenAPI schemas, bundled: no cluster, no network at run
# time), which checks contrib/kubernetes/ (tests/contrib/test_k8s_manifest.sh).
#
# Usage: scripts/tools-env.sh BUILD_DIR
# The environment is BUILD_DIR/venv-tools; pip's output goes to BUILD_DIR/venv-tools.log.
# Idempotent: an environment whose stamp names the same pin list is left as it is. Safe to run
# concurrently (flock). Nothing is installed into the system interpreter.
set -eu

[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$1
here=$(cd "$(dirname "$0")" && pwd)
pins="$here/tools-requirements.txt"
mkdir -p "$build"
venv="$build/venv-tools"
stamp="$venv/.kvpool-stamp"
log="$build/venv-tools.log"
want="pins=$(sha256sum < "$pins" | cut -c1-16)"
py=${TOOLS_ENV_PYTHON:-python3}

(
    flock 9
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        exit 0
    fi
    echo "tools-env: creating $venv (pip's output in $log)"
    rm -rf "$venv"
    : > "$log"
    "$py" -m venv "$venv" >> "$log" 2>&1 || { tail -n 20 "$log" >&2; exit 1; }
    # Exactly the pinned set: --no-deps, so that nothing unpinned comes along.
    "$venv/bin/pip" install --disable-pip-version-check --no-deps -r "$pins" >> "$log" 2>&1 || {
        tail -n 30 "$log" >&2
        echo "tools-env: cannot install $pins into $venv" >&2
        exit 1
    }
    "$venv/bin/kubernetes-validate" --version >> "$log" 2>&1 || {
        tail -n 20 "$log" >&2
        echo "tools-env: kubernetes-validate does not run in $venv" >&2
        exit 1
    }
    echo "$want" > "$stamp"
) 9>"$build/.tools-env.lock"
