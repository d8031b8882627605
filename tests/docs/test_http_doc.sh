#!/bin/sh
# docs/HTTP.md describes every counter and gauge of src/server/core/stats.h: its Prometheus metric
# (kvpool_<family>, with _total for a counter) and its STATS name, each in backquotes. A row
# added to a map without its line in the documentation fails here, naming what is missing. With
# METRICS_C (src/server/report/metrics.c), so does every family that file writes itself (its
# "# TYPE kvpool_..." lines and its quoted "kvpool_..." names: the build info, the families by
# front end), and every histogram family declared anywhere in the daemon (METRICS_C's folder's
# parent, src/server: each front end's and the core's ".name" and ".max_name" of a
# struct kvp_hist_family).
#
# Usage: test_http_doc.sh STATS_H HTTP_MD [METRICS_C]
set -eu

[ $# -eq 2 ] || [ $# -eq 3 ] || { echo "usage: $0 STATS_H HTTP_MD [METRICS_C]" >&2; exit 2; }
stats=$1 doc=$2 metrics_c=${3:-}

# "counter name family" or "gauge name family" per row; family is NULL for a STATS-only total.
rows=$(awk '
    /^#define KVP_COUNTER_MAP/ { map = "counter" }
    /^#define KVP_GAUGE_MAP/ { map = "gauge" }
    map != "" && match($0, /XX\([a-z0-9_]+, *("[a-z0-9_]+"|NULL)/) {
        row = substr($0, RSTART + 3, RLENGTH - 3)
        gsub(/[ "]/, "", row)
        split(row, f, ",")
        print map, f[1], f[2]
    }
    map != "" && !/\\$/ { map = "" }
' "$stats")
[ -n "$rows" ] || { echo "FAIL: no rows found in $stats" >&2; exit 1; }

rc=0 n=0
while read -r kind name family; do
    n=$((n + 1))
    if ! grep -q "\`$name\`" "$doc"; then
        echo "FAIL: $doc does not name the $kind $name (src/server/core/stats.h)" >&2
        rc=1
    fi
    [ "$family" = NULL ] && continue
    metric=kvpool_$family
    [ "$kind" = counter ] && metric=${metric}_total
    if ! grep -q "\`$metric\`" "$doc"; then
        echo "FAIL: $doc does not describe the metric $metric (the $kind $name)" >&2
        rc=1
    fi
done <<ROWS
$rows
ROWS
if [ -n "$metrics_c" ]; then
    families=$(grep -o '# TYPE kvpool_[a-z][a-z0-9_]*' "$metrics_c" | sed 's/# TYPE //' | sort -u)
    [ -n "$families" ] || { echo "FAIL: no '# TYPE kvpool_' line in $metrics_c" >&2; exit 1; }
    server=$(dirname "$(dirname "$metrics_c")")
    hists=$(grep -rhoE '\.(max_)?name = "kvpool_[a-z][a-z0-9_]*"' --include='*.c' "$server" |
        sed 's/.*"\(kvpool_[a-z0-9_]*\)"/\1/' | sort -u)
    for h in kvpool_request_duration_seconds kvpool_lmcache_request_duration_seconds \
        kvpool_store_lock_hold_seconds; do
        echo "$hists" | grep -qx "$h" || { echo "FAIL: no histogram family $h in $server" >&2; exit 1; }
    done
    quoted=$(grep -oE '"kvpool_[a-z][a-z0-9_]*"' "$metrics_c" | tr -d '"' | sort -u)
    families=$(printf '%s\n%s\n%s\n' "$families" "$hists" "$quoted" | sort -u)
    for metric in $families; do
        n=$((n + 1))
        if ! grep -q "\`$metric\`" "$doc"; then
            echo "FAIL: $doc does not describe the metric $metric ($metrics_c)" >&2
            rc=1
        fi
    done
fi
[ "$rc" -ne 0 ] || echo "$doc describes the $n metrics and statistics of $stats $metrics_c"
exit "$rc"
