"""kvpoold's LMCache front end and LMCache 0.5.7's wire, with Debian's python3-zmq and
python3-msgpack (test_wire.py's daemon, client and recorded conversations).

Usage (ctest label "lmcache"): /usr/bin/python3 tests/lmcache/test_replay057.py KVPOOLD

1. The conversations a real LMCache 0.5.7rc2 worker had with the real `lmcache server`
   (frames/conversation-0.5.7rc2*.txt, record_frames.py) are replayed request by request:
   over shared memory, with the tensor envelope (`--shm-name ""`: kvpoold's envelope of a
   retrieve is byte for byte the recorded one) and the KV event stream (the batch, then the
   end of the stream after the worker's ack, nothing after its cancel). Every reply echoes
   uid and operation, has the recorded number of frames and the recorded value, up to what
   differs by design (slot offsets, the segment, the registration's error field, the event
   stream's incarnation).
2. 0.5.7's requests at the wire level: negotiate_chunk_size with every alignment and
   malformed ones, prepare_store's skipped_chunks, free_lookup_locks's extra_ranges, the KV
   event stream's control messages and its bounded table, a hybrid model's registration.
3. Hostile tensor envelopes into a full pool: wrong version, unknown and repeated fields, a
   grouped envelope, dtype and shape other than the registration's, sizes declared beyond
   LMCache's limits or beyond the data, too many and too few tensors, truncated and trailing
   bytes. Each is refused (false), counted, stores nothing and evicts nothing; a real envelope
   after them is stored.
"""

import os
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_wire  # noqa: E402
from test_wire import CHUNK, Client, Daemon, load_conversation, normalize, pack, unpack  # noqa

VERSION = "0.5.7rc2"
EMPTY_STORE = test_wire.EMPTY_STORE


def key057(tokens, worker=0, start=0, end=None, rid="r", model="w", **extra):
    """An IPCCacheServerKey of 0.5.7: token_bytes, big-endian uint32 words."""
    k = {"model_name": model, "world_size": 1, "worker_id": worker,
         "token_bytes": struct.pack(">%dI" % len(tokens), *tokens),
         "start": start, "end": len(tokens) if end is None else end, "request_id": rid,
         "cache_salt": "", "request_configs": None, "num_kv_readers": 1}
    k.update(extra)
    return k


def registration(iid, layers=2, hidden=64, dtype="float16", group_layouts=(), model="w"):
    """RegisterEngineDrivenContextPayload of 0.5.7 (with group_layouts)."""
    return {"instance_id": iid, "model_name": model, "world_size": 1, "block_size": CHUNK,
            "num_layers": layers, "hidden_dim_size": hidden, "dtype_str": dtype,
            "use_mla": False, "num_physical_slots": CHUNK, "group_layouts": list(group_layouts)}


class Raw(bytes):
    """A payload frame sent as it is (every other payload is msgpack-encoded, bytes as bin)."""


def frame(p):
    return bytes(p) if isinstance(p, Raw) else pack(p)


def envelope(tensors, version=1):
    return pack({"version": version, "tensors": tensors})


def tensor(data, shape, dtype="float16"):
    return {"dtype": dtype, "shape": list(shape), "data": data}


