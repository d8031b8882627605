#!/usr/bin/env python3
"""The structure of src/ stays what docs/ARCHITECTURE.md describes.

A module is a .c/.h pair (src/server/core/store.c and store.h); a layer is a folder. The rules,
each failing with one line "FAIL: <file>: <rule>: <what>":

layers            Folders are layers and a layer includes only the layers below it (ALLOWED):
                  common < base < core (with the l2 tier beside it) < report (status JSON,
                  metrics text) < front ends (kvp, http, lmc) < the daemon's entry points
                  (src/server/*.c). A front end never includes another front end; the core
                  includes no front end. Every layer may include the public headers (include/).
front end and L2  A front end never includes src/server/l2: core/ops.h is what talks to L2.
CLI               src/tools builds on include/ and src/common only, never on src/client.
L2 interface      Outside src/server/l2/, only the headers in L2_INTERFACE may be included.
core and L2       The core includes only l2/l2.h of the tier, and l2/ includes only the core
                  headers of L2_USES_CORE.
wire headers      kvpool's own protocol (WIRE: wire.h, msg.h) is included only by WIRE_USERS;
                  limits every layer needs are in src/common/limits.h.
include cycle     No include cycle between modules, of any length (reported with its path).
struct            No struct tag is defined twice with a body anywhere in src/.
tree              src/ exists and every folder of REQUIRED holds a .c/.h file: an empty or
                  missing tree fails, it never passes as "ok: 0 files".
opening comment   Every .c/.h under src/ opens "/*\\n * <its own name> - what it is".
header guard      Every .h under src/ has an include guard KVP_[FOLDER_]<NAME>_H.
doc names         Every name of a .c/.h file in docs/ARCHITECTURE.md exists: a path from the
                  repository root, src/ or src/server/, or a bare name found under src/, tests/
                  or include/.

Includes are resolved as the build does: from the including file's folder, src/, src/server/,
include/ and src/common/; a name found on none of these that names exactly one file under src/
resolves to it (so "conn.h" in src/tools still counts as an include of src/client).

Usage: check_layering.py [--graph] SOURCE_DIR (the repository root). Exit 0, or 1 with the
findings. --graph prints the include graph of src/ by folder (how many includes go from one
folder to another), lowest layer first, and then checks as usual.
Runs with any Python 3 (ctest uses Debian's /usr/bin/python3); needs nothing beyond the
standard library. tests/structure/test_check_layering.py shows each rule failing.
"""

import collections
import os
import re
import sys

PUBLIC = "include"  # the installed headers: the lowest layer (common/errors.h builds on them)
# Layer of each folder, lowest first; a folder may include its own layer, PUBLIC and those listed.
ALLOWED = {
    "src/common": set(),
    "src/server/base": {"src/common"},
    "src/server/core": {"src/common", "src/server/base", "src/server/l2"},
    "src/server/l2": {"src/common", "src/server/base", "src/server/core"},
    "src/server/report": {"src/common", "src/server/base", "src/server/core", "src/server/l2"},
    "src/server/kvp": {"src/common", "src/server/base", "src/server/core", "src/server/report"},
    "src/server/http": {"src/common", "src/server/base", "src/server/core", "src/server/report"},
    "src/server/lmc": {"src/common", "src/server/base", "src/server/core", "src/server/report"},
    "src/server": {"src/common", "src/server/base", "src/server/core", "src/server/l2",
                   "src/server/report", "src/server/kvp", "src/server/http", "src/server/lmc"},
    "src/client": {"src/common"},
    "src/tools": {"src/common"},
    "src/tools/cli": {"src/common", "src/tools"},
}
ORDER = list(ALLOWED)
# Each must hold a .c/.h file (src/tools has only its cli/ folder today).
REQUIRED = [f for f in ALLOWED if f != "src/tools"]
FRONT_ENDS = {"src/server/kvp", "src/server/http", "src/server/lmc"}
TOOLS = {"src/tools", "src/tools/cli"}
CORE, L2 = "src/server/core", "src/server/l2"
# What the rest of the daemon may include of the L2 tier: its interface (the --l2 URL's syntax is
# configuration: base/l2_url.h).
L2_INTERFACE = {"src/server/l2/l2.h"}
# What the L2 tier may include of the core, and why it needs it.
L2_USES_CORE = {
    # l2.h: read-through loads land in objects the store reserved, write-behind copies the
    # store's committed objects (kvp_l2_start takes the store).
    "src/server/core/store.h",
    # l2.h: a chunk's L2 layout is derived from its instance's registration (kvp_l2_layout_of).
    "src/server/core/registry.h",
    # l2_tier.c, l2_redis.c, l2_cluster.c: the tier's counters are the daemon's counters.
    "src/server/core/stats.h",
    # l2_tier.c: a queued chunk is dropped if the pool segment shrank since (kvp_seg_guard_epoch).
    "src/server/core/seg_guard.h",
    # l2_tier.c: a chunk loaded into L1 is sealed with its checksum, as a worker's commit is, so
    # that a successor adopts it (kvp_widx_data_sum).
    "src/server/core/warm_index.h",
}
# kvpool's own protocol, and who speaks it.
WIRE = {"src/common/wire.h", "src/common/msg.h"}
WIRE_USERS = {"src/common", "src/client", "src/tools", "src/tools/cli", "src/server/kvp",
              "src/server"}
