#!/bin/sh
# docs/PROTOCOL.md names the protocol version of the code (src/common/wire.h: KVP_PROTO_VERSION
# and KVP_PROTO_MINOR) in its title and in HELLO's reply, and its table of minors ends there.
#
# Usage: test_protocol_version.sh WIRE_H PROTOCOL_MD
set -eu

[ $# -eq 2 ] || { echo "usage: $0 WIRE_H PROTOCOL_MD" >&2; exit 2; }
wire=$1 doc=$2

major=$(sed -n 's/^#define KVP_PROTO_VERSION \([0-9]*\).*/\1/p' "$wire")
minor=$(sed -n 's/^#define KVP_PROTO_MINOR \([0-9]*\).*/\1/p' "$wire")
[ -n "$major" ] && [ -n "$minor" ] || { echo "FAIL: no version in $wire" >&2; exit 1; }

rc=0
title=$(head -n 1 "$doc")
case "$title" in
*"(version $major.$minor)"*) ;;
*) echo "FAIL: $doc's title says '$title', the code $major.$minor" >&2; rc=1 ;;
esac
if ! grep -q "^| major, minor |.*($minor: see Versions below)" "$doc"; then
    echo "FAIL: $doc's HELLO reply does not give minor $minor" >&2
    rc=1
fi
last=$(sed -n '/^## Versions/,/^## /s/^| \([0-9][0-9]*\) |.*/\1/p' "$doc" | tail -n 1)
if [ "$last" != "$minor" ]; then
    echo "FAIL: $doc's table of minors ends at '$last', the code is at $minor" >&2
    rc=1
fi
[ $rc -eq 0 ] && echo "ok: $doc describes protocol $major.$minor"
exit $rc
