#!/usr/bin/env python3
"""check_layering.py fails on every violation of its rules, and passes a clean tree.

Each test writes a small source tree into a temporary folder (one file in each layer folder,
the public header, docs/ARCHITECTURE.md), breaks one rule in it and runs the checker on it,
as ctest does: the exit code must be 1 and the output must hold the FAIL line of that rule, and
of no other. The clean tree must pass (exit 0). So a rule cannot be dropped or weakened without
a test here failing; the real tree is checked by structure/layering.

Usage: test_check_layering.py [unittest options]. Standard library only; runs with Debian's
/usr/bin/python3.
"""

import os
import subprocess
import sys
import tempfile
import unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_layering.py")


def source(path, *includes, body="", guard=None):
    """A .c/.h file as the tree writes them: opening comment, guard for a header, includes."""
    name = os.path.basename(path)
    text = "/*\n * %s - a module of the test tree.\n */\n" % name
    if name.endswith(".h"):
        g = guard or "KVP_" + name[:-2].upper() + "_H"
        text += "#ifndef %s\n#define %s\n" % (g, g)
    text += "".join('#include "%s"\n' % i for i in includes) + body
    return text + ("#endif\n" if name.endswith(".h") else "")


# The clean tree: every layer folder holds a file, and each allowed kind of include appears.
CLEAN = {
    "include/kvpool.h": source("kvpool.h"),
    "src/common/limits.h": source("limits.h"),
    "src/common/units.h": source("units.h"),
    "src/common/wire.h": source("wire.h", "common/limits.h"),
    "src/server/base/log.h": source("log.h", "common/limits.h"),
    "src/server/core/store.h": source("store.h", "base/log.h", body="struct kvp_store {\n};\n"),
    "src/server/core/stats.h": source("stats.h"),
    "src/server/core/ops.h": source("ops.h", "core/store.h"),
    "src/server/core/ops.c": source("ops.c", "core/ops.h", "l2/l2.h"),
    "src/server/l2/l2_value.h": source("l2_value.h"),
    "src/server/l2/l2.h": source("l2.h", "core/store.h", "l2/l2_value.h"),
    "src/server/l2/l2_tier.c": source("l2_tier.c", "l2/l2.h", "core/stats.h"),
    "src/server/report/status_json.c": source("status_json.c", "core/ops.h", "l2/l2.h"),
    "src/server/kvp/handlers.c": source("handlers.c", "common/wire.h", "core/ops.h"),
    "src/server/http/http.c": source("http.c", "core/ops.h"),
    "src/server/lmc/codec.c": source("codec.c", "common/limits.h", "core/ops.h"),
    "src/server/server.c": source("server.c", "common/wire.h", "l2/l2.h", "kvp/handlers.c"),
    "src/client/conn.h": source("conn.h", "common/wire.h", "kvpool.h"),
    "src/tools/cli/cli.h": source("cli.h", "kvpool.h", "units.h"),
    "src/tools/cli/main.c": source("main.c", "cli.h"),
    "tests/test_ops.c": source("test_ops.c"),
    "docs/ARCHITECTURE.md": ("The operations (`src/server/core/ops.c`, `core/ops.h`),\n"
                             "kvp/handlers.c, l2.h, `kvpool.h` and test_ops.c;\n"
                             "`kvpool_version.h.in` is no source.\n"),
}