class Replay(unittest.TestCase):
    """The recorded 0.5.7rc2 conversations. Each request's recorded reply is the first later
    reply with its uid and operation (two clients were recorded, whose uids overlap); a stream
    control message's is the first later one with its uid: the end of the stream after an
    ack, none after a cancel of a stream that is over."""

    def replay(self, name, extra=(), shm=True):
        d = Daemon(extra=extra)
        c = Client(d.url)
        try:
            msgs = load_conversation(name)
            used = set()
            iid = None
            for i, (direction, req) in enumerate(msgs):
                if direction != "req":
                    continue
                control = req[1] == b""
                rep = None
                for j in range(i + 1, len(msgs)):
                    if j in used or msgs[j][0] != "rep" or msgs[j][1][0] != req[0]:
                        continue
                    if control or msgs[j][1][1] == req[1]:
                        rep = msgs[j][1]
                        used.add(j)
                        break
                if rep is None:
                    self.assertTrue(control, "no recorded reply to %r" % req[:2])
                    c.silent(req)
                    continue
                got = c.call(req)
                what = "op %r" % (unpack(req[1]) if not control else req[2])
                self.assertEqual(got[:2], rep[:2], "uid and op, " + what)
                self.assertEqual(len(got), len(rep), "frames of the reply to " + what)
                if len(rep) < 3:
                    continue
                op = unpack(req[1])
                want, have = unpack(rep[2]), unpack(got[2])
                if op == 14:
                    self.assertEqual(sorted(have), sorted(list(want) + ["error"]))
                    self.assertEqual(sorted(want), ["null_block_id", "pool_size", "shm_name"])
                    self.assertIsNone(have["error"])
                    self.assertEqual(have["null_block_id"], 0)
                    if shm:
                        self.assertTrue(have["shm_name"].startswith("kvpool_l1_pool_lmcw"))
                    else:
                        self.assertEqual((have["shm_name"], have["pool_size"]), ("", 0))
                    iid = unpack(req[2])["instance_id"]
                elif op == "subscribe_kv_events":
                    self.assertGreater(have.pop("incarnation"), 0)
                    want.pop("incarnation")
                    self.assertEqual(have, want)
                elif op == 18 and not shm:
                    # The tensor envelope of a retrieve: LMCache's own bytes.
                    self.assertEqual(got[2], rep[2], "the envelope of a retrieve")
                else:
                    self.assertEqual(normalize(op, have), normalize(op, want), what)
                    self.assertEqual(type(have), type(want), what)
            self.assertIsNotNone(iid)
            log = d.text()
            self.assertIn("Instance %d non-GPU context using %s" % (
                iid, "SHM transport" if shm else "envelope transport"), log)
            counters = d.counters()
            self.assertEqual(counters["lmcache_malformed"], 0, log)
            self.assertEqual(counters["lmcache_unsupported"], 0, log)
            return log, counters
        finally:
            c.close()
            d.stop()

    def test_shared_memory(self):
        self.replay(VERSION)

    def test_envelope(self):
        log, _ = self.replay(VERSION + "-inline", extra=("--shm-name", ""), shm=False)
        self.assertIn("Using safe inline engine-driven transfer strategy", log)

    def test_event_stream(self):
        _, counters = self.replay(VERSION + "-events")
        self.assertEqual(counters["lmcache_kv_event_subscriptions"], 1)
        self.assertEqual(counters["lmcache_dropped"], 0)


