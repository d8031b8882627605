"""Starts and stops a real kvpoold for the Python tests.

The daemon binary comes from $KVPOOL_KVPOOLD (set by CTest), else the build tree. Each daemon
gets its own temporary directory and socket, and a shared-memory segment named
kvpool_l1_pool_pytest_<pid>_<n> (or none, for an inline-only daemon). stop() sends SIGTERM and
waits, so the daemon removes its segment.
"""

import glob
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import kvpool

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_counter = itertools.count()


def kvpoold_path():
    """Path of the kvpoold binary, or None."""
    env = os.environ.get("KVPOOL_KVPOOLD")
    if env:
        return env
    found = sorted(glob.glob(os.path.join(_REPO, "build*", "bin", "kvpoold")))
    return found[0] if found else None


def require_kvpoold():
    """Raises SkipTest (with the reason) when no daemon binary is available."""
    path = kvpoold_path()
    if not path or not os.access(path, os.X_OK):
        raise unittest.SkipTest("kvpoold not found: set KVPOOL_KVPOOLD or build the project")
    try:
        kvpool.library_path()
    except kvpool.LibraryError as e:
        raise unittest.SkipTest("libkvpool.so not usable: %s" % e)
    return path


class Daemon:
    """A kvpoold on a private socket. shm=False starts it with --shm-name ""."""

    def __init__(self, shm=True, chunk_size=16, l1_size="64MiB", extra=()):
        self.binary = require_kvpoold()
        self.dir = tempfile.mkdtemp(prefix="kvpool-py-")
        self.socket = os.path.join(self.dir, "s.sock")
        self.log_path = os.path.join(self.dir, "kvpoold.log")
        # A memfd segment has no name: kvpoold refuses --shm-name next to it.
        named = "memfd" not in extra
        self.shm_name = ("kvpool_l1_pool_pytest_%d_%d" % (os.getpid(), next(_counter))
                         if shm and named else "")
        self.chunk_size = chunk_size
        self.args = [self.binary, "--socket", self.socket, "--l1-size", l1_size,
                     "--chunk-size", str(chunk_size), "--log-level", "info"]
        if named:
            self.args += ["--shm-name", self.shm_name]
        self.args += list(extra)
        self.proc = None

    def start(self, timeout=10.0):
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("kvpoold exited with %s:\n%s" % (self.proc.returncode,
                                                                    self.log()))
            try:
                with kvpool.Client(self.socket, timeout=1.0) as c:
                    c.ping()
                return self
            except kvpool.DaemonUnavailable:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("kvpoold did not answer within %.0f s:\n%s"
                                   % (timeout, self.log()))
            time.sleep(0.05)

    def log(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stats(self):
        with kvpool.Client(self.socket, timeout=5.0) as c:
            return c.stats()

    def stop(self):
        """SIGTERM, wait up to 10 s (then SIGKILL). Returns the exit code."""
        rc = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        elif self.proc is not None:
            rc = self.proc.returncode
        if self.proc is not None:
            self._log.close()
        self.proc = None
        return rc

    def kill(self):
        """SIGKILL, like a crash: the socket file and the segment stay behind until the next
        start() clears them. Returns the exit code (-9)."""
        rc = None
        if self.proc is not None:
            self.proc.kill()
            rc = self.proc.wait()
            self._log.close()
        self.proc = None
        return rc

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self, **kw):
        return kvpool.Client(self.socket, **kw)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()
