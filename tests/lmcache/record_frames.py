"""Record the frames a real LMCache worker and a real `lmcache server` exchange.

Usage (inside a venv made by scripts/lmcache-env.sh):
    python tests/lmcache/record_frames.py OUT_DIR [shm|inline|events]

Starts LMCache's server (`python -m lmcache.v1.multiprocess.server`: engine-driven, shared memory on, L1 not lazy) on a
free port, puts a ROUTER/DEALER proxy in front of it, runs LMCache's own worker
and scheduler classes (lmc_worker.py) through the proxy, and writes every
request and reply the proxy forwarded:

  OUT_DIR/conversation-<name>.txt     one line per message: "req" or "rep", then
                                      each frame (identity left out) in hex
  OUT_DIR/corpus/<name>-<nn>-<op>     each request for fuzz/corpus/lmc/: frames as
                                      4-byte little-endian length + bytes
  OUT_DIR/corpus/<name>-session       every request, each ended by the length 0xffffffff

<name> is the LMCache version, then the scenario unless it is shm:
  shm     (default) every operation a CPU worker and the scheduler send, over shared memory
  inline  the same without shared memory (`--shm-name ""`): from 0.5.7 on the chunks travel in
          a msgpack TensorEnvelope, before that in a torch pickle
  events  0.5.7: a worker's subscribe_kv_events stream against a server that records no KV
          events (`--kv-event-log-size 0`): one KVEventBatch with enabled false, the worker's
          ack and cancel, the end of the stream (ZeroMQ delivers the last three in any order)

The committed copies are tests/lmcache/frames/ and fuzz/corpus/lmc/.
"""

import inspect
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import msgspec
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lmc_worker  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def op_name(frame):
    try:
        from lmcache.v1.multiprocess.transport.zmq_impl.wire import decode_operation
    except ImportError:  # 0.5.5: the RequestType enum
        from lmcache.v1.multiprocess.protocols.base import RequestType

        return RequestType(msgspec.msgpack.decode(frame)).name.lower()
    try:
        return decode_operation(frame)
    except Exception:
        return "unknown"


class Proxy(threading.Thread):
    """ROUTER (clients) <-> one DEALER per client (server), remembering every message.

    The protocol has no envelope delimiter, so each client gets its own backend
    DEALER: the server then sees one peer per client, as without the proxy.
    """

    def __init__(self, front_port, back_port):
        super().__init__(daemon=True)
        self.ctx = zmq.Context()
        self.front = self.ctx.socket(zmq.ROUTER)
        self.front.bind(f"tcp://127.0.0.1:{front_port}")
        self.back_url = f"tcp://127.0.0.1:{back_port}"
        self.backs = {}  # client identity -> DEALER
        self.idents = {}  # DEALER -> client identity
        self.log = []
        self.stop = False

    def run(self):
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        while not self.stop:
            for sock, _ in poller.poll(100):
                msg = sock.recv_multipart()
                if sock is self.front:
                    ident = msg[0]
                    if ident not in self.backs:
                        b = self.ctx.socket(zmq.DEALER)
                        b.connect(self.back_url)
                        self.backs[ident] = b
                        self.idents[b] = ident
                        poller.register(b, zmq.POLLIN)
                    self.log.append(("req", msg[1:]))
                    self.backs[ident].send_multipart(msg[1:])
                else:
                    self.log.append(("rep", msg))
                    self.front.send_multipart([self.idents[sock]] + msg)


def packed_keys():
    """0.5.7 keys carry token_bytes (big-endian uint32 words) instead of token_ids."""
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

    return "token_bytes" in getattr(IPCCacheServerKey, "__dataclass_fields__", {})


class Worker(lmc_worker.Worker):
    """lmc_worker's worker, with the key of the installed version."""

    def key(self, tokens, request_id, start=0, end=None, worker=True, readers=1, salt=""):
        if not packed_keys():
            return super().key(tokens, request_id, start, end, worker, readers, salt)
        from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

        return IPCCacheServerKey.from_token_ids(
            model_name=self.model, world_size=self.world_size,
            worker_id=self.rank if worker else None, token_ids=tokens, start=start,
            end=len(tokens) if end is None else end, request_id=request_id, cache_salt=salt,
            num_kv_readers=readers)