DOC = "docs/ARCHITECTURE.md"
SEARCH = ("src", "src/server", PUBLIC, "src/common")  # after the including file's own folder


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


def read_sources(root, top):
    """{path relative to root: text} of every .c/.h file under root/top."""
    out = {}
    for d, _, names in os.walk(os.path.join(root, top)):
        for n in names:
            if n.endswith((".c", ".h")):
                p = os.path.join(d, n)
                with open(p, encoding="utf-8", errors="replace") as f:
                    out[os.path.relpath(p, root)] = f.read()
    return out


def include_rule(path, folder, target):
    """The (rule, what) that an include of target by path breaks, or None."""
    tfolder = os.path.dirname(target)
    if target in WIRE and folder not in WIRE_USERS:
        return ("wire headers", "includes %s: kvpool's own protocol is for common, client, "
                "tools, kvp and src/server/*.c (limits are in common/limits.h)" % target)
    if tfolder in (folder, PUBLIC):
        return None
    if folder in FRONT_ENDS and tfolder == L2:
        return ("front end and L2", "includes %s: a front end reaches the L2 tier through "
                "core/ops.h only" % target)
    if folder in TOOLS and tfolder == "src/client":
        return ("CLI", "includes %s: the CLI builds on include/ and src/common only, never on "
                "src/client" % target)
    if tfolder not in ALLOWED[folder]:
        what = ("a front end never includes another front end"
                if folder in FRONT_ENDS and tfolder in FRONT_ENDS
                else "%s is not a layer below %s" % (tfolder, folder))
        return ("layers", "includes %s: %s" % (target, what))
    if tfolder == L2 and target not in L2_INTERFACE:
        return ("core and L2" if folder == CORE else "L2 interface",
                "includes %s: outside l2/, only %s may be included"
                % (target, ", ".join(sorted(L2_INTERFACE))))
    if folder == L2 and tfolder == CORE and target not in L2_USES_CORE:
        return ("core and L2", "includes %s: l2/ may include only these core headers: %s"
                % (target, ", ".join(sorted(L2_USES_CORE))))
    return None


def check_head(path, text):
    """Failures of the opening comment and, for a header, of its include guard."""
    out = []
    name = os.path.basename(path)
    m = re.match(r"/\*\n \* (\S+) - \S", text)
    if not m:
        out.append((path, "opening comment", 'does not open with "/*\\n * %s - what it is"'
                    % name))
    elif m.group(1) != name:
        out.append((path, "opening comment", "names %s, not %s" % (m.group(1), name)))
    if name.endswith(".h"):
        g = re.search(r"^#\s*ifndef\s+(\w+)\s*\n#\s*define\s+(\w+)", text, re.M)
        want = re.sub(r"\W", "_", name[:-2]).upper() + "_H"
        if not g or g.group(1) != g.group(2):
            out.append((path, "header guard", "no include guard (#ifndef X / #define X)"))
        elif not re.fullmatch(r"KVP_(?:[A-Z0-9]+_)*" + want, g.group(1)):
            out.append((path, "header guard", "guard %s is not KVP_[FOLDER_]%s"
                        % (g.group(1), want)))
    return out


