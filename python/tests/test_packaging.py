"""The package builds and installs offline: `pip install ./python` in a fresh virtual
environment with no index, through the in-tree build backend (python/build_backend), which
needs nothing beyond the standard library. Its metadata are pyproject.toml's."""

import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(PYTHON_DIR, "build_backend"))

import kvpool  # noqa: E402
import kvpool_build  # noqa: E402

try:
    import tomllib  # type: ignore[import]  # mypy checks against Python 3.8, which has none
except ImportError:  # Python < 3.11
    tomllib = None


class TestBackend(unittest.TestCase):
    def test_wheel_contents(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(kvpool_build.get_requires_for_build_wheel(), [])
            name = kvpool_build.build_wheel(tmp)
            self.assertEqual(name, "kvpool-%s-py3-none-any.whl" % kvpool.__version__)
            with zipfile.ZipFile(os.path.join(tmp, name)) as z:
                names = set(z.namelist())
                meta = z.read("kvpool-%s.dist-info/METADATA" % kvpool.__version__).decode()
            for module in ("__init__", "client", "context", "errors", "_lib"):
                self.assertIn("kvpool/%s.py" % module, names)
            self.assertIn("kvpool/py.typed", names)
            self.assertIn("kvpool-%s.dist-info/licenses/LICENSE" % kvpool.__version__, names)
            self.assertIn("Version: %s\n" % kvpool.__version__, meta)
            self.assertIn('Requires-Dist: numpy; extra == "numpy"', meta)

    @unittest.skipIf(tomllib is None, "tomllib needs Python 3.11")
    def test_metadata_are_pyprojects(self):
        with open(os.path.join(PYTHON_DIR, "pyproject.toml"), "rb") as f:
            doc = tomllib.load(f)
        project, p = doc["project"], kvpool_build.PROJECT
        self.assertEqual(doc["build-system"]["requires"], [])
        self.assertEqual(project["name"], kvpool_build.NAME)
        self.assertEqual(project["description"], p["summary"])
        self.assertEqual(project["requires-python"], p["requires_python"])
        self.assertEqual(project["license"]["text"], p["license"])
        self.assertEqual(project["classifiers"], p["classifiers"])
        self.assertEqual(project["optional-dependencies"], p["extras"])
        self.assertEqual(project.get("dependencies", []), [])
        self.assertEqual(kvpool_build.version(), kvpool.__version__)


class TestOfflineInstall(unittest.TestCase):
    def test_pip_install_without_an_index(self):
        with tempfile.TemporaryDirectory() as tmp:
            venv = os.path.join(tmp, "venv")
            made = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True,
                                  text=True)
            if made.returncode != 0 or not os.path.exists(os.path.join(venv, "bin", "pip")):
                self.skipTest("this interpreter cannot make a virtual environment with pip "
                              "(Debian: apt-get install python3-venv): %s" % made.stderr.strip())
            env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                       PIP_NO_CACHE_DIR="1")
            env.pop("PYTHONPATH", None)
            p = subprocess.run([os.path.join(venv, "bin", "pip"), "install", PYTHON_DIR],
                               capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            p = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                                "import kvpool; print(kvpool.__version__, kvpool.__file__)"],
                               capture_output=True, text=True, env=env, cwd=tmp)
            self.assertEqual(p.returncode, 0, p.stderr)
            version, path = p.stdout.split()
            self.assertEqual(version, kvpool.__version__)
            self.assertTrue(path.startswith(venv), path)


if __name__ == "__main__":
    unittest.main()
