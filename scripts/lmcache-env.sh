#!/bin/sh
# Create (once) the Python virtual environments that hold the real LMCache worker for the tests
# and benchmarks of kvpoold's LMCache front end: one per supported LMCache release, each with the
# CPU build of torch 2.13.0 (pinned: an unpinned torch would pull a multi-gigabyte CUDA build).
#
# Usage: scripts/lmcache-env.sh BUILD_DIR [VERSION...]
#        (default versions: 0.5.6 0.5.5 0.5.7rc2; 0.5.7 is a release candidate on PyPI)
# Each environment is BUILD_DIR/venv-lmcache-VERSION; its python is
# BUILD_DIR/venv-lmcache-VERSION/bin/python. Idempotent: an environment whose stamp file names
# the same versions is left as it is, so `make test` pays for the download once per build tree
# (pip's own cache makes a rebuilt tree quick). Safe to run concurrently (flock).
# Nothing is installed into the system interpreter.
set -eu

TORCH_VERSION=2.13.0

[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [VERSION...]" >&2; exit 2; }
build=$1
shift
[ $# -ge 1 ] || set -- 0.5.6 0.5.5 0.5.7rc2
mkdir -p "$build"
py=${LMCACHE_ENV_PYTHON:-python3}

for version in "$@"; do
    venv="$build/venv-lmcache-$version"
    stamp="$venv/.kvpool-stamp"
    want="lmcache==$version torch==$TORCH_VERSION"
    (
        flock 9
        if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
            exit 0
        fi
        echo "lmcache-env: creating $venv ($want; pip's output in $venv.log)"
        rm -rf "$venv"
        "$py" -m venv "$venv"
        log="$venv.log"
        : > "$log"
        # torch first and pinned, so that lmcache's own requirement on torch is already met by
        # the CPU build on this machine and pip never resolves a newer (CUDA) one.
        "$venv/bin/pip" install --disable-pip-version-check "torch==$TORCH_VERSION" \
            >> "$log" 2>&1 || {
            tail -n 30 "$log" >&2
            echo "lmcache-env: cannot install torch==$TORCH_VERSION into $venv" >&2
            exit 1
        }
        # Resolve first: nothing may replace the CPU torch (a CUDA build of it, or another
        # version, would be gigabytes), whatever a release's requirements say.
        "$venv/bin/pip" install --disable-pip-version-check --dry-run \
            "lmcache==$version" "torch==$TORCH_VERSION" >> "$log" 2>&1 || {
            tail -n 30 "$log" >&2
            echo "lmcache-env: cannot resolve lmcache==$version beside torch==$TORCH_VERSION" >&2
            exit 1
        }
        if grep '^Would install' "$log" | tr ' ' '\n' | grep -q '^torch-'; then
            grep '^Would install' "$log" >&2
            echo "lmcache-env: lmcache==$version would replace torch==$TORCH_VERSION" >&2
            exit 1
        fi
        "$venv/bin/pip" install --disable-pip-version-check \
            "lmcache==$version" "torch==$TORCH_VERSION" >> "$log" 2>&1 || {
            tail -n 30 "$log" >&2
            echo "lmcache-env: cannot install lmcache==$version into $venv" >&2
            exit 1
        }
        "$venv/bin/python" - "$version" 2>> "$log" <<'EOF' || { tail -n 30 "$log" >&2; exit 1; }
import importlib
import sys
import lmcache
import torch
from lmcache.v1.multiprocess.transfer_context.worker_transfer import (  # noqa: F401
    EngineDrivenTransferContext,
)

got = getattr(lmcache, "__version__", "?")
if not got.startswith(sys.argv[1]):
    sys.exit("lmcache-env: installed lmcache %s, wanted %s" % (got, sys.argv[1]))
if torch.version.cuda is not None:
    sys.exit("lmcache-env: torch %s is a CUDA build" % torch.__version__)
# The worker's transport without shared memory: a torch pickle up to 0.5.6
# (transfer_context/pickle.py), a msgpack TensorEnvelope from 0.5.7 on (tensor_wire.py,
# inline.py). The tests drive whichever the release has.
mp = "lmcache.v1.multiprocess."
try:
    importlib.import_module(mp + "transfer_context.tensor_wire").TensorEnvelope
    importlib.import_module(mp + "transfer_context.inline")
    importlib.import_module(mp + "token_codec")
    inline = "tensor envelope"
except ModuleNotFoundError:
    importlib.import_module(mp + "transfer_context.pickle").EngineDrivenContextPickle
    inline = "pickle"
print("lmcache-env: lmcache %s (%s transport), torch %s" % (got, inline, torch.__version__))
EOF
        echo "$want" > "$stamp"
    ) 9>"$build/.lmcache-env.lock"
done
