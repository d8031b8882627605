"""The kvpool package's build backend (PEP 517, PEP 660): the standard library only.

`pip install ./python` builds the package in an isolated environment, after installing the
backend's build requirements into it. With setuptools as the backend that meant downloading
setuptools (and wheel), so an offline machine, or a virtual environment without them, failed
with "Could not find a version that satisfies the requirement setuptools>=61" and no hint.
kvpool is pure Python (ctypes over libkvpool.so), and a wheel of pure Python is a zip file with
three small text files in it: this backend writes it with zipfile and needs nothing that is not
in every Python, so `pip install ./python` works offline and `--no-build-isolation` is never
needed.

What it builds: a py3-none-any wheel of python/kvpool (every .py and py.typed), an sdist of
python/, and an editable wheel (`pip install -e ./python`) that puts python/ on sys.path with a
.pth file. The metadata are PROJECT below; tests/test_packaging.py checks them against
pyproject.toml's [project] table, which stays the documented source.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
NAME = "kvpool"

# pyproject.toml's [project], as the core metadata (tests/test_packaging.py keeps them equal).
PROJECT = {
    "summary": "Python binding of the kvpool KV-cache daemon's client library (ctypes)",
    "requires_python": ">=3.8",
    "license": "MIT",
    "classifiers": [
        "License :: OSI Approved :: MIT License",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Typing :: Typed",
    ],
    "extras": {"numpy": ["numpy"], "torch": ["torch"]},
}


def version():
    """kvpool.__version__, read from the source (importing it is not needed)."""
    with open(os.path.join(HERE, NAME, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("no __version__ in %s/__init__.py" % NAME)
    return m.group(1)


def metadata():
    """The METADATA file (core metadata 2.1), with the README as its description."""
    lines = ["Metadata-Version: 2.1", "Name: " + NAME, "Version: " + version(),
             "Summary: " + PROJECT["summary"], "License: " + PROJECT["license"],
             "Requires-Python: " + PROJECT["requires_python"]]
    lines += ["Classifier: " + c for c in PROJECT["classifiers"]]
    for extra, reqs in sorted(PROJECT["extras"].items()):
        lines.append("Provides-Extra: " + extra)
        lines += ['Requires-Dist: %s; extra == "%s"' % (r, extra) for r in reqs]
    lines.append("Description-Content-Type: text/markdown")
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        return "\n".join(lines) + "\n\n" + f.read()


def _package_files():
    """(path in the wheel, path on disk) of the package: its .py files and py.typed."""
    src = os.path.join(HERE, NAME)
    return [("%s/%s" % (NAME, n), os.path.join(src, n)) for n in sorted(os.listdir(src))
            if n.endswith(".py") or n == "py.typed"]


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "%s,sha256=%s,%d" % (arcname, digest.decode("ascii"), len(data))


def _write_wheel(directory, entries):
    """Writes the wheel of entries [(arcname, bytes)] plus its dist-info. Returns its name."""
    ver = version()
    dist_info = "%s-%s.dist-info" % (NAME, ver)
    with open(os.path.join(HERE, "LICENSE"), "rb") as f:
        license_text = f.read()
    entries = list(entries) + [
        (dist_info + "/METADATA", metadata().encode("utf-8")),
        (dist_info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: kvpool_build\n"
                               b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
        (dist_info + "/licenses/LICENSE", license_text),
    ]
    record = [_record_line(a, d) for a, d in entries] + [dist_info + "/RECORD,,"]
    entries.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode("utf-8")))
    name = "%s-%s-py3-none-any.whl" % (NAME, ver)
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in entries:
            z.writestr(zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0)), data,
                       zipfile.ZIP_DEFLATED)
    return name


# ---- PEP 517 ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for arcname, path in _package_files():
        with open(path, "rb") as f:
            entries.append((arcname, f.read()))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """PEP 660: a wheel whose .pth file puts python/ on sys.path, so edits take effect."""
    return _write_wheel(wheel_directory, [("_kvpool_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, version())
    name = base + ".tar.gz"
    files = ["pyproject.toml", "README.md", "LICENSE", "build_backend/kvpool_build.py"]
    files += [os.path.relpath(p, HERE) for _, p in _package_files()]
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for rel in files:
            t.add(os.path.join(HERE, rel), arcname="%s/%s" % (base, rel), recursive=False)
        info = tarfile.TarInfo("%s/PKG-INFO" % base)
        data = metadata().encode("utf-8")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return name