class Wire(unittest.TestCase):
    """0.5.7's requests one by one."""

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.c = Client(cls.d.url)
        cls.uid = 5000

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.stop()

    def req(self, op, *payloads, raw_op=None):
        type(self).uid += 1
        u = pack(type(self).uid)
        o = raw_op if raw_op is not None else pack(op)
        got = self.c.call([u, o] + [frame(p) for p in payloads])
        self.assertEqual(got[:2], [u, o])
        return unpack(got[2]) if len(got) == 3 else "NONE" if len(got) == 2 else got

    def counter(self, name):
        return self.d.counters()[name]

    def test_negotiate_chunk_size(self):
        op = pack("negotiate_chunk_size")
        malformed = self.counter("lmcache_malformed")
        for align in (1, 2, 8, CHUNK):
            self.assertEqual(self.req(None, align, raw_op=op), CHUNK)
        self.assertEqual(self.counter("lmcache_malformed"), malformed)
        self.assertNotIn("multiple of", self.d.text())
        for align in (3, 3 * CHUNK, 2 ** 31 - 1):
            self.assertEqual(self.req(None, align, raw_op=op), CHUNK)
        self.assertIn("start kvpoold with --chunk-size %d" % (3 * CHUNK), self.d.text())
        self.assertEqual(self.counter("lmcache_malformed"), malformed)
        # Never None, not even for what does not decode: the connector calls int() on it.
        for payloads in ((0,), (-16,), (2 ** 31,), ("16",), (None,), (1.5,), (), (16, 16),
                         (Raw(b"\xc1"),)):
            self.assertEqual(self.req(None, *payloads, raw_op=op), CHUNK, payloads)
        self.assertEqual(self.counter("lmcache_malformed"), malformed + 9)

    def test_prepare_store_skipped_chunks(self):
        iid = 571
        self.assertIsNone(self.req(14, registration(iid))["error"])
        # What a single-group 0.5.7 worker sends: no group, or one without positions.
        for i, skipped in enumerate(([], [[]])):
            toks = list(range(1 + 100 * i, 1 + 100 * i + 2 * CHUNK))
            reply = self.req(16, key057(toks, rid="s"), iid, skipped)
            self.assertEqual(len(reply["context"]["slots"]), 2, skipped)
            self.assertEqual(self.req(17, key057(toks, rid="s"), iid, b""), True)
        # Positions to skip, or several groups: a hybrid model's, answered "nothing to write".
        toks2 = list(range(500, 500 + 2 * CHUNK))
        malformed = self.counter("lmcache_malformed")
        for skipped in ([[0]], [[], []], [[1], [0, 1]]):
            self.assertEqual(self.req(16, key057(toks2), iid, skipped), EMPTY_STORE, skipped)
        self.assertIn("kvpool serves one group; answered that there is nothing to write",
                      self.d.text())
        # Not decodable: the negative reply, counted.
        for skipped in ({}, [0], [[-1]], [[4096]], [["x"]], [[]] * 65):
            self.assertEqual(self.req(16, key057(toks2), iid, skipped), EMPTY_STORE, skipped)
        self.assertEqual(self.counter("lmcache_malformed"), malformed + 6)
        self.assertEqual(self.d.status()["gauges"]["objects_reserved"], 0)
        self.req(15, iid)

    def test_free_lookup_locks_extra_ranges(self):
        iid = 572
        self.assertIsNone(self.req(14, registration(iid))["error"])
        toks = list(range(1000, 1000 + 2 * CHUNK))
        self.assertEqual(len(self.req(16, key057(toks), iid, [])["context"]["slots"]), 2)
        self.assertTrue(self.req(17, key057(toks), iid, b""))
        sched = key057(toks, worker=None, rid="fl")
        self.assertEqual(self.req(8, sched, 1), "NONE")
        self.assertEqual(self.req(10, "fl", 1.0), 2)
        pinned = self.d.status()["gauges"]["objects_pinned"]
        self.assertEqual(pinned, 2)
        malformed = self.counter("lmcache_malformed")
        for ranges in ({}, [[1]], [[1, 2, 3]], [[-1, 2]], [["a", 2]], [[0, 1]] * 257):
            self.assertEqual(self.req(12, dict(sched, start=0, end=0), 1, ranges), "NONE")
        self.assertEqual(self.counter("lmcache_malformed"), malformed + 6)
        self.assertEqual(self.d.status()["gauges"]["objects_pinned"], pinned)
        # Ranges of earlier lookups only: this lookup's locks stay.
        self.assertEqual(self.req(12, dict(sched, start=0, end=0), 1, [[0, CHUNK]]), "NONE")
        self.assertEqual(self.d.status()["gauges"]["objects_pinned"], pinned)
        self.assertEqual(self.req(12, dict(sched, start=0, end=2 * CHUNK), 1, [[CHUNK, CHUNK]]),
                         "NONE")
        self.assertEqual(self.d.status()["gauges"]["objects_pinned"], 0)
        self.req(13, "fl")
        self.req(15, iid)

    def test_hybrid_registration_refused(self):
        layout = {"num_layers": 1, "hidden_dim_size": 64, "dtype_str": "float16",
                  "tokens_per_block": CHUNK, "window_tokens": CHUNK, "kv_size": 2,
                  "window_chunks": 0, "recurrent": False}
        reply = self.req(14, registration(573, group_layouts=[layout, layout]))
        self.assertEqual(sorted(reply), ["error", "null_block_id", "pool_size", "shm_name"])
        self.assertIn("a hybrid model (2 KV cache groups in group_layouts): kvpool serves one "
                      "group; run vLLM with --disable-hybrid-kv-cache-manager", reply["error"])
        self.assertTrue(reply["shm_name"])  # a refusal never sends the worker in band
        # A 0.5.6 registration (no group_layouts) gets 0.5.6's reply form.
        old = registration(574)
        del old["group_layouts"]
        reply = self.req(14, old)
        self.assertEqual(sorted(reply), ["error", "pool_size", "scratch_offset", "scratch_size",
                                         "shm_name"])
        self.req(15, 574)

    def test_event_stream_control(self):
        op = pack("subscribe_kv_events")
        subs = self.counter("lmcache_kv_event_subscriptions")
        dropped = self.counter("lmcache_dropped")

        def subscribe(uid, *payloads):
            self.c.s.send_multipart([pack(uid), op] + [pack(p) for p in payloads])

        def recv():
            self.assertTrue(self.c.s.poll(10000), "no frames from kvpoold")
            return self.c.s.recv_multipart()

        # The batch, then the end of the stream after the ack; a second ack is dropped, a
        # cancel of the stream that is over needs nothing.
        subscribe(7001, 1, "w", 0, 64)
        got = recv()
        self.assertEqual(got[:2], [pack(7001), op])
        batch = unpack(got[2])
        self.assertEqual((batch["enabled"], batch["next_cursor"], batch["lost"], batch["events"]),
                         (False, 0, False, []))
        self.c.silent([pack(7001), b"", b"nonsense"])
        self.assertEqual(self.c.call([pack(7001), b"", b"ack"]), [pack(7001), op])
        self.c.silent([pack(7001), b"", b"ack"])
        self.c.silent([pack(7001), b"", b"cancel"])
        self.assertEqual(self.counter("lmcache_dropped"), dropped + 2)
        # A cancel ends an open stream too.
        subscribe(7002, 1, "w", 5, 1)
        self.assertEqual(recv()[:2], [pack(7002), op])
        self.assertEqual(self.c.call([pack(7002), b"", b"cancel"]), [pack(7002), op])
        # A malformed subscription: no stream, the end at once.
        for payloads in ((1, "w", -1, 64), (1, "w", 0, 0), (1, "w", 0, 1025), (-1, "w", 0, 1),
                         (1, 2, 0, 1), (1, "w", 0)):
            subscribe(7003, *payloads)
            self.assertEqual(recv(), [pack(7003), op], payloads)
        # Streams of one client are bounded: the fifth pushes the first out, which is ended.
        for u in range(7010, 7014):
            subscribe(u, 2, "w", 0, 8)
            self.assertEqual(recv()[:2], [pack(u), op])
        subscribe(7014, 2, "w", 0, 8)
        self.assertEqual(recv()[:2], [pack(7014), op])  # the new one's batch, then ...
        self.assertEqual(recv(), [pack(7010), op])  # ... the end of the oldest
        for u in range(7011, 7015):
            self.assertEqual(self.c.call([pack(u), b"", b"ack"]), [pack(u), op])
        self.assertEqual(self.counter("lmcache_kv_event_subscriptions"), subs + 7)
        self.assertEqual(self.req(21), CHUNK)


