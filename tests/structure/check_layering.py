#!/usr/bin/env python3
"""The structure of src/ stays what docs/ARCHITECTURE.md describes.

1. No two modules include each other's headers: a module is a .c/.h pair (src/server/core/store.c
   and store.h); if a file of module A includes B's header, no file of B includes A's.
2. src/common includes nothing from src/server or src/client: both sides build on it.
3. No struct tag is defined twice with a body anywhere in src/ (one layout per name).

Usage: check_layering.py SOURCE_DIR (the repository root). Exit 0, or 1 with the findings.
Runs with any Python 3 (ctest uses Debian's /usr/bin/python3); needs nothing beyond the
standard library.
"""

import collections
import os
import re
import sys


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else "."
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
    problems = []
    for path, text in files.items():
        mod = os.path.splitext(path)[0]
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
            target = resolve(path, inc)
            if not target:
                continue
            tmod = os.path.splitext(target)[0]
            if tmod != mod:
                edges[mod].add(tmod)
            if path.startswith("src/common/") and not target.startswith("src/common/"):
                problems.append("%s includes %s: src/common must not depend on a side"
                                % (path, target))
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if a < b and a in edges.get(b, ()):
                problems.append("%s and %s include each other's headers" % (a, b))

    tags = collections.defaultdict(list)
    for path, text in files.items():
        for tag in re.findall(r"^(?:typedef\s+)?struct\s+(\w+)\s*\{", text, re.M):
            tags[tag].append(path)
    for tag, where in sorted(tags.items()):
        if len(where) > 1:
            problems.append("struct %s is defined in %s" % (tag, ", ".join(sorted(where))))

    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print("ok: %d files, %d modules with includes, no mutual includes, no struct defined twice"
          % (len(files), len(edges)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
