#!/bin/sh
# The pool sizes README.md gives for --l1-size (its default and its examples, the `quoted`
# values of the option's row in the configuration table) are all accepted by kvpoold.
# `kvpoold --l1-size X --help` checks X and prints the help (exit 0), or exits 2 if X is refused.
#
# Usage: test_readme_sizes.sh README KVPOOLD
set -eu

[ $# -eq 2 ] || { echo "usage: $0 README KVPOOLD" >&2; exit 2; }
readme=$1 kvpoold=$2

row=$(grep '^| `--l1-size ' "$readme") || { echo "FAIL: no --l1-size row in $readme" >&2; exit 1; }
# The quoted values after the option and variable columns.
values=$(printf '%s\n' "$row" | cut -d'|' -f4- | grep -o '`[^`]*`' | tr -d '`')
[ -n "$values" ] || { echo "FAIL: no example in: $row" >&2; exit 1; }

rc=0 n=0
for v in $values; do
    n=$((n + 1))
    if ! err=$("$kvpoold" --l1-size "$v" --help 2>&1 >/dev/null); then
        echo "FAIL: README gives --l1-size $v, which kvpoold refuses: $err" >&2
        rc=1
    fi
done
[ "$rc" -ne 0 ] || echo "kvpoold accepts the $n --l1-size values of README.md:" $values
exit "$rc"