def check_doc(root):
    """Failures for each .c/.h name in docs/ARCHITECTURE.md that matches no file."""
    p = os.path.join(root, DOC)
    if not os.path.isfile(p):
        return [(DOC, "doc names", "missing")]
    names = set()
    for top in ("src", "tests", PUBLIC):
        for _, _, files in os.walk(os.path.join(root, top)):
            names.update(files)
    lines = collections.defaultdict(list)  # missing name -> the lines that name it
    with open(p, encoding="utf-8", errors="replace") as f:
        for no, line in enumerate(f, 1):
            for tok in re.findall(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.[ch])(?!\w|\.\w)", line):
                if "/" in tok:
                    ok = any(os.path.isfile(os.path.join(root, b, tok))
                             for b in ("", "src", "src/server"))
                else:
                    ok = tok in names
                if not ok and no not in lines[tok]:
                    lines[tok].append(no)
    return [(DOC, "doc names", "%s does not exist (line%s %s)"
             % (tok, "s" if len(nos) > 1 else "", ", ".join(map(str, nos))))
            for tok, nos in sorted(lines.items())]

def label(folder):
    return folder[4:] if folder.startswith("src/") else folder + "/"


def main(argv):
    graph = "--graph" in argv
    args = [a for a in argv if a != "--graph"]
    root = args[0] if args else "."
    if not os.path.isdir(os.path.join(root, "src")):
        print("FAIL: %s: tree: there is no src/ folder" % os.path.join(root, "src"))
        return 1
    files = read_sources(root, "src")
    public = set(read_sources(root, PUBLIC))
    problems = []  # (file, rule, what)
    if not files:
        problems.append(("src", "tree", "holds no .c/.h file"))
    for folder in REQUIRED:
        if not any(os.path.dirname(p) == folder for p in files):
            problems.append((folder, "tree", "this layer is missing or holds no .c/.h file"))

    def resolve(frm, inc):
        for base in (os.path.dirname(frm),) + SEARCH:
            cand = os.path.normpath(os.path.join(base, inc))
            if cand in files or cand in public:
                return cand
        named = [p for p in files if ("/" + p).endswith("/" + os.path.normpath(inc))]
        return named[0] if len(named) == 1 else None

    edges = collections.defaultdict(set)
    folder_edges = collections.Counter()
    for path, text in sorted(files.items()):
        problems += check_head(path, text)
        mod, folder = os.path.splitext(path)[0], os.path.dirname(path)
        if folder not in ALLOWED:
            problems.append((path, "layers", "%s is no layer (add it to ALLOWED)" % folder))
            continue
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
            target = resolve(path, inc)
            if not target:
                continue
            if os.path.splitext(target)[0] != mod and target not in public:
                edges[mod].add(os.path.splitext(target)[0])
            if os.path.dirname(target) != folder:
                folder_edges[(folder, os.path.dirname(target))] += 1
            broken = include_rule(path, folder, target)
            if broken:
                problems.append((path,) + broken)

    cycle = find_cycle(edges, set(edges) | {t for v in edges.values() for t in v})
    if cycle:
        first = min(p for p in files if os.path.splitext(p)[0] == cycle[0])
        problems.append((first, "include cycle", " -> ".join(cycle)))

    tags = collections.defaultdict(list)
    for path, text in files.items():
        for tag in re.findall(r"^(?:typedef\s+)?struct\s+(\w+)\s*\{", text, re.M):
            tags[tag].append(path)
    for tag, where in sorted(tags.items()):
        if len(where) > 1:
            where.sort()
            problems.append((where[0], "struct", "struct %s is also defined in %s"
                             % (tag, ", ".join(where[1:]))))
    problems += check_doc(root)

    if graph:
        print("include graph of src/ by folder (lowest layer first; n = #includes):")
        for a in ORDER:
            outs = sorted(((b, n) for (x, b), n in folder_edges.items() if x == a),
                          key=lambda e: ORDER.index(e[0]) if e[0] in ORDER else -1)
            if outs:
                print("  %-16s -> %s" % (label(a), ", ".join("%s (%d)" % (label(b), n)
                                                             for b, n in outs)))
            else:
                print("  %-16s    (includes no other folder)" % label(a))
    for p in problems:
        print("FAIL: %s: %s: %s" % p)
    if problems:
        return 1
    print("ok: %d files, %d modules with includes: layers, L2 and wire boundaries, no include "
          "cycle, no struct defined twice, opening comments, guards, ARCHITECTURE.md's names"
          % (len(files), len(edges)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
