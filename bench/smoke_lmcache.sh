#!/bin/sh
# ctest "bench/lmcache": the lmcache section of kvpool-bench (--only lmcache --quick: one 1 MiB
# size, two repetitions) runs end to end with the real LMCache worker and writes well-formed rows
# for lmcache server, the worker's limits and, when this kvpoold has --lmcache, its front end,
# on both the SHM and the pickle transport. Timings are not asserted. Skipped (77) only when the
# LMCache virtual environment is absent.
#
# Usage: smoke_lmcache.sh KVPOOL_BENCH VENV OUTPUT_DIR
set -eu
bench=$1
venv=$2
out=$3
if [ ! -x "$venv/bin/lmcache" ] || [ ! -x "$venv/bin/python" ]; then
    echo "smoke_lmcache: skipped: no LMCache virtual environment at $venv" \
         "(scripts/lmcache-env.sh BUILD_DIR 0.5.6 creates it)" >&2
    exit 77
fi
mkdir -p "$out"
rm -f "$out/quick.json"

"$bench" --quick --only lmcache --lmcache-venv "$venv" --json "$out/quick.json" \
    >"$out/quick.txt" 2>&1 || {
    cat "$out/quick.txt"
    echo "smoke_lmcache: kvpool-bench --quick --only lmcache failed" >&2
    exit 1
}
cat "$out/quick.txt"
kvpoold=0
grep -q "has no LMCache front end" "$out/quick.txt" || kvpoold=1
# A server the section left out of a phase (say a kvpoold that refuses pickle commits) must have
# said so; its rows of that phase are then not required.
left_out=$(sed -n 's/^lmcache: \([a-z]*\) [0-9]* MiB: the worker registered on \([a-z]*\)-refused.*/\1 \2/p' \
    "$out/quick.txt" | sort -u | tr '\n' ',')
# lmcache server really served the SHM transport, then the pickle one.
grep -q 'lmcache shm: lmcache log says "Using shm non-GPU transfer strategy"' "$out/quick.txt"
grep -q 'lmcache pickle: lmcache log says "Using pickle non-GPU transfer strategy"' \
    "$out/quick.txt"

python3 - "$out/quick.json" "$kvpoold" "$left_out" <<'PY'
import json, math, sys
rows = json.load(open(sys.argv[1]))
with_kvpoold = sys.argv[2] == "1"
names = {"lmcache": "lmcache-server", "kvpoold": "kvpoold-lmcache"}
left_out = {(names[s.split()[0]], "lmcache " + s.split()[1]) for s in sys.argv[3].split(",") if s}
assert isinstance(rows, list) and rows, "JSON is not a non-empty list"
have = {(r["transport"], r["op"], r["detail"]) for r in rows}
want = [("lmcache-worker", "gather", "lmcache shm"), ("lmcache-worker", "scatter", "lmcache shm"),
        ("lmcache-worker", "store", "lmcache pickle"),
        ("lmcache-worker", "retrieve", "lmcache pickle")]
servers = ["lmcache-server"] + (["kvpoold-lmcache"] if with_kvpoold else [])
for s in servers:
    for d in ("lmcache shm", "lmcache pickle"):
        if (s, d) in left_out:
            print("smoke_lmcache: %s was left out of %s (said above)" % (s, d))
            continue
        want += [(s, "store", d), (s, "retrieve", d), (s, "first-store", d)]
    want += [(s, "ping", "lmcache shm"), (s, "get-chunk-size", "lmcache shm")]
missing = [w for w in want if w not in have]
assert not missing, "missing rows: %s" % missing
for r in rows:
    assert r["valid"] is True, r
    if r["op"] in ("ping", "get-chunk-size"):
        assert r["p50_us"] > 0 and r["gb_per_s"] is None, r
    else:
        assert r["chunk_bytes"] == 1 << 20, r
        assert isinstance(r["gb_per_s"], (int, float)) and math.isfinite(r["gb_per_s"]), r
        assert r["gb_per_s"] > 0, r
    if r["transport"] == "lmcache-server" and r["op"] in ("store", "retrieve"):
        assert r["ratio_to_limit"] is not None and r["ratio_to_limit"] > 0, r
    if r["transport"] == "kvpoold-lmcache" and r["op"] in ("store", "retrieve", "ping"):
        assert r["vs_lmcache"] is not None and r["vs_lmcache"] > 0, r
print("smoke_lmcache: %d rows; servers: %s" % (len(rows), ", ".join(servers)))
PY
