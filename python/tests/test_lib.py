"""Library discovery, version check and the error classes.

Discovery tests run in subprocesses, because the binding loads the library once per process.
"""

import ctypes
import errno
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest
from unittest import mock

import kvpool
from kvpool import _lib, errors

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, **env):
    e = dict(os.environ)
    e["PYTHONPATH"] = PYTHON_DIR
    e.update(env)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


class TestDiscovery(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        try:
            cls.lib = os.path.realpath(kvpool.library_path())
        except kvpool.LibraryError as e:
            raise unittest.SkipTest("libkvpool.so not usable: %s" % e)
        cls.tmp = tempfile.mkdtemp(prefix="kvpool-pylib-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_env_file_and_directory(self):
        d = os.path.join(self.tmp, "dir")
        os.makedirs(d, exist_ok=True)
        shutil.copy(self.lib, os.path.join(d, "libkvpool.so"))
        for value in (self.lib, d):
            rc, out = run_python("""
                import kvpool
                print(kvpool.library_path(), kvpool.library_version())
            """, KVPOOL_LIB=value)
            self.assertEqual(rc, 0, out)
            self.assertIn("(1, ", out)

    def test_binding_version_is_the_library_version(self):
        # The project's version is written once (CMake's project()): the library gets it from
        # there, and the binding's own __version__ (also the pip package's) must match it.
        if "KVPOOL_LIB" not in os.environ:
            self.skipTest("needs the library of this build ($KVPOOL_LIB, set by CTest)")
        self.assertEqual(kvpool.__version__, "%d.%d.%d" % kvpool.library_version())

    def test_import_is_lazy_and_missing_library_is_clear(self):
        rc, out = run_python("""
            import kvpool
            try:
                kvpool.Client("/nonexistent.sock")
            except kvpool.LibraryError as e:
                assert isinstance(e, ImportError)
                print("LibraryError:", e)
        """, KVPOOL_LIB="/nonexistent/libkvpool.so")
        self.assertEqual(rc, 0, out)
        self.assertIn("LibraryError:", out)
        self.assertIn("/nonexistent/libkvpool.so", out)

    def test_other_major_version_refused(self):
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler to build a fake library")
        src = os.path.join(self.tmp, "fake.c")
        so = os.path.join(self.tmp, "libkvpool_v2.so")
        with open(src, "w") as f:
            f.write("unsigned kvp_version(void) { return (2u << 16) | (3u << 8) | 1u; }\n")
        subprocess.run([cc, "-shared", "-fPIC", "-o", so, src], check=True)
        rc, out = run_python("""
            import kvpool
            try:
                kvpool.library_path()
            except kvpool.LibraryError as e:
                print("refused:", e)
        """, KVPOOL_LIB=so)
        self.assertEqual(rc, 0, out)
        self.assertIn("refused:", out)
        self.assertIn("2.3.1", out)
        self.assertIn("major version 1", out)

    def test_not_a_kvpool_library(self):
        libm = None
        for cand in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                     "/lib64/libm.so.6", "/usr/lib/aarch64-linux-gnu/libm.so.6"):
            if os.path.exists(cand):
                libm = cand
                break
        if not libm:
            self.skipTest("no libm to load")
        rc, out = run_python("""
            import kvpool
            try:
                kvpool.library_path()
            except kvpool.LibraryError as e:
                print("refused:", e)
        """, KVPOOL_LIB=libm)
        self.assertEqual(rc, 0, out)
        self.assertIn("not a kvpool client library", out)


class TestBuildTreeChoice(unittest.TestCase):
    """Without $KVPOOL_LIB, a checkout's build/ is used and sanitizer builds never are.

    Each test makes a fake checkout: a copy of the kvpool package in <tmp>/python/ and build
    directories holding copies of this build's library.
    """

    @classmethod
    def setUpClass(cls):
        try:
            cls.lib = os.path.realpath(kvpool.library_path())
        except kvpool.LibraryError as e:
            raise unittest.SkipTest("libkvpool.so not usable: %s" % e)

    def setUp(self):
        self.repo = tempfile.mkdtemp(prefix="kvpool-pytree-")
        self.addCleanup(shutil.rmtree, self.repo, True)
        shutil.copytree(os.path.join(PYTHON_DIR, "kvpool"),
                        os.path.join(self.repo, "python", "kvpool"),
                        ignore=shutil.ignore_patterns("__pycache__"))

    def build_dir(self, name, cache_option=None, lib=None):
        """<repo>/<name>/lib/libkvpool.so (a copy of lib, default this build's library) and a
        CMakeCache.txt that sets cache_option, if given."""
        d = os.path.join(self.repo, name)
        os.makedirs(os.path.join(d, "lib"))
        shutil.copy(lib or self.lib, os.path.join(d, "lib", "libkvpool.so"))
        with open(os.path.join(d, "CMakeCache.txt"), "w") as f:
            f.write("CMAKE_BUILD_TYPE:STRING=RelWithDebInfo\n")
            if cache_option:
                f.write("%s:BOOL=ON\n" % cache_option)
        return d

    def chosen(self):
        """(exit status, output) of a process that loads the fake checkout's kvpool package
        with $KVPOOL_LIB unset; it prints the chosen path or the LibraryError."""
        env = dict(os.environ)
        env.pop("KVPOOL_LIB", None)
        env["PYTHONPATH"] = os.path.join(self.repo, "python")
        code = textwrap.dedent("""
            import kvpool
            try:
                print("chosen:", kvpool.library_path())
            except kvpool.LibraryError as e:
                print("LibraryError:", e)
        """)
        # cwd: "python -c" puts it first on sys.path, before the fake checkout.
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=60, cwd=self.repo)
        return p.returncode, p.stdout + p.stderr

    def test_normal_build_preferred(self):
        self.build_dir("build-asan", "KVP_ASAN")
        self.build_dir("build-fuzz", "KVP_FUZZ")
        self.build_dir("build")
        rc, out = self.chosen()
        self.assertEqual(rc, 0, out)
        self.assertIn("chosen: %s\n" % os.path.join(self.repo, "build", "lib", "libkvpool.so"),
                      out)

    def test_sanitizer_builds_skipped(self):
        self.build_dir("build-asan", "KVP_ASAN")
        self.build_dir("build-tsan", "KVP_TSAN")
        self.build_dir("build-other")
        rc, out = self.chosen()
        self.assertEqual(rc, 0, out)
        self.assertIn("chosen: %s\n" % os.path.join(self.repo, "build-other", "lib",
                                                    "libkvpool.so"), out)

    def test_instrumented_library_skipped(self):
        # A really ASan-instrumented library in a build directory whose cache says nothing:
        # loading it into this interpreter would abort ("ASan runtime does not come first").
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler to build an instrumented library")
        src = os.path.join(self.repo, "fake.c")
        so = os.path.join(self.repo, "libfake.so")
        with open(src, "w") as f:
            f.write("unsigned kvp_version(void) { return 1u << 16; }\n")
        p = subprocess.run([cc, "-shared", "-fPIC", "-fsanitize=address", "-o", so, src],
                           capture_output=True, text=True)
        if p.returncode != 0:
            self.skipTest("cannot build with -fsanitize=address: %s" % p.stderr.strip())
        self.build_dir("build-custom", lib=so)
        rc, out = self.chosen()
        self.assertEqual(rc, 0, out)
        if out.startswith("chosen:"):
            self.assertNotIn(self.repo, out)    # an installed library, if there is one
        else:
            self.assertIn("skipped: sanitizer build, references __asan_init", out)


