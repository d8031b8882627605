#!/bin/sh
# contrib/kvpoold.service is a unit systemd accepts: `systemd-analyze verify` reports nothing
# (unknown keys, bad values, a missing ExecStart= binary), the daemon accepts the options of its
# ExecStart=, and it keeps the properties README.md promises (Type=notify, a private runtime
# directory, nothing that hides /dev/shm from the workers, a restart that keeps the pool with
# SIGUSR2 and a stop that frees it with SIGTERM).
# Usage: test_service_unit.sh SOURCE_DIR KVPOOLD
set -eu
src=$1
kvpoold=$2
unit=$src/contrib/kvpoold.service

if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "skipped: systemd-analyze is not installed (Debian package systemd;" \
        "scripts/install-deps.sh check installs it)" >&2
    exit 77
fi

fail() {
    echo "test_service_unit: $*" >&2
    exit 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# verify checks that ExecStart= is executable: point it at the daemon just built.
exec_start=$(sed -n 's|^ExecStart=/usr/local/bin/kvpoold ||p' "$unit")
[ -n "$exec_start" ] || fail "no 'ExecStart=/usr/local/bin/kvpoold ...' line in $unit"
sed "s|^ExecStart=/usr/local/bin/kvpoold |ExecStart=$kvpoold |" "$unit" >"$tmp/kvpoold.service"
if ! out=$(systemd-analyze verify --man=no "$tmp/kvpoold.service" 2>&1); then
    fail "systemd-analyze verify failed: $out"
fi
[ -z "$out" ] || fail "systemd-analyze verify reports: $out"

# Every option of ExecStart= is one kvpoold knows (--version stops before the file is read).
# shellcheck disable=SC2086
"$kvpoold" $exec_start --version >"$tmp/out" 2>&1 || fail "kvpoold rejects '$exec_start': $(cat "$tmp/out")"

for line in Type=notify RuntimeDirectory=kvpool RuntimeDirectoryMode=0700 NoNewPrivileges=yes \
    ProtectSystem=strict ProtectHome=yes PrivateTmp=yes MemoryDenyWriteExecute=yes \
    LockPersonality=yes SystemCallArchitectures=native \
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6" RestartPreventExitStatus=2 \
    'ExecReload=/bin/kill -HUP $MAINPID' RestartKillSignal=SIGUSR2; do
    grep -qx "$line" "$unit" || fail "$unit lacks the line $line"
done
case "$exec_start" in
*"--socket /run/kvpool/"*) ;;
*) fail "ExecStart= does not put the socket into RuntimeDirectory= (/run/kvpool)" ;;
esac
# `systemctl stop` must free the pool (SIGTERM), only `systemctl restart` keeps it (SIGUSR2).
if grep -Eq '^KillSignal=' "$unit" && ! grep -qx 'KillSignal=SIGTERM' "$unit"; then
    fail "$unit stops the daemon with $(grep -E '^KillSignal=' "$unit"): a stop would keep the pool"
fi
# Workers open the pool by name in the host's /dev/shm.
if grep -Eq '^(PrivateIPC|PrivateDevices|TemporaryFileSystem|InaccessiblePaths|RemoveIPC)=' "$unit"; then
    fail "$unit hides or removes shared memory: $(grep -E '^(PrivateIPC|PrivateDevices|TemporaryFileSystem|InaccessiblePaths|RemoveIPC)=' "$unit")"
fi
echo "test_service_unit: systemd-analyze verify accepts $unit"