def scenario(url, mode="shm"):
    """Every operation a CPU worker and the scheduler send, plus the edges."""
    w = Worker(url, model="rec", dtype="float16", seed=1)
    want = "EngineDrivenContextShm" if mode == "shm" else (
        "EngineDrivenContextInline" if packed_keys() else "EngineDrivenContextPickle")
    got = w.register()
    assert got == want, "lmcache server gave %s, wanted %s" % (got, want)
    w.ping()
    sched = lmc_worker.Scheduler(url)
    sched.req.ping(None).result(timeout=10)
    sched.req.noop().result(timeout=10)
    if hasattr(sched.req, "negotiate_chunk_size"):
        # 0.5.7's connector asks by name; the size already chosen is a multiple of 16.
        assert sched.req.negotiate_chunk_size(w.chunk).result(timeout=10) == w.chunk
    tokens = list(range(1, 2 * w.chunk + 5))
    n = 2 * w.chunk
    assert w.store(tokens, "r1", end=n)
    assert w.store(tokens, "r1", end=n)  # everything cached: empty slot lists, no commit
    sched.lookup(w, tokens, "r1")
    assert sched.wait("r1") == 2
    assert sched.query("r1") == 0  # exactly once
    out = w.blank()
    assert w.retrieve(tokens, "r1", out, end=n)
    assert w.blocks_equal(out, 2 * w.bic)
    if packed_keys():
        # 0.5.7: free_lookup_locks's extra_ranges, the ranges of earlier abandoned lookups.
        key = w.key(tokens, "r1", worker=False, end=n)
        sched.req.free_lookup_locks(key, w.world_size, ((0, w.chunk),)).result(timeout=10)
    else:
        sched.free(w, tokens, "r1", end=n)
    sched.end_session("r1")
    miss = [t + 1000 for t in tokens]
    sched.lookup(w, miss, "r2")
    assert sched.query("r2") in (0, None)
    assert not w.retrieve(miss, "r2", w.blank(), end=n)
    sched.end_session("r2")
    from lmcache.v1.multiprocess.custom_types import BlockAllocationRecord

    sched.req.report_block_allocation(
        w.iid, "rec", [BlockAllocationRecord("r3", [1, 2], [5, 6, 7])]
    ).result(timeout=10)
    if "force" in str(inspect.signature(sched.req.clear)):
        sched.req.clear(False).result(timeout=10)
    else:
        sched.req.clear().result(timeout=10)
    w.unregister()
    w.close()
    sched.close()


def events_scenario(url):
    """0.5.7's worker subscription to a server that records no KV events: one batch saying so,
    which the worker acknowledges, then cancels (it falls back to its own events)."""
    w = Worker(url, model="rec", dtype="float16", seed=1)
    assert w.register() == "EngineDrivenContextShm", "lmcache server did not offer SHM"
    stream = w.req.subscribe_kv_events(w.iid, "rec", 0, 64)
    batch = next(stream)
    assert batch.enabled is False and batch.events == [], batch
    stream.close()
    time.sleep(0.5)
    w.unregister()
    w.close()


def main():
    out = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "shm"
    assert mode in ("shm", "inline", "events"), mode
    os.makedirs(os.path.join(out, "corpus"), exist_ok=True)
    back, front = free_port(), free_port()
    env = dict(os.environ, LMCACHE_DISABLE_BANNER="1")
    log = open(os.path.join(out, "server-%s.log" % mode), "wb")
    extra = ["--shm-name", "" if mode == "inline" else f"rec{os.getpid()}"]
    if mode == "events":
        extra += ["--kv-event-log-size", "0"]
    # The module entry point: 0.5.5's `lmcache` command imports its benchmark tools (and
    # openai) first; the module is the same server without HTTP.
    srv = subprocess.Popen(
        [sys.executable, "-m", "lmcache.v1.multiprocess.server", "--port", str(back),
         "--l1-size-gb", "0.25", "--eviction-policy", "LRU", "--chunk-size", "16",
         "--supported-transfer-mode", "engine_driven", "--no-l1-use-lazy"] + extra,
        stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while b"cache server is running" not in open(log.name, "rb").read():
            if srv.poll() is not None or time.monotonic() > deadline:
                sys.exit("lmcache server did not start; see " + log.name)
            time.sleep(0.2)
        proxy = Proxy(front, back)
        proxy.start()
        if mode == "events":
            events_scenario(f"tcp://127.0.0.1:{front}")
        else:
            scenario(f"tcp://127.0.0.1:{front}", mode)
        time.sleep(0.3)
        proxy.stop = True
        proxy.join()
    finally:
        srv.terminate()
        srv.wait(30)
    version = lmc_worker.lmcache_version()
    name = version if mode == "shm" else f"{version}-{mode}"
    server = "`lmcache server" + {"shm": "`", "inline": ' --shm-name ""`',
                                  "events": " --kv-event-log-size 0`"}[mode]
    with open(os.path.join(out, f"conversation-{name}.txt"), "w") as f:
        f.write(f"# lmcache {version}: a real worker and {server} (record_frames.py {mode})\n")
        for i, (direction, frames) in enumerate(proxy.log):
            f.write(direction + " " + " ".join(fr.hex() for fr in frames) + "\n")
            if direction == "req":
                # A stream's ack or cancel has an empty operation frame.
                op = op_name(frames[1]) if frames[1] else frames[-1].decode("ascii", "replace")
                with open(os.path.join(out, "corpus", f"{name}-{i:02d}-{op}"), "wb") as c:
                    for fr in frames:
                        c.write(struct.pack("<I", len(fr)) + fr)
    # The whole session as one input of fuzz_lmc (messages ended by the length 0xffffffff).
    with open(os.path.join(out, "corpus", f"{name}-session"), "wb") as c:
        for direction, frames in proxy.log:
            if direction == "req":
                for fr in frames:
                    c.write(struct.pack("<I", len(fr)) + fr)
                c.write(struct.pack("<I", 0xFFFFFFFF))
    # A sanity check that the recording decodes.
    for direction, frames in proxy.log:
        msgspec.msgpack.decode(frames[0])
    print(f"recorded {len(proxy.log)} messages into {out}")


if __name__ == "__main__":
    main()
