"""kvpoold's LMCache front end at the wire level, with Debian's python3-zmq and python3-msgpack.

Usage (ctest label "lmcache"): /usr/bin/python3 tests/lmcache/test_wire.py KVPOOLD

1. The conversations recorded between real LMCache 0.5.5 and 0.5.6 workers and
   `lmcache server` (frames/, record_frames.py) are replayed request by request:
   every reply must echo uid and operation byte for byte, have the recorded
   number of frames, and decode to the recorded value (up to what differs by
   design: slot offsets, the segment's name and size, get_experimental).
2. Hostile and odd requests: messages of 1 and 2 frames, wrong payload counts,
   unknown and missing keys, every integer width, operation names as strings,
   oversized arrays, truncated msgpack, GPU and unknown operations, stream
   control frames. Each request of 3 frames or more is answered with a
   well-typed reply, and the daemon keeps serving.
3. The instance caps: --max-instances-per-client per connection, and the LMCache
   front end's share of the instance table, which leaves a kvpool-protocol
   worker (kvpool's Python binding, python/) room to register.
"""

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
KVPOOLD = None
CHUNK = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pack(v):
    return msgpack.packb(v, use_bin_type=True)


def unpack(b):
    return msgpack.unpackb(b, raw=False, strict_map_key=False)


class Daemon:
    def __init__(self, url=None, expect_start=True, extra=()):
        self.dir = tempfile.mkdtemp(prefix="kvp-lmcw-")
        os.chmod(self.dir, 0o700)
        self.port = free_port()
        self.url = url or "tcp://127.0.0.1:%d" % self.port
        self.log_path = os.path.join(self.dir, "kvpoold.log")
        self.log = open(self.log_path, "wb")
        env = dict(os.environ)
        env.pop("KVPOOL_HTTP", None)
        if "TSAN_OPTIONS" in env:  # a TSan build: libzmq is not instrumented (tsan.supp)
            env["TSAN_OPTIONS"] += " suppressions=" + os.path.join(HERE, "tsan.supp")
        self.proc = subprocess.Popen(
            [KVPOOLD, "--socket", os.path.join(self.dir, "kvpool.sock"), "--l1-size", "16MiB",
             "--chunk-size", str(CHUNK), "--http", "127.0.0.1:0",
             "--shm-name", "lmcw%d_%d" % (os.getpid(), self.port), "--lmcache", self.url]
            + list(extra),
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        if not expect_start:
            self.rc = self.proc.wait(60)
            self.log.close()
            self.saved = self.text()
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        deadline = time.monotonic() + 60
        while "ready:" not in self.text():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.text()
            time.sleep(0.02)
        self.http = int(re.search(r"HTTP endpoint on [^ ]*?:(\d+)", self.text()).group(1))

    def text(self):
        if hasattr(self, "saved"):
            return self.saved
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def status(self):
        url = "http://127.0.0.1:%d/api/status" % self.http
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)

    def counters(self):
        return self.status()["counters"]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        self.log.close()
        assert rc == 0, "kvpoold exited with %d:\n%s" % (rc, self.text())
        shutil.rmtree(self.dir, ignore_errors=True)


class Client:
    """One DEALER, as LMCache's client makes it."""

    def __init__(self, url):
        self.ctx = zmq.Context()
        self.s = self.ctx.socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.connect(url)

    def call(self, frames, timeout=10.0):
        self.s.send_multipart(frames)
        if not self.s.poll(int(timeout * 1000)):
            raise AssertionError("no reply to %r within %.0f s" % (frames[:2], timeout))
        return self.s.recv_multipart()

    def silent(self, frames, wait=0.3):
        """Sends frames that must get no reply."""
        self.s.send_multipart(frames)
        if self.s.poll(int(wait * 1000)):
            raise AssertionError("unexpected reply %r" % self.s.recv_multipart())

    def close(self):
        self.s.close()
        self.ctx.term()


def load_conversation(version):
    msgs = []
    with open(os.path.join(HERE, "frames", "conversation-%s.txt" % version)) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            direction, *hexes = line.split(" ")
            msgs.append((direction, [bytes.fromhex(h.strip()) for h in hexes]))
    return msgs


