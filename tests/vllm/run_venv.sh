#!/bin/sh
# Runs a test of kvpoold under a real vLLM engine with the python of the virtual environment that
# holds vLLM's CPU build and LMCache (scripts/vllm-env.sh). A missing environment fails the test
# and says how to create it: these tests are never skipped.
#
# Usage: run_venv.sh VENV_DIR SCRIPT ARGS...
set -eu
venv=$1
shift
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.kvpool-stamp" ]; then
    echo "run_venv: $venv does not exist: create it with 'make vllm-env' or" \
        "'scripts/vllm-env.sh $(dirname "$venv")'" >&2
    exit 1
fi
exec "$venv/bin/python" "$@"