class HostileEnvelopes(unittest.TestCase):
    """Tensor envelopes into a pool full of committed chunks: each hostile one is refused
    before anything is reserved, so nothing is stored and nothing evicted."""

    LAYERS, HIDDEN = 8, 1024
    SHAPE = (2, LAYERS, CHUNK, HIDDEN)
    BYTES = 2 * LAYERS * CHUNK * HIDDEN * 2  # 512 KiB of float16

    def setUp(self):
        self.d = Daemon(extra=("--shm-name", ""))
        self.c = Client(self.d.url)
        self.uid = 0
        reply = self.req(14, registration(99, layers=self.LAYERS, hidden=self.HIDDEN))
        self.assertEqual((reply["shm_name"], reply["error"]), ("", None))

    def tearDown(self):
        self.c.close()
        self.d.stop()

    def req(self, op, *payloads):
        self.uid += 1
        u = pack(self.uid)
        got = self.c.call([u, pack(op)] + [frame(p) for p in payloads], timeout=30)
        self.assertEqual(got[:2], [u, pack(op)])
        return unpack(got[2]) if len(got) == 3 else None

    def gauges(self):
        return self.d.status()["gauges"]

    def commit(self, toks, data, rid="h"):
        return self.req(17, key057(toks, rid=rid), 99, data)

    def test_hostile_envelopes(self):
        good = bytes(range(256)) * (self.BYTES // 256)
        # Fill the pool with committed chunks.
        n = 0
        while self.gauges()["pool_largest_free"] >= self.BYTES:
            toks = list(range(10000 * (n + 1), 10000 * (n + 1) + CHUNK))
            self.assertTrue(self.commit(toks, envelope([tensor(good, self.SHAPE)]), "f%d" % n))
            n += 1
        committed = self.gauges()["objects_committed"]
        self.assertEqual(committed, n)
        self.assertGreater(n, 16)

        shape = list(self.SHAPE)
        t = tensor(good, shape)
        bin32 = b"\xc6" + struct.pack(">I", self.BYTES)

        def raw_tensor(data_part):
            """A tensor map with hand-written data bytes."""
            head = pack({"dtype": "float16", "shape": shape})
            return bytes([0x83]) + head[1:] + pack("data") + data_part

        hostile = {
            "version 2": envelope([t], version=2),
            "version as a str": pack({"version": "1", "tensors": [t]}),
            "no version": pack({"tensors": [t]}),
            "an unknown field": pack({"version": 1, "tensors": [t], "extra": 0}),
            "a repeated field": b"\x83" + pack("version")[0:] + b"\x01" + pack("tensors") +
                                pack([t]) + pack("version") + b"\x01",
            "an unknown tensor field": envelope([dict(t, strides=[1, 1, 1, 1])]),
            "a tensor without data": envelope([{"dtype": "float16", "shape": shape}]),
            "a grouped envelope": pack({"version": 1, "groups": [{"chunk_indices": [0],
                                                                  "tensors": [t]}]}),
            "dtype float32": envelope([tensor(good, shape, "float32")]),
            "dtype bfloat16": envelope([tensor(good, shape, "bfloat16")]),
            "an unknown dtype": envelope([tensor(good, shape, "complex32")]),
            "another shape": envelope([tensor(good, [2, self.LAYERS, 2 * CHUNK,
                                                     self.HIDDEN // 2])]),
            "a rank of 3": envelope([tensor(good, [2 * self.LAYERS, CHUNK, self.HIDDEN])]),
            "a rank of 17": envelope([tensor(good, [1] * 17)]),
            "a negative dimension": envelope([tensor(good, [-2, self.LAYERS, CHUNK,
                                                            -self.HIDDEN])]),
            "a dimension of 2^40": envelope([tensor(good, [2, self.LAYERS, CHUNK, 2 ** 40])]),
            "data shorter than the shape": envelope([tensor(good[:-2], shape)]),
            "data longer than the shape": envelope([tensor(good + b"\0\0", shape)]),
            "data as a str": envelope([tensor("x" * 16, shape)]),
            "a bin claiming 4 GiB": b"\x82" + pack("version") + b"\x01" + pack("tensors") +
                                    b"\x91" + raw_tensor(b"\xc6\xff\xff\xff\xff" + good),
            "a bin longer than the data": b"\x82" + pack("version") + b"\x01" + pack("tensors") +
                                          b"\x91" + raw_tensor(bin32 + good[:-1]),
            "an array claiming 2^31 tensors": b"\x82" + pack("version") + b"\x01" +
                                              pack("tensors") + b"\xdd\x80\x00\x00\x00" +
                                              pack(t),
            "65537 tensors": b"\x82" + pack("version") + b"\x01" + pack("tensors") +
                             b"\xdd" + struct.pack(">I", 65537) + pack(t) * 2,
            "two tensors for one chunk": envelope([t, t]),
            "no tensor": envelope([]),
            "truncated": envelope([t])[:-100],
            "trailing bytes": envelope([t]) + b"\xc0",
            "a map32 that claims more than it has": b"\xdf\x00\x01\x00\x00" + pack("version"),
        }
        malformed = self.d.counters()["lmcache_malformed"]
        for i, (name, data) in enumerate(hostile.items()):
            toks = list(range(900000 + i * CHUNK, 900000 + (i + 1) * CHUNK))
            self.assertIs(self.commit(toks, data), False, name)
            g = self.gauges()
            self.assertEqual((g["objects_committed"], g["objects_reserved"]), (committed, 0),
                             name + ": stored or evicted something")
        self.assertEqual(self.d.counters()["lmcache_malformed"], malformed + len(hostile))
        self.assertIsNone(self.d.proc.poll())
        log = self.d.text()
        self.assertIn("tensor envelope commit of", log)
        self.assertIn("nothing stored", log)
        # Every chunk stored before is still there, byte for byte.
        for k in (0, n - 1):
            toks = list(range(10000 * (k + 1), 10000 * (k + 1) + CHUNK))
            reply = self.req(18, key057(toks, rid="g%d" % k), 99)
            self.assertTrue(reply["success"])
            self.assertEqual(reply["data"], envelope([tensor(good, self.SHAPE)]))
            self.req(19, key057(toks, rid="g%d" % k), 99)
        # The real envelope is stored (evicting the oldest chunk to make room).
        self.assertTrue(self.commit(list(range(5, 5 + CHUNK)), envelope([t])))
        self.assertEqual(self.gauges()["objects_committed"], committed)


def main():
    test_wire.KVPOOLD = sys.argv.pop(1)
    unittest.main(verbosity=2)


if __name__ == "__main__":
    main()