class CheckLayering(unittest.TestCase):
    def run_checker(self, changes=None, remove=(), args=()):
        """(exit code, output) of the checker on CLEAN with changes and without remove."""
        tree = dict(CLEAN, **(changes or {}))
        with tempfile.TemporaryDirectory() as root:
            for path, text in tree.items():
                if any(path == r or path.startswith(r + "/") for r in remove):
                    continue
                os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
                with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                    f.write(text)
            res = subprocess.run([sys.executable, CHECKER, *args, root], capture_output=True,
                                 text=True, timeout=30)
        return res.returncode, res.stdout + res.stderr

    def fails(self, expected, changes=None, remove=(), count=1):
        """The broken tree fails, with expected in a FAIL line, and count FAIL lines in all."""
        rc, out = self.run_checker(changes, remove)
        fails = [line for line in out.splitlines() if line.startswith("FAIL: ")]
        self.assertEqual(rc, 1, out)
        self.assertTrue(any(expected in line for line in fails), out)
        self.assertEqual(len(fails), count, out)
        self.assertNotIn("ok:", out)

    def test_clean_tree_passes(self):
        rc, out = self.run_checker()
        self.assertEqual(rc, 0, out)
        self.assertIn("ok: 19 files", out)

    def test_graph(self):
        rc, out = self.run_checker(args=["--graph"])
        self.assertEqual(rc, 0, out)
        self.assertIn("server/l2        -> server/core (2)", out)
        self.assertIn("tools/cli        -> include/ (1), common (1)", out)

    def test_front_end_includes_l2(self):
        for fe in ("kvp", "http", "lmc"):
            with self.subTest(fe):
                self.fails("src/server/%s/x.c: front end and L2: includes src/server/l2/l2.h" % fe,
                           {"src/server/%s/x.c" % fe: source("x.c", "l2/l2.h")})

    def test_front_end_includes_another(self):
        self.fails("src/server/http/x.c: layers: includes src/server/kvp/handlers.c: a front end",
                   {"src/server/http/x.c": source("x.c", "kvp/handlers.c")})

    def test_core_includes_front_end(self):
        self.fails("src/server/core/x.c: layers: includes src/server/lmc/codec.c",
                   {"src/server/core/x.c": source("x.c", "lmc/codec.c")})

    def test_tools_include_client(self):
        for inc in ("client/conn.h", "conn.h"):
            with self.subTest(inc):
                self.fails("src/tools/cli/x.c: CLI: includes src/client/conn.h",
                           {"src/tools/cli/x.c": source("x.c", inc)})

    def test_core_includes_l2_header_other_than_l2h(self):
        self.fails("src/server/core/x.c: core and L2: includes src/server/l2/l2_value.h",
                   {"src/server/core/x.c": source("x.c", "l2/l2_value.h")})

    def test_report_includes_l2_header_other_than_l2h(self):
        self.fails("src/server/report/x.c: L2 interface: includes src/server/l2/l2_value.h",
                   {"src/server/report/x.c": source("x.c", "l2/l2_value.h")})

    def test_l2_includes_core_header_not_listed(self):
        self.fails("src/server/l2/x.c: core and L2: includes src/server/core/ops.h",
                   {"src/server/l2/x.c": source("x.c", "core/ops.h")})

    def test_wire_headers_outside_their_users(self):
        for folder in ("core", "lmc", "l2", "base", "http", "report"):
            with self.subTest(folder):
                self.fails("src/server/%s/x.c: wire headers: includes src/common/wire.h" % folder,
                           {"src/server/%s/x.c" % folder: source("x.c", "common/wire.h")})

    def test_include_cycle(self):
        self.fails("include cycle: src/server/core/a -> src/server/core/b -> src/server/core/a",
                   {"src/server/core/a.h": source("a.h", "core/b.h"),
                    "src/server/core/b.h": source("b.h", "core/a.h")})

    def test_struct_defined_twice(self):
        self.fails("struct kvp_store is also defined in src/server/core/store.h",
                   {"src/server/core/ops.h": source("ops.h", body="struct kvp_store {\n};\n")})

    def test_missing_tree(self):
        rc, out = self.run_checker(remove=["src"])
        self.assertEqual(rc, 1, out)
        self.assertIn("tree: there is no src/ folder", out)
        self.assertNotIn("ok:", out)

    def test_empty_tree(self):
        rc, out = self.run_checker({"src/README": "nothing\n"},
                                   remove=["src/common", "src/server", "src/client", "src/tools"])
        self.assertEqual(rc, 1, out)
        for line in ("FAIL: src: tree: holds no .c/.h file",
                     "FAIL: src/common: tree: this layer is missing",
                     "FAIL: src/server: tree: this layer is missing"):
            self.assertIn(line, out)
        self.assertNotIn("ok:", out)

    def test_missing_layer_folder(self):
        for folder in ("src/common", "src/server/lmc", "src/server/report", "src/tools/cli"):
            with self.subTest(folder):
                # Includes of a removed folder resolve to nothing and are not failures.
                self.fails("FAIL: %s: tree: this layer is missing" % folder, remove=[folder])

    def test_empty_layer_folder(self):
        self.fails("FAIL: src/server/http: tree: this layer is missing or holds no .c/.h file",
                   {"src/server/http/status_page.html": "<html></html>\n"},
                   remove=["src/server/http/http.c"])

    def test_opening_comment_names_another_file(self):
        self.fails("src/server/kvp/listener.c: opening comment: names sessions.c",
                   {"src/server/kvp/listener.c": source("sessions.c")})

    def test_no_opening_comment(self):
        self.fails("src/server/kvp/x.c: opening comment: does not open with",
                   {"src/server/kvp/x.c": '#include "core/ops.h"\n'})

    def test_header_guard_does_not_match(self):
        self.fails("src/server/kvp/listener.h: header guard: guard KVP_SESSIONS_H",
                   {"src/server/kvp/listener.h": source("listener.h", guard="KVP_SESSIONS_H")})

    def test_no_header_guard(self):
        self.fails("src/common/x.h: header guard: no include guard",
                   {"src/common/x.h": "/*\n * x.h - no guard.\n */\nint x;\n"})

    def test_doc_names_missing_file(self):
        self.fails("docs/ARCHITECTURE.md: doc names: sessions.c does not exist (lines 1, 2)",
                   {"docs/ARCHITECTURE.md": "`sessions.c` and\nsrc/server/core/ops.c, sessions.c.\n"
                                            "`core/gone.h`\n"}, count=2)
        self.fails("doc names: core/gone.h does not exist (line 1)",
                   {"docs/ARCHITECTURE.md": "`core/gone.h`\n"})

    def test_doc_missing(self):
        self.fails("docs/ARCHITECTURE.md: doc names: missing", remove=["docs"])


if __name__ == "__main__":
    unittest.main()
