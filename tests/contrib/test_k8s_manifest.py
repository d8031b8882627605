"""contrib/kubernetes/vllm-kvpoold.yaml is a pod Kubernetes accepts and that works as described.

Usage (ctest contrib/k8s_manifest; run by the python of scripts/tools-env.sh's environment):
    python tests/contrib/test_k8s_manifest.py KVPOOLD MANIFEST

- kubernetes-validate --strict (Kubernetes' own OpenAPI schemas, no cluster) accepts it, and
  refuses a copy with a misspelt field, so the check can fail;
- /dev/shm's sizeLimit holds the pool, its header page and the 160 MiB vLLM's CPU engine needs;
  kvpoold's memory limit holds the pool (tmpfs pages count against whoever touches them first);
- vLLM's block size divides kvpoold's chunk size; the connector's host and port are where
  kvpoold serves LMCache; the probes reach the port kvpoold's HTTP endpoint listens on, bound to
  every address (a probe comes from outside the pod's loopback);
- kvpoold starts with the manifest's options (with a small pool, a private socket directory and
  free ports in their place).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import yaml

KVPOOLD = MANIFEST = None
Mi = 1 << 20
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "KiB": 1 << 10,
         "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def size(text):
    m = re.fullmatch(r"(\d+)([KMGT]iB?)?", str(text))
    assert m, "not a size: %r" % text
    return int(m.group(1)) * UNITS.get(m.group(2), 1)


def options(args):
    """--name=value arguments as a dict."""
    out = {}
    for a in args:
        m = re.fullmatch(r"--([a-z0-9-]+)=(.*)", a)
        assert m, "not an --option=value argument: %r" % a
        out[m.group(1)] = m.group(2)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Manifest(unittest.TestCase):
    def setUp(self):
        with open(MANIFEST) as f:
            self.pod = yaml.safe_load(f)
        self.c = {c["name"]: c for c in self.pod["spec"]["containers"]}
        self.kvp = options(self.c["kvpoold"]["args"])

    def validate(self, path):
        tool = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
        return subprocess.run([tool, "--strict", path], capture_output=True, text=True,
                              timeout=120)

    def test_schema(self):
        r = self.validate(MANIFEST)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.yaml")
            with open(MANIFEST) as f, open(bad, "w") as g:
                g.write(f.read().replace("livenessProbe:", "livenesProbe:"))
            r = self.validate(bad)
            self.assertNotEqual(r.returncode, 0, "a misspelt field passed: " + r.stdout)

    def test_sizes(self):
        pool = size(self.kvp["l1-size"])
        dshm = [v for v in self.pod["spec"]["volumes"] if v["name"] == "dshm"][0]["emptyDir"]
        self.assertEqual(dshm["medium"], "Memory")
        self.assertGreaterEqual(size(dshm["sizeLimit"]), pool + 4096 + 160 * Mi)
        limit = size(self.c["kvpoold"]["resources"]["limits"]["memory"])
        self.assertGreaterEqual(limit, pool + 256 * Mi)
        for name in ("kvpoold", "vllm"):
            mounts = {m["mountPath"]: m["name"] for m in self.c[name]["volumeMounts"]}
            self.assertEqual(mounts.get("/dev/shm"), "dshm", name)
            self.assertEqual(mounts.get("/run/kvpool"), "kvpool-run", name)

    def test_wiring(self):
        vllm = self.c["vllm"]["args"]
        block = int(options([a for a in vllm if a.startswith("--block-size=")])["block-size"])
        self.assertEqual(int(self.kvp["chunk-size"]) % block, 0)
        conf = json.loads(vllm[vllm.index("--kv-transfer-config") + 1])
        extra = conf["kv_connector_extra_config"]
        self.assertEqual(conf["kv_connector"], "LMCacheMPConnector")
        self.assertEqual(self.kvp["lmcache"],
                         "tcp://%s:%d" % (extra["lmcache.mp.host"], extra["lmcache.mp.port"]))
        host, port = self.kvp["http"].rsplit(":", 1)
        self.assertEqual(host, "0.0.0.0")
        ports = {p["name"]: p["containerPort"] for p in self.c["kvpoold"]["ports"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = self.c["kvpoold"][probe]["httpGet"]
            self.assertEqual(get["path"], "/healthcheck")
            self.assertEqual(ports[get["port"]], int(port), probe)
        env = {e["name"]: e["value"] for e in self.c["vllm"]["env"]}
        self.assertEqual(env["KVPOOL_SOCKET"], self.kvp["socket"])

    def test_daemon_accepts_the_options(self):
        d = tempfile.mkdtemp(prefix="kvp-k8s-")
        os.chmod(d, 0o700)
        opts = dict(self.kvp, **{"l1-size": "16MiB", "socket": os.path.join(d, "kvpool.sock"),
                                 "http": "127.0.0.1:0",
                                 "lmcache": "tcp://127.0.0.1:%d" % free_port()})
        args = [KVPOOLD] + ["--%s=%s" % kv for kv in opts.items()] + [
            "--shm-name=k8s%d" % os.getpid()]
        log = os.path.join(d, "log")
        with open(log, "wb") as out:
            p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            text = ""
            while "ready:" not in text and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
                with open(log) as f:
                    text = f.read()
            self.assertIn("ready:", text)
            self.assertIn("LMCache front end listening on " + opts["lmcache"], text)
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
            shutil.rmtree(d, ignore_errors=True)


def main():
    global KVPOOLD, MANIFEST
    KVPOOLD, MANIFEST = sys.argv[1], sys.argv[2]
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(Manifest)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