def normalize(op, value):
    """What may differ from `lmcache server`'s reply by design."""
    if op == 32:  # get_experimental: kvpoold enables nothing experimental
        return "list" if isinstance(value, list) else value
    if op == 14:  # register: kvpoold's segment, and the fields later versions declare
        return sorted(k for k in value) if isinstance(value, dict) else value
    if op in (16, 18) and isinstance(value, dict):
        ctx = value.get("context", {})
        for slot in ctx.get("slots", []):
            slot["offset"] = "offset"
        return value
    return value


class Replay(unittest.TestCase):
    def replay(self, version):
        d = Daemon()
        c = Client(d.url)
        try:
            msgs = load_conversation(version)
            iid = None
            for i in range(0, len(msgs), 2):
                (dq, req), (dr, rep) = msgs[i], msgs[i + 1]
                self.assertEqual((dq, dr), ("req", "rep"))
                got = c.call(req)
                op = unpack(req[1])
                self.assertEqual(got[:2], req[:2], "uid and op echoed, op %r" % op)
                self.assertEqual(len(got), len(rep), "frames of the reply to op %r" % op)
                if len(rep) == 3:
                    want, have = normalize(op, unpack(rep[2])), normalize(op, unpack(got[2]))
                    if op == 14:
                        self.assertEqual(want, ["pool_size", "shm_name"])
                        self.assertEqual(have, ["error", "pool_size", "scratch_offset",
                                                "scratch_size", "shm_name"])
                        value = unpack(got[2])
                        self.assertTrue(value["shm_name"].startswith("kvpool_l1_pool_lmcw"))
                        self.assertIsNone(value["error"])
                        iid = unpack(req[2])["instance_id"]
                    else:
                        self.assertEqual(have, want, "reply to op %r" % op)
                        self.assertEqual(type(unpack(got[2])), type(unpack(rep[2])))
            self.assertIsNotNone(iid)
            self.assertIn("Instance %d non-GPU context using SHM transport" % iid,
                          d.text())
        finally:
            c.close()
            d.stop()

    def test_replay_056(self):
        self.replay("0.5.6")

    def test_replay_055(self):
        self.replay("0.5.5")


def key(tokens, worker=0, start=0, end=None, rid="r", **extra):
    k = {"model_name": "w", "world_size": 1, "worker_id": worker, "token_ids": tokens,
         "start": start, "end": len(tokens) if end is None else end, "request_id": rid,
         "cache_salt": "", "request_configs": None, "num_kv_readers": 1}
    k.update(extra)
    return k


REG = {"instance_id": 77, "model_name": "w", "world_size": 1, "block_size": 16,
       "num_layers": 2, "hidden_dim_size": 64, "dtype_str": "float16", "use_mla": False,
       "num_physical_slots": CHUNK}

EMPTY_STORE = {"context": {"slots": [], "chunk_indices": []}}
MISS = {"success": False, "data": b"", "context": {}}


