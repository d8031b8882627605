#!/bin/sh
# ctest "bench/smoke": kvpool-bench --quick runs end to end and writes well-formed JSON with the
# rows every run must have (shm, inline, memcpy, uds). Timings are not asserted: this machine's
# numbers belong in docs/PERFORMANCE.md, not in a pass/fail test.
#
# Usage: smoke.sh KVPOOL_BENCH OUTPUT_DIR
set -eu
bench=$1
out=$2
mkdir -p "$out"
rm -f "$out/quick.json"

"$bench" --quick --json "$out/quick.json" --csv "$out/quick.csv" >"$out/quick.txt" 2>&1 || {
    cat "$out/quick.txt"
    echo "smoke: kvpool-bench --quick failed" >&2
    exit 1
}
cat "$out/quick.txt"
if grep -q "offers no shared memory" "$out/quick.txt"; then
    echo "smoke: skipped: the daemon could not offer shared memory here (see above)" >&2
    exit 77
fi

python3 - "$out/quick.json" <<'PY'
import json, math, sys
rows = json.load(open(sys.argv[1]))
assert isinstance(rows, list) and rows, "JSON is not a non-empty list"
keys = ["transport", "op", "chunk_bytes", "workers", "gb_per_s", "ops_per_s", "p50_us",
        "p99_us", "ratio_to_memcpy"]
for r in rows:
    for k in keys:
        assert k in r, "row %r lacks %s" % (r, k)
    assert isinstance(r["transport"], str) and isinstance(r["op"], str)
    assert isinstance(r["chunk_bytes"], int) and r["chunk_bytes"] >= 0
    assert isinstance(r["workers"], int) and r["workers"] >= 1
    for k in keys[4:]:
        v = r[k]
        assert v is None or (isinstance(v, (int, float)) and math.isfinite(v)), (k, v)
have = {r["transport"] for r in rows}
for t in ("shm", "inline", "memcpy", "uds"):
    assert t in have, "no %s rows (have %s)" % (t, sorted(have))
for t in ("shm", "inline"):
    ops = {r["op"] for r in rows if r["transport"] == t}
    assert {"store", "retrieve"} <= ops, "%s rows lack store/retrieve: %s" % (t, ops)
print("smoke: %d rows, transports %s" % (len(rows), ", ".join(sorted(have))))
PY
