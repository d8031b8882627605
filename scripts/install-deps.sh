#!/bin/sh
# Install the Debian packages that kvpool needs to build, test and benchmark.
#
# Idempotent: packages already present are skipped without touching apt. Needs root (or sudo)
# only when something is missing. Usage: scripts/install-deps.sh [build|bench|check|all]
# check: what `make test` adds to build: clang and its libFuzzer runtime (`make fuzz`; Debian 12's
# clang is 14), cppcheck, flake8 and mypy (`make lint`; the Python linters run on Debian's
# /usr/bin/python3), clang-format (`make format`), systemd (its systemd-analyze verifies
# contrib/kvpoold.service).
set -eu

group=${1:-build}

build_pkgs="build-essential cmake pkg-config libsodium-dev libcmocka-dev libjansson-dev libsystemd-dev util-linux python3 python3-numpy"
# The L2 tier links hiredis and xxhash; its tests run redis-server and redis-cli.
build_pkgs="$build_pkgs libhiredis-dev libxxhash-dev redis-server redis-tools"
bench_pkgs="redis-server libhiredis-dev gnuplot-nox python3-numpy"
check_pkgs="clang libclang-rt-14-dev cppcheck flake8 mypy clang-format systemd"
# The daemon's HTTP endpoint links libmicrohttpd (and jansson, above). Its tests check /metrics
# with promtool, which Debian ships in the prometheus package (where systemd runs, installing it
# also starts a Prometheus server on port 9090), and load the status page in a headless
# chromium; curl is for the README's examples.
build_pkgs="$build_pkgs libmicrohttpd-dev"
# The LMCache-compatible front end links libzmq; its wire-level tests speak ZeroMQ and msgpack
# from Debian's /usr/bin/python3.
build_pkgs="$build_pkgs libzmq3-dev python3-zmq python3-msgpack"
check_pkgs="$check_pkgs curl prometheus chromium"
case "$group" in
build) want="$build_pkgs" ;;
bench) want="$build_pkgs $bench_pkgs" ;;
check) want="$build_pkgs $check_pkgs" ;;
all) want="$build_pkgs $bench_pkgs $check_pkgs python3-numpy" ;;
*) echo "usage: $0 [build|bench|check|all]" >&2; exit 2 ;;
esac

missing=""
for p in $want; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "install-deps: installing:$missing"
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=sudo
    else
        echo "install-deps: missing packages:$missing; run this script as root" >&2
        exit 1
    fi
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