class Hostile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.c = Client(cls.d.url)
        cls.uid = 1000

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.stop()

    def req(self, op, *payloads, raw_op=None):
        Hostile.uid += 1
        u = pack(Hostile.uid)
        o = raw_op if raw_op is not None else pack(op)
        got = self.c.call([u, o] + [p if isinstance(p, bytes) else pack(p) for p in payloads])
        self.assertEqual(got[:2], [u, o])
        return unpack(got[2]) if len(got) == 3 else "NONE" if len(got) == 2 else got

    def alive(self):
        self.assertEqual(self.req(21), CHUNK)
        self.assertEqual(self.req(24), "OK")

    def test_latency_metrics(self):
        """/metrics has kvpool_lmcache_request_duration_seconds for the operations served, and
        promtool accepts the text."""
        def count(text, op):
            m = re.search(r'^kvpool_lmcache_request_duration_seconds_count\{op="%s"\} (\d+)$'
                          % op, text, re.M)
            return int(m.group(1)) if m else None

        def scrape():
            url = "http://127.0.0.1:%d/metrics" % self.d.http
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.read().decode()

        before = count(scrape(), "get_chunk_size") or 0
        for _ in range(3):
            self.assertEqual(self.req(21), CHUNK)
        text = scrape()
        self.assertEqual(count(text, "get_chunk_size"), before + 3)
        self.assertIsNone(count(text, "retrieve"))  # never asked: not reported
        buckets = [int(v) for v in re.findall(
            r'^kvpool_lmcache_request_duration_seconds_bucket\{op="get_chunk_size",le="[^"]+"\} '
            r'(\d+)$', text, re.M)]
        self.assertEqual(len(buckets), 17)
        self.assertEqual(buckets, sorted(buckets))
        self.assertEqual(buckets[-1], before + 3)
        if shutil.which("promtool"):
            p = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                               capture_output=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_short_messages_dropped(self):
        self.c.silent([pack(1)])
        self.c.silent([pack(1), pack(21)][:1])
        # A 2-frame message at the ROUTER is [identity][uid]: one frame from the client.
        self.c.silent([b""])
        # Stream control (an empty op frame): no reply either.
        self.c.silent([pack(5), b"", b"cancel"])
        self.alive()

    def test_payload_counts(self):
        self.assertEqual(self.req(16, key([1] * 16)), EMPTY_STORE)
        self.assertEqual(self.req(17, key([1] * 16), 77), False)
        self.assertEqual(self.req(18, key([1] * 16)), MISS)
        self.assertEqual(self.req(19), False)
        self.assertEqual(self.req(8), "NONE")
        self.assertEqual(self.req(9), 0)
        self.assertEqual(self.req(10, "r"), 0)
        self.assertEqual(self.req(22, 1, 2), False)
        reply = self.req(14)
        self.assertIn("refused", reply["error"])
        self.assertTrue(reply["shm_name"])  # never sent to pickle for a refusal
        self.assertEqual(self.req(21, "extra"), CHUNK)  # still the chunk size
        self.assertEqual(self.req(32, 1, 2), [])
        # The older forms: ping and clear without payload, end_session with one.
        self.assertEqual(self.req(22), True)
        self.assertEqual(self.req(20), "NONE")
        self.assertEqual(self.req(13, "r"), "NONE")
        self.assertEqual(self.req(13, "r", {"finish_reason": "stop", "stop_token_id": 2}), "NONE")
        # Nine payload frames: more than any operation has.
        self.assertEqual(self.req(16, *([1] * 9)), EMPTY_STORE)
        self.alive()

    def test_registration_and_int_widths(self):
        reg = dict(REG, instance_id=0x123456789ABCDEF0 >> 1)
        iid = reg["instance_id"]
        answer = self.req(14, reg)
        self.assertIsNone(answer["error"])
        self.assertGreater(answer["pool_size"], 16 << 20)
        # The instance id in every width that holds it: uint64, int64 (signed form).
        for enc in (b"\xcf" + struct.pack(">Q", iid), b"\xd3" + struct.pack(">q", iid)):
            self.assertEqual(self.req(22, enc), True)
        small = dict(REG, instance_id=300)
        self.assertIsNone(self.req(14, small)["error"])
        toks = list(range(1, CHUNK + 1))
        for enc in (b"\xcd\x01\x2c", b"\xce\x00\x00\x01\x2c", b"\xcf" + struct.pack(">Q", 300),
                    b"\xd1\x01\x2c", b"\xd2\x00\x00\x01\x2c", b"\xd3" + struct.pack(">q", 300)):
            rid = "w%d" % len(enc)
            r = self.req(16, key(toks, rid=rid, model_name="w"), enc)
            # The first width reserves the chunk; the later ones find it being stored.
            self.assertIn("slots", r["context"], enc)
            if enc == b"\xcd\x01\x2c":
                self.assertEqual(len(r["context"]["slots"]), 1)
                slot = r["context"]["slots"][0]
                self.assertEqual(slot["shape"], [2, 2, CHUNK, 64])
                self.assertEqual(slot["dtype"], "float16")
                self.assertEqual(slot["length"], 2 * 2 * CHUNK * 64 * 2)
                self.assertEqual(self.req(17, key(toks, rid=rid), enc, pack(b"")), True)
        # Token ids of every width hash alike: the chunk stored above is found again.
        wide = b"\xdc\x00\x10" + b"".join(b"\xcf" + struct.pack(">Q", t) for t in toks)
        kb = pack(key([], rid="wide"))
        kb = kb.replace(b"\xa9token_ids\x90", b"\xa9token_ids" + wide)
        self.assertEqual(self.req(16, kb, 300), EMPTY_STORE)
        # Unknown keys are skipped, in any order; a negative int where a width is bounded is not.
        self.assertEqual(self.req(22, 300), True)
        odd = dict(REG, instance_id=301, future_field=[1, {"x": 2}], group_hidden_dim_sizes=None)
        self.assertIsNone(self.req(14, dict(reversed(list(odd.items()))))["error"])
        self.assertEqual(self.req(16, key(toks, extra_field={"a": [1, 2]}), -5), EMPTY_STORE)
        self.assertEqual(self.req(15, 301), "NONE")
        self.assertEqual(self.req(15, 300), "NONE")
        self.assertEqual(self.req(15, iid), "NONE")
        self.alive()

    def test_missing_and_bad_keys(self):
        for field in ("model_name", "world_size", "worker_id", "token_ids", "start", "end",
                      "request_id"):
            k = key([1] * 16)
            del k[field]
            self.assertEqual(self.req(16, k, 77), EMPTY_STORE, field)
            self.assertEqual(self.req(18, k, 77), MISS, field)
            self.assertEqual(self.req(8, k, 1), "NONE", field)
        for field in ("instance_id", "model_name", "dtype_str", "use_mla"):
            r = dict(REG)
            del r[field]
            self.assertIn(field, self.req(14, r)["error"])
        self.assertIn("dtype", self.req(14, dict(REG, dtype_str="complex999"))["error"])
        # The same instance again with a layout that can be served: registered now.
        self.assertIsNone(self.req(14, dict(REG))["error"])
        self.assertIn("chunk-size", self.req(14, dict(REG, instance_id=78,
                                                       num_physical_slots=32))["error"])
        self.assertIn("dtype float16",
                      self.req(14, dict(REG, instance_id=79, dtype_str="bfloat16"))["error"])
        self.assertEqual(self.req(15, 77), "NONE")
        self.assertEqual(self.req(16, key([1] * 16, cache_salt="a/b"), 77), EMPTY_STORE)
        self.assertEqual(self.req(16, key([-1] * 16), 77), EMPTY_STORE)
        self.assertEqual(self.req(16, key([1 << 32] * 16), 77), EMPTY_STORE)
        self.assertEqual(self.req(16, key([1] * 16, worker=3), 77), EMPTY_STORE)
        self.assertEqual(self.req(16, key([1] * 16, start=8), 77), EMPTY_STORE)
        self.assertEqual(self.req(17, key([1] * 16), 77, "not bin"), False)
        self.assertEqual(self.req(9, 5), 0)
        self.assertEqual(self.req(10, "r", "soon"), 0)
        self.assertEqual(self.req(20, "yes"), "NONE")
        self.assertEqual(self.req(23, 1, "m", [{"req_id": "a"}] * 5000), "NONE")
        self.alive()

    def test_oversized_and_truncated(self):
        # An array32 announcing 2^31 token ids in a few bytes.
        kb = pack(key([], rid="big")).replace(b"\xa9token_ids\x90",
                                             b"\xa9token_ids\xdd\x80\x00\x00\x00\x01")
        self.assertEqual(self.req(16, kb, 77), EMPTY_STORE)
        # More token ids than kvpool accepts (1 Mi), each one byte.
        many = b"\xdd" + struct.pack(">I", (1 << 20) + 1) + b"\x01" * ((1 << 20) + 1)
        kb = pack(key([], rid="many")).replace(b"\xa9token_ids\x90", b"\xa9token_ids" + many)
        self.assertEqual(self.req(18, kb, 77), MISS)
        # A str32 length beyond the frame, a reserved byte, an empty payload, trailing bytes.
        self.assertEqual(self.req(10, b"\xdb\xff\xff\xff\xff", 1.0), 0)
        self.assertEqual(self.req(22, b"\xc1"), False)
        self.assertEqual(self.req(9, b""), 0)
        self.assertEqual(self.req(22, pack(5) + b"\x00"), False)
        # Deeply nested unknown field.
        kb = pack(key([1] * 16)).replace(b"\xaerequest_configs\xc0",
                                         b"\xaerequest_configs" + b"\x91" * 100000 + b"\xc0")
        self.assertEqual(self.req(16, kb, 77), EMPTY_STORE)
        self.alive()

    def test_operations_by_name_and_unsupported(self):
        self.assertEqual(self.req(None, raw_op=pack("get_chunk_size")), CHUNK)
        self.assertEqual(self.req(None, raw_op=pack("noop")), "OK")
        self.assertEqual(self.req(None, key([1] * 16), 9, raw_op=pack("prepare_store")),
                         EMPTY_STORE)
        self.assertEqual(self.req(None, raw_op=pack("cb_reorder_plan")), [])
        self.assertIs(self.req(None, 1, "m", 0, 10, raw_op=pack("subscribe_kv_events"))["enabled"],
                      False)  # LMCache 0.5.7's KV event stream: kvpoold records no events
        self.assertEqual(self.req(None, raw_op=pack("no_such_operation")), "NONE")
        self.assertEqual(self.req(None, raw_op=pack("x" * 5000)), "NONE")
        self.assertEqual(self.req(None, raw_op=pack(99)), "NONE")
        self.assertEqual(self.req(None, raw_op=pack(-1)), "NONE")
        self.assertEqual(self.req(None, raw_op=b"\xc3"), "NONE")
        self.assertEqual(self.req(None, {"method": "x", "payload": b""},
                                  raw_op=pack("server_module_call"))["success"], False)
        # GPU operations: the payload with an ext value is never decoded.
        ext = b"\x91\xc7\x03\x01abc"
        self.assertEqual(self.req(1, 5, ext, "m", 1, 0, {}, []), "NONE")
        self.assertEqual(self.req(6, key([1] * 16), 5, [[1]], b""), [b"", False])
        self.assertEqual(self.req(7, key([1] * 16), 5, [[1]], b"", 0), [b"", False])
        self.assertEqual(self.req(11, "r"), 0)
        self.assertEqual(self.req(28, key([1] * 16), 1),
                         {"prefix_coverage_tokens": 0, "non_prefix_segments": [],
                          "segmented_prefix_segments": []})
        self.assertEqual(self.req(33, 1), [0, False])
        self.assertEqual(self.req(29, [], {}), 0)
        self.assertEqual(self.req(30, 1), [])
        self.assertEqual(self.req(17), False)  # the pre-0.5.5 numbering
        log = self.d.text()
        self.assertIn("LMCACHE_MP_TRANSFER_MODE=engine_driven", log)
        self.assertIn("predates LMCache 0.5.5", log)
        self.assertEqual(log.count("cb_reorder_plan is not served"), 1)
        counters = self.d.counters()
        self.assertGreater(counters["lmcache_unsupported"], 10)
        self.alive()


