"""The binding and the example in an interpreter without numpy.

Each test runs a child interpreter whose ``import numpy`` raises ImportError (a ``numpy``
package that does only that comes first on its PYTHONPATH), as for a pyenv or venv interpreter
that has no numpy.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

from tests.daemon import Daemon, kvpoold_path, require_kvpoold

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER_SIM = os.path.join(os.path.dirname(PYTHON_DIR), "examples", "worker_sim.py")


def setUpModule():
    require_kvpoold()


class _NoNumpy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.shim = tempfile.mkdtemp(prefix="kvpool-nonumpy-")
        os.mkdir(os.path.join(cls.shim, "numpy"))
        with open(os.path.join(cls.shim, "numpy", "__init__.py"), "w") as f:
            f.write('raise ImportError("numpy is hidden by the kvpool tests")\n')

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.shim, ignore_errors=True)

    def run_python(self, args, timeout=90):
        """(exit status, stdout + stderr) of sys.executable with args, numpy hidden."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([self.shim, PYTHON_DIR])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        p = subprocess.run([sys.executable] + args, env=env, capture_output=True, text=True,
                           timeout=timeout, cwd=self.shim)
        return p.returncode, p.stdout + p.stderr


class TestWorkerSim(_NoNumpy):
    def test_runs_without_numpy(self):
        rc, out = self.run_python([WORKER_SIM, "--spawn-daemon", kvpoold_path()])
        self.assertEqual(rc, 0, out)
        self.assertIn("worker_sim: numpy is not installed in %s: using bytearray buffers"
                      % sys.executable, out)
        self.assertIn("worker_sim: OK: worker B's KV equals worker A's", out)
        self.assertNotIn("Traceback", out)

    def test_every_layout_and_transport(self):
        for layout, transport in (("HND", "auto"), ("MLA", "inline")):
            rc, out = self.run_python([WORKER_SIM, "--spawn-daemon", kvpoold_path(),
                                       "--layout", layout, "--transport", transport])
            self.assertEqual(rc, 0, out)
            self.assertIn("worker_sim: OK", out)


class TestBinding(_NoNumpy):
    def test_numpy_calls_say_numpy_is_missing(self):
        with Daemon() as d:
            rc, out = self.run_python(["-c", textwrap.dedent("""
                import kvpool
                assert kvpool._buffers.np is None
                with kvpool.Client(%r) as c:
                    ctx = c.register("no-numpy", model_name="m", world_size=1, worker_rank=0,
                                     num_layers=2, hidden_dim=8, dtype="bfloat16")
                    toks = list(range(ctx.chunk_size))
                    ctx.store(toks, [bytes(ctx.chunk_bytes)])
                    got = ctx.retrieve(toks)
                    print("retrieved:", type(got[0]).__name__, len(got[0]))
                    for call in (lambda: ctx.as_numpy(got[0]),
                                 lambda: ctx.retrieve(toks, as_numpy=True)):
                        try:
                            call()
                        except kvpool.InvalidArgument as e:
                            print("error:", e)
            """ % d.socket)])
        self.assertEqual(rc, 0, out)
        self.assertIn("retrieved: bytearray 1024", out)
        for what in ("as_numpy()", "as_numpy=True"):
            self.assertIn("error: %s needs numpy, which is not installed in this interpreter "
                          "(%s)" % (what, sys.executable), out)
        self.assertNotIn("Traceback", out)


if __name__ == "__main__":
    unittest.main()
