#!/bin/sh
# Runs a test of the LMCache front end with the python of a virtual environment that holds the
# real LMCache worker (scripts/lmcache-env.sh). A missing environment fails the test and says
# how to create it: these tests are never skipped.
#
# Usage: run_venv.sh VENV_DIR SCRIPT ARGS...
set -eu
venv=$1
shift
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.kvpool-stamp" ]; then
    version=${venv##*venv-lmcache-}
    echo "run_venv: $venv does not exist: create it with 'make lmcache-env' or" \
        "'scripts/lmcache-env.sh $(dirname "$venv") $version'" >&2
    exit 1
fi
exec "$venv/bin/python" "$@"