def kvpool_binding():
    """kvpool's Python binding (python/), on the libkvpool.so built next to KVPOOLD, unless
    $KVPOOL_LIB names another or that build is a sanitizer build (which this interpreter
    cannot load): then on the one the binding finds itself (the source tree's other builds)."""
    path = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
    if path not in sys.path:
        sys.path.insert(0, path)
    import kvpool
    from kvpool import _lib

    lib = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(KVPOOLD))), "lib",
                       "libkvpool.so")
    if "KVPOOL_LIB" not in os.environ and os.path.exists(lib) and not _lib._sanitizer_build(lib):
        os.environ["KVPOOL_LIB"] = lib
    return kvpool


class InstanceCaps(unittest.TestCase):
    """One connection registers at most --max-instances-per-client LMCache instances, and the
    LMCache front end at most its share of the instance table (1024 less the 256 kept for
    kvpool's own protocol): no peer takes the table from the others."""

    def register(self, c, first, n, **layout):
        """Registers instances first .. first+n-1 on c; returns each reply's error."""
        errors = []
        for i in range(first, first + n):
            got = c.call([pack(i), pack(14), pack(dict(REG, instance_id=i, **layout))])
            errors.append(unpack(got[2])["error"])
        return errors

    def test_per_connection(self):
        d = Daemon(extra=("--max-instances-per-client", "8"))
        a, b, c = Client(d.url), Client(d.url), Client(d.url)
        try:
            errors = self.register(a, 1000, 70)
            self.assertEqual(errors.count(None), 8, "registrations accepted on one connection")
            self.assertEqual(errors[:8], [None] * 8)
            for e in errors[8:]:
                self.assertIn("this connection has 8 LMCache instances registered, the most "
                              "--max-instances-per-client allows", e)
            self.assertEqual(d.counters()["lmcache_instances_refused"], 62)
            self.assertIn("--max-instances-per-client", d.text())
            # The accepted ones are served; another connection still registers.
            self.assertEqual(unpack(a.call([pack(1), pack(22), pack(1007)])[2]), True)
            self.assertEqual(self.register(b, 2000, 1), [None])
            # Registrations refused for their layout take a place of the connection too.
            bad = self.register(c, 3000, 2, num_physical_slots=2 * CHUNK)
            self.assertTrue(all("chunk-size" in e for e in bad), bad)
            errors = self.register(c, 3002, 10)
            self.assertEqual(errors[:6], [None] * 6)
            self.assertTrue(all("this connection has 8" in e for e in errors[6:]), errors)
            self.assertEqual(d.counters()["lmcache_instances_refused"], 66)
            self.assertEqual(len(d.status()["instances"]), 8 + 1 + 6)
        finally:
            for x in (a, b, c):
                x.close()
            d.stop()

    def test_front_end_share(self):
        kvpool = kvpool_binding()
        d = Daemon(extra=("--max-instances-per-client", "1024"))
        a = Client(d.url)
        try:
            errors = self.register(a, 1, 1100)
            sock = os.path.join(d.dir, "kvpool.sock")
            with kvpool.Client(sock) as k:
                try:
                    ctx = k.register("kvpool-0", model_name="w", world_size=1, worker_rank=0,
                                     num_layers=2, hidden_dim=64, dtype="float16")
                except kvpool.Error as e:
                    self.fail("a kvpool worker cannot register once one LMCache peer "
                              "registered 1,100 instances: %s" % e)
                toks = list(range(1, CHUNK + 1))
                self.assertEqual(ctx.store(toks, [bytes(ctx.chunk_bytes)]), 1)
                self.assertEqual(ctx.lookup(toks), 1)
                self.assertEqual(len(d.status()["instances"]), 768 + 1)
            accepted = errors.count(None)
            self.assertEqual(accepted, 768)
            self.assertEqual(errors[:768], [None] * 768)
            for e in errors[768:1024]:
                self.assertIn("the lmcache front end has 768 instances registered, its share "
                              "of the table of 1024", e)
            # The refused registrations count towards the connection's limit too.
            for e in errors[1024:]:
                self.assertIn("this connection has 1024 LMCache instances registered", e)
            self.assertEqual(d.counters()["lmcache_instances_refused"], 1100 - 768)
        finally:
            a.close()
            d.stop()

    def test_refused_registrations_make_room(self):
        """Refused registrations are remembered, not kept: 16 connections with 64 each fill
        the front end's table of 1024, and a valid registration still finds a place."""
        d = Daemon()
        peers = [Client(d.url) for _ in range(17)]
        try:
            for n, c in enumerate(peers[:16]):
                bad = self.register(c, 10000 + 64 * n, 64, num_physical_slots=2 * CHUNK)
                self.assertTrue(all("chunk-size" in e for e in bad), bad[:2])
            self.assertEqual(self.register(peers[16], 1, 1), [None])
            self.assertEqual(len(d.status()["instances"]), 1)
        finally:
            for c in peers:
                c.close()
            d.stop()


