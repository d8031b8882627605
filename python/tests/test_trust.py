"""Who is on the other end of the socket, seen from Python (docs/SECURITY.md).

Runs with the interpreter CTest chooses (Debian's /usr/bin/python3); needs no numpy. The case
with a daemon of another uid runs the daemon as nobody (65534) and needs root; it is skipped
with that reason otherwise.
"""

import os
import shutil
import subprocess
import tempfile
import time
import unittest

import kvpool

from .daemon import require_kvpoold

NOBODY = 65534


class DefaultDirectoryTest(unittest.TestCase):
    def setUp(self):
        self.xdg = tempfile.mkdtemp(prefix="kvpool-py-xdg-")
        self.saved = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "KVPOOL_SOCKET")}
        os.environ["XDG_RUNTIME_DIR"] = self.xdg
        os.environ.pop("KVPOOL_SOCKET", None)

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(self.xdg, ignore_errors=True)

    def test_default_path_is_in_a_private_directory(self):
        self.assertEqual(kvpool.default_socket_path(),
                         os.path.join(self.xdg, "kvpool", "kvpool.sock"))

    def test_directory_writable_by_others_is_refused(self):
        d = os.path.join(self.xdg, "kvpool")
        os.mkdir(d)
        os.chmod(d, 0o777)
        with self.assertRaises(kvpool.UntrustedDaemon) as cm:
            kvpool.Client()
        self.assertIn("writable by group or others", str(cm.exception))
        self.assertIn("writable by group or others", cm.exception.message)


class UntrustedDaemonTest(unittest.TestCase):
    def test_daemon_of_another_uid(self):
        binary = require_kvpoold()
        if os.geteuid() != 0:
            self.skipTest("running a daemon as another uid (nobody) needs root")
        d = tempfile.mkdtemp(prefix="kvpool-py-nobody-")
        os.chown(d, NOBODY, NOBODY)
        sock = os.path.join(d, "s.sock")
        log = open(os.path.join(d, "kvpoold.log"), "wb")
        proc = subprocess.Popen(
            [binary, "--socket", sock, "--allow-uid", "0", "--shm-name", "", "--l1-size", "4MiB"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            user=NOBODY, group=NOBODY, extra_groups=[])
        try:
            deadline = time.monotonic() + 10
            while not os.path.exists(sock):
                self.assertIsNone(proc.poll(), "kvpoold exited during start-up")
                self.assertLess(time.monotonic(), deadline, "kvpoold did not start")
                time.sleep(0.02)
            deadline = time.monotonic() + 10
            while True:
                try:
                    with kvpool.Client(sock, timeout=2.0, trust_uid=NOBODY) as c:
                        c.ping()
                    break
                except kvpool.DaemonUnavailable:
                    self.assertLess(time.monotonic(), deadline, "kvpoold did not answer")
                    time.sleep(0.02)
            with self.assertRaises(kvpool.UntrustedDaemon) as cm:
                kvpool.Client(sock, timeout=2.0)
            self.assertIn("runs as uid %d" % NOBODY, str(cm.exception))
            self.assertEqual(cm.exception.code, kvpool.errors.KVP_EPEER)
        finally:
            proc.terminate()
            proc.wait(10)
            log.close()
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