class TestStructLayouts(unittest.TestCase):
    """The ctypes mirrors in kvpool/_lib.py against the C compiler's layout of the headers."""

    def test_layouts_match_headers(self):
        cc = shutil.which("cc") or shutil.which("gcc")
        include = os.path.join(os.path.dirname(PYTHON_DIR), "include")
        if not cc or not os.path.exists(os.path.join(include, "kvpool_paged.h")):
            self.skipTest("no C compiler or no include/ directory")
        from kvpool import _lib
        structs = [n for n in dir(_lib) if n.startswith("kvp_")
                   and isinstance(getattr(_lib, n), type)
                   and issubclass(getattr(_lib, n), ctypes.Structure)]
        self.assertIn("kvp_paged_cache", structs)
        lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "kvpool.h"',
                 '#include "kvpool_paged.h"', "int main(void) {"]
        for name in structs:
            lines.append('printf("%s %%zu\\n", sizeof(%s));' % (name, name))
            for field, _ in getattr(_lib, name)._fields_:
                lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));'
                             % (name, field, name, field))
        lines.append("return 0; }")
        tmp = tempfile.mkdtemp(prefix="kvpool-layout-")
        try:
            src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
            with open(src, "w") as f:
                f.write("\n".join(lines) + "\n")
            # kvpool_version.h is generated into the build tree of the library under test.
            built = os.path.join(os.path.dirname(os.path.dirname(kvpool.library_path())),
                                 "include")
            subprocess.run([cc, "-std=c11", "-I", include, "-I", built, "-o", exe, src],
                           check=True)
            out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        want = {}
        for name in structs:
            cls = getattr(_lib, name)
            want[name] = ctypes.sizeof(cls)
            for field, _ in cls._fields_:
                want["%s.%s" % (name, field)] = getattr(cls, field).offset
        got = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
        self.assertEqual(got, want)