class Addresses(unittest.TestCase):
    def test_ipc(self):
        base = tempfile.mkdtemp(prefix="kvp-lmci-")
        os.chmod(base, 0o700)
        path = os.path.join(base, "lmc.sock")
        d = Daemon("ipc://" + path)
        try:
            # The socket file has kvpool's socket mode (0600 by default).
            self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
            c = Client("ipc://" + path)
            try:
                got = c.call([pack(1), pack(21)])
                self.assertEqual(unpack(got[2]), CHUNK)
            finally:
                c.close()
            # A second daemon on the same path is refused, and leaves the first one's file.
            other = Daemon("ipc://" + path, expect_start=False)
            self.assertNotEqual(other.rc, 0)
            self.assertIn("listening on " + path, other.text())
            self.assertTrue(os.path.exists(path))
        finally:
            d.stop()
        self.assertFalse(os.path.exists(path))  # removed at exit
        # Something else than a socket at the path: refused, untouched.
        with open(path, "w") as f:
            f.write("x")
        d = Daemon("ipc://" + path, expect_start=False)
        self.assertNotEqual(d.rc, 0)
        self.assertIn("is not a socket", d.text())
        os.unlink(path)
        # A directory others can write to: refused (kvpool's socket directory rule).
        os.chmod(base, 0o777)
        d = Daemon("ipc://" + path, expect_start=False)
        self.assertNotEqual(d.rc, 0)
        self.assertIn("Refusing to start", d.text())
        shutil.rmtree(base, ignore_errors=True)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to connect as another user")
    def test_ipc_peer_credentials(self):
        """On ipc://, a peer whose user kvpool's own socket would refuse gets no answer, even
        when the file's mode lets it connect; --allow-uid admits it."""
        base = tempfile.mkdtemp(prefix="kvp-lmcp-")
        os.chmod(base, 0o711)  # others may reach the socket, not write the directory
        url = "ipc://" + os.path.join(base, "lmc.sock")
        nobody = 65534
        probe = ("import sys, zmq, msgpack\n"
                 "s = zmq.Context().socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 0)\n"
                 "s.connect(sys.argv[1])\n"
                 "s.send_multipart([msgpack.packb(1), msgpack.packb(21)])\n"
                 "print('answered' if s.poll(1500) else 'silent')\n")

        def as_nobody():
            out = subprocess.run([sys.executable, "-c", probe, url], capture_output=True,
                                 text=True, timeout=60, preexec_fn=lambda: os.setuid(nobody))
            self.assertEqual(out.returncode, 0, out.stderr)
            return out.stdout.strip()

        try:
            for extra, want in (((), "silent"), (("--allow-uid", str(nobody)), "answered")):
                d = Daemon(url, extra=("--socket-mode", "0666") + extra)
                try:
                    self.assertEqual(as_nobody(), want, extra)
                    c = Client(url)  # the daemon's own user is always served
                    try:
                        self.assertEqual(unpack(c.call([pack(1), pack(21)])[2]), CHUNK)
                    finally:
                        c.close()
                finally:
                    d.stop()
        finally:
            shutil.rmtree(base, ignore_errors=True)

    def test_clear_off(self):
        """--lmcache-clear off: a clear is answered as usual and drops nothing; on (the
        default), it empties the cache."""
        toks = list(range(1, CHUNK + 1))
        for extra, kept in ((("--lmcache-clear", "off"), True), ((), False)):
            d = Daemon(extra=extra)
            c = Client(d.url)
            try:
                def req(op, *payloads):
                    got = c.call([pack(op), pack(op)] + [pack(p) for p in payloads])
                    return unpack(got[2]) if len(got) == 3 else "NONE"

                self.assertIsNone(req(14, REG)["error"])
                r = req(16, key(toks, rid="a"), 77)
                self.assertEqual(len(r["context"]["slots"]), 1)
                self.assertEqual(req(17, key(toks, rid="a"), 77, b""), True)
                self.assertEqual(req(16, key(toks, rid="b"), 77), EMPTY_STORE)  # stored
                self.assertEqual(req(20, False), "NONE")
                r = req(16, key(toks, rid="c"), 77)
                if kept:
                    self.assertEqual(r, EMPTY_STORE)
                    self.assertEqual(d.counters()["lmcache_clears_refused"], 1)
                    self.assertIn("refused a clear request", d.text())
                else:
                    self.assertEqual(len(r["context"]["slots"]), 1)  # gone: stored again
                    self.assertEqual(d.counters()["lmcache_clears_refused"], 0)
            finally:
                c.close()
                d.stop()

    def test_tcp_not_loopback_warns(self):
        d = Daemon("tcp://0.0.0.0:%d" % free_port())
        try:
            self.assertIn("not a loopback address", d.text())
            self.assertIn("SECURITY.md", d.text())
        finally:
            d.stop()
        d = Daemon()
        try:
            self.assertNotIn("not a loopback address", d.text())
        finally:
            d.stop()


def main():
    global KVPOOLD
    KVPOOLD = sys.argv.pop(1)
    unittest.main(verbosity=2)


if __name__ == "__main__":
    main()
