#!/usr/bin/env python3
"""The structure of src/ stays what docs/ARCHITECTURE.md describes.

A module is a .c/.h pair (src/server/core/store.c and store.h); a layer is a folder. The rules:

1. Folders are layers, and a layer includes only the layers below it (ALLOWED below):
   common < base < core (with the l2 tier beside it) < report (status JSON, metrics text) <
   front ends (kvp, http, lmc) < the daemon's entry points (src/server/*.c). A front end never includes another front end; the core
   includes no front end. src/client and src/tools build on common only (and the public headers).
2. The L2 tier is used only through its interface: outside src/server/l2/, only the headers in
   L2_INTERFACE may be included.
3. No include cycle between modules, of any length (a cycle is reported with its path).
4. No struct tag is defined twice with a body anywhere in src/ (one layout per name).

Usage: check_layering.py [--graph] SOURCE_DIR (the repository root). Exit 0, or 1 with the
findings. --graph prints the include graph of src/ by folder (how many includes go from one
folder to another), lowest layer first, and then checks as usual.
Runs with any Python 3 (ctest uses Debian's /usr/bin/python3); needs nothing beyond the
standard library.
"""

import collections
import os
import re
import sys

# Layer of each folder, lowest first; a folder may include its own layer and those listed for it.
ALLOWED = {
    "src/common": set(),
    "src/server/base": {"src/common"},
    "src/server/core": {"src/common", "src/server/base", "src/server/l2"},
    "src/server/l2": {"src/common", "src/server/base", "src/server/core"},
    "src/server/report": {"src/common", "src/server/base", "src/server/core", "src/server/l2"},
    "src/server/kvp": {"src/common", "src/server/base", "src/server/core", "src/server/l2",
                       "src/server/report"},
    "src/server/http": {"src/common", "src/server/base", "src/server/core", "src/server/l2",
                        "src/server/report"},
    "src/server/lmc": {"src/common", "src/server/base", "src/server/core", "src/server/l2",
                       "src/server/report"},
    "src/server": {"src/common", "src/server/base", "src/server/core", "src/server/l2",
                   "src/server/report", "src/server/kvp", "src/server/http", "src/server/lmc"},
    "src/client": {"src/common"},
    "src/tools": {"src/common", "src/client"},
    "src/tools/cli": {"src/common", "src/client", "src/tools"},
}
ORDER = list(ALLOWED)
FRONT_ENDS = {"src/server/kvp", "src/server/http", "src/server/lmc"}
# What the rest of the daemon may include of the L2 tier: the tier's interface (the --l2 URL's
# syntax is configuration: base/l2_url.h).
L2_INTERFACE = {"src/server/l2/l2.h"}


def find_cycle(edges, nodes):
    """One include cycle as a list of modules (first == last), or None. Iterative DFS."""
    colour = {n: 0 for n in nodes}  # 0 new, 1 on the stack, 2 done
    for start in sorted(nodes):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(edges.get(start, ()))))]
        path = [start]
        colour[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(nxt, 0) == 1:
                return path[path.index(nxt):] + [nxt]
            elif colour.get(nxt, 0) == 0:
                colour[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(edges.get(nxt, ())))))
    return None


def main() -> int:
    args = sys.argv[1:]
    graph = "--graph" in args
    args = [a for a in args if a != "--graph"]
    root = args[0] if args else "."
    src = os.path.join(root, "src")
    files = {}
    for d, _, names in os.walk(src):
        for n in names:
            if n.endswith((".c", ".h")):
                p = os.path.join(d, n)
                with open(p, encoding="utf-8") as f:
                    files[os.path.relpath(p, root)] = f.read()

    def resolve(frm: str, inc: str):
        for cand in (os.path.join(os.path.dirname(frm), inc), os.path.join("src", inc),
                     os.path.join("src", "server", inc)):
            cand = os.path.normpath(cand)
            if cand in files:
                return cand
        return None

    edges = collections.defaultdict(set)
    folder_edges = collections.Counter()
    problems = []
    for path, text in sorted(files.items()):
        mod = os.path.splitext(path)[0]
        folder = os.path.dirname(path)
        if folder not in ALLOWED:
            problems.append("%s is in %s, a folder that is no layer (add it to ALLOWED)"
                            % (path, folder))
            continue
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
            target = resolve(path, inc)
            if not target:
                continue
            tmod = os.path.splitext(target)[0]
            tfolder = os.path.dirname(target)
            if tmod != mod:
                edges[mod].add(tmod)
            if tfolder != folder:
                folder_edges[(folder, tfolder)] += 1
                if tfolder not in ALLOWED.get(folder, set()):
                    what = ("another front end" if folder in FRONT_ENDS and tfolder in FRONT_ENDS
                            else "a layer it may not use")
                    problems.append("%s includes %s: %s is %s for %s"
                                    % (path, target, tfolder, what, folder))
                elif (tfolder == "src/server/l2" and folder != "src/server/l2"
                      and target not in L2_INTERFACE):
                    problems.append("%s includes %s: outside l2/, only %s may be included"
                                    % (path, target, ", ".join(sorted(L2_INTERFACE))))

    cycle = find_cycle(edges, set(edges) | {t for v in edges.values() for t in v})
    if cycle:
        problems.append("include cycle: %s" % " -> ".join(cycle))

    tags = collections.defaultdict(list)
    for path, text in files.items():
        for tag in re.findall(r"^(?:typedef\s+)?struct\s+(\w+)\s*\{", text, re.M):
            tags[tag].append(path)
    for tag, where in sorted(tags.items()):
        if len(where) > 1:
            problems.append("struct %s is defined in %s" % (tag, ", ".join(sorted(where))))

    if graph:
        print("include graph of src/ by folder (lowest layer first; n = #includes):")
        for a in ORDER:
            outs = sorted(((b, n) for (x, b), n in folder_edges.items() if x == a),
                          key=lambda e: ORDER.index(e[0]) if e[0] in ORDER else 99)
            if outs:
                print("  %-16s -> %s" % (a[4:], ", ".join("%s (%d)" % (b[4:], n)
                                                           for b, n in outs)))
            else:
                print("  %-16s    (includes no other folder)" % a[4:])
    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print("ok: %d files, %d modules with includes, layers respected, no include cycle, "
          "no struct defined twice" % (len(files), len(edges)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