class TestRegisterSignature(unittest.TestCase):
    def test_keyword_only_past_the_id(self):
        # Seven positional values let num_layers and hidden_dim trade places unnoticed.
        params = inspect.signature(kvpool.Client.register).parameters
        positional = [n for n, p in params.items()
                      if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        self.assertEqual(positional, ["self", "instance_id"])
        for name in ("model_name", "world_size", "worker_rank", "num_layers", "hidden_dim",
                     "dtype", "block_size", "use_mla", "transport"):
            self.assertIs(params[name].kind, inspect.Parameter.KEYWORD_ONLY, name)
        with self.assertRaises(TypeError):
            kvpool.Client.register(object(), "rank0", "m", 1, 0, 32, 1024, "float16")


class TestErrors(unittest.TestCase):
    def make(self, code, **kw):
        return errors.from_code(code, "op", "desc", "the daemon's message", **kw)

    def test_mapping(self):
        cases = [
            (-errno.EINVAL, kvpool.InvalidArgument, ValueError),
            (-errno.ENOENT, kvpool.NotFound, LookupError),
            (-errno.ECONNREFUSED, kvpool.DaemonUnavailable, ConnectionError),
            (-errno.EPIPE, kvpool.DaemonUnavailable, ConnectionError),
            (-errno.ECONNRESET, kvpool.DaemonUnavailable, ConnectionError),
            (-errno.ETIMEDOUT, kvpool.Timeout, TimeoutError),
            (-errno.ENOSPC, kvpool.NoSpace, kvpool.Error),
            (-errno.E2BIG, kvpool.TooBig, ValueError),
            (-errno.EOPNOTSUPP, kvpool.ShmUnavailable, kvpool.Error),
            (errors.KVP_ENOSHM, kvpool.ShmUnavailable, kvpool.Error),
            (errors.KVP_EPROTO, kvpool.ProtocolError, kvpool.Error),
            (errors.KVP_EVERSION, kvpool.ProtocolError, kvpool.Error),
            (errors.KVP_EBADSLOT, kvpool.BadSlot, kvpool.ProtocolError),
            (-errno.EXDEV, kvpool.Error, Exception),
        ]
        for code, cls, builtin in cases:
            e = self.make(code)
            self.assertIs(type(e), cls, code)
            self.assertIsInstance(e, builtin)
            self.assertIsInstance(e, kvpool.Error)
            self.assertEqual(e.code, code)
            self.assertEqual(e.errno, -code)
            self.assertEqual(e.message, "the daemon's message")
            self.assertIn(e.name, str(e))
            self.assertIn("the daemon's message", str(e))
        self.assertEqual(self.make(errors.KVP_ENOSHM).name, "KVP_ENOSHM")
        self.assertEqual(self.make(-errno.EINVAL).name, "EINVAL")
        # While connecting, -ENOENT means "no socket", not "no such instance".
        self.assertIs(type(self.make(-errno.ENOENT, connecting=True)), kvpool.DaemonUnavailable)

    def test_the_message_never_decides(self):
        # The class comes from the code alone: a message that reads like a lost connection, or
        # like anything else, changes the text, never the class.
        messages = ["", "the daemon's message",
                    "lost the connection to kvpoold and could not reconnect: cannot connect to "
                    "/run/kvpool.sock: No such file or directory",
                    "too many clients connected (--max-clients)", "unknown instance handle 0x1"]
        codes = [-getattr(errno, n) for n in errors._CLASSES if not n.startswith("KVP_E")]
        codes += list(errors.kvp_codes().values()) + [-errno.EXDEV]
        for code in codes:
            classes = {type(errors.from_code(code, "op", "desc", m)) for m in messages}
            self.assertEqual(len(classes), 1, (code, classes))
            self.assertEqual(classes, {errors.exception_class(code)})
        # Whether -ENOENT came from a connect is the caller's knowledge, passed explicitly.
        self.assertIs(type(self.make(-errno.ENOENT)), kvpool.NotFound)

    def test_every_errno_name_is_an_errno(self):
        for name in errors._CLASSES:
            if not name.startswith("KVP_E"):
                self.assertTrue(hasattr(errno, name), name)

    def test_raise_and_catch(self):
        with self.assertRaises(TimeoutError):
            raise self.make(-errno.ETIMEDOUT)
        with self.assertRaises(kvpool.Error):
            raise self.make(-errno.ECONNREFUSED)

    def test_no_space_is_not_memory_error(self):
        # A full pool is not this process running out of memory.
        self.assertFalse(issubclass(kvpool.NoSpace, MemoryError))
        self.assertEqual(kvpool.NoSpace.__bases__, (kvpool.Error,))
        for code in (-errno.ENOSPC, -errno.ENOMEM):
            e = self.make(code)
            self.assertIs(type(e), kvpool.NoSpace)
            self.assertNotIsInstance(e, MemoryError)
            try:
                try:
                    raise e
                except MemoryError:
                    self.fail("NoSpace caught by except MemoryError")
            except kvpool.NoSpace:
                pass


class TestErrorNames(unittest.TestCase):
    """Names of codes, and kvpool's own codes, come from the library's kvp_err_name()."""

    @classmethod
    def setUpClass(cls):
        try:
            kvpool.library_path()
        except kvpool.LibraryError as e:
            raise unittest.SkipTest("libkvpool.so not usable: %s" % e)

    def test_names_from_the_library(self):
        self.assertEqual(errors.code_name(-10005), "KVP_EPEER")
        self.assertEqual(errors.code_name(-10001), "KVP_EPROTO")
        self.assertEqual(errors.code_name(-errno.EINVAL), "EINVAL")
        self.assertEqual(errors.code_name(-errno.EOPNOTSUPP), "EOPNOTSUPP")
        self.assertEqual(errors.code_name(-99999), "E99999")
        self.assertEqual(errors.code_name(0), "OK")

    def test_codes_from_the_library(self):
        # The values are the C ABI (KVP_ERRNO_MAP): they never change, new codes are appended.
        codes = errors.kvp_codes()
        for name, code in (("KVP_EPROTO", -10001), ("KVP_EVERSION", -10002),
                           ("KVP_EBADSLOT", -10003), ("KVP_ENOSHM", -10004),
                           ("KVP_EPEER", -10005)):
            self.assertEqual(codes[name], code)
            self.assertEqual(getattr(errors, name), code)
        self.assertEqual(sorted(codes.values()), list(range(-10000 - len(codes), -10000)))
        from kvpool.errors import KVP_ENOSHM
        self.assertEqual(KVP_ENOSHM, -10004)
        self.assertFalse(hasattr(errors, "KVP_ENOSUCHCODE"))
        self.assertFalse(hasattr(errors, "NO_SUCH_NAME"))

    def test_every_library_code_has_a_class(self):
        # Drift: a code added to KVP_ERRNO_MAP needs its exception class in errors.py (and a
        # name there that the library no longer has is stale).
        kvp_names = [n for n in errors._CLASSES if n.startswith("KVP_E")]
        self.assertEqual(sorted(errors.kvp_codes()), sorted(kvp_names))
        for name, code in errors.kvp_codes().items():
            e = errors.from_code(code, "op", "desc")
            self.assertIs(type(e), errors._CLASSES[name])
            self.assertEqual(e.name, name)

    def test_a_library_with_other_names(self):
        # The binding copies no table: another library's answers change names and codes.
        names = {-10001: b"KVP_EONE", -10002: b"KVP_ETWO", -errno.EINVAL: b"EWHATEVER"}
        fake = types.SimpleNamespace(
            kvp_err_name=lambda code: names.get(code, b"E%d" % -code))
        with mock.patch.object(_lib, "_lib", fake):
            self.assertEqual(errors.code_name(-10001), "KVP_EONE")
            self.assertEqual(errors.code_name(-10005), "E10005")
            self.assertEqual(errors.code_name(-errno.EINVAL), "EWHATEVER")
            self.assertEqual(errors.kvp_codes(), {"KVP_EONE": -10001, "KVP_ETWO": -10002})
            self.assertEqual(errors.KVP_ETWO, -10002)
            self.assertFalse(hasattr(errors, "KVP_EPEER"))
            e = errors.from_code(-10002, "op", "desc")
            self.assertEqual(e.name, "KVP_ETWO")
            self.assertIs(type(e), kvpool.Error)    # no class for a name errors.py does not know
            self.assertIn("(KVP_ETWO)", str(e))
            self.assertIs(type(errors.from_code(-errno.EINVAL, "op", "d")),
                          kvpool.InvalidArgument)
        self.assertEqual(errors.code_name(-10005), "KVP_EPEER")
        self.assertEqual(errors.KVP_EPEER, -10005)


if __name__ == "__main__":
    unittest.main()
