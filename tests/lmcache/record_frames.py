"""Record the frames a real LMCache worker and a real `lmcache server` exchange.

Usage (inside a venv made by scripts/lmcache-env.sh):
    python tests/lmcache/record_frames.py OUT_DIR

Starts LMCache's server (`python -m lmcache.v1.multiprocess.server`: engine-driven, shared memory on, L1 not lazy) on a
free port, puts a ROUTER/DEALER proxy in front of it, runs LMCache's own worker
and scheduler classes (lmc_worker.py) through the proxy, and writes every
request and reply the proxy forwarded:

  OUT_DIR/conversation-<version>.txt  one line per message: "req" or "rep", then
                                      each frame (identity left out) in hex
  OUT_DIR/corpus/<nn>-<op>            each request for fuzz/corpus/lmc/: frames as
                                      4-byte little-endian length + bytes
  OUT_DIR/corpus/<version>-session    every request, each ended by the length 0xffffffff

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


def scenario(url):
    """Every operation a CPU worker and the scheduler send, plus the edges."""
    w = lmc_worker.Worker(url, model="rec", dtype="float16", seed=1)
    assert w.register() == "EngineDrivenContextShm", "lmcache server did not offer SHM"
    w.ping()
    sched = lmc_worker.Scheduler(url)
    sched.req.ping(None).result(timeout=10)
    sched.req.noop().result(timeout=10)
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


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "corpus"), exist_ok=True)
    back, front = free_port(), free_port()
    env = dict(os.environ, LMCACHE_DISABLE_BANNER="1")
    log = open(os.path.join(out, "server.log"), "wb")
    # The module entry point: 0.5.5's `lmcache` command imports its benchmark tools (and
    # openai) first; the module is the same server without HTTP.
    srv = subprocess.Popen(
        [sys.executable, "-m", "lmcache.v1.multiprocess.server", "--port", str(back),
         "--l1-size-gb", "0.25", "--eviction-policy", "LRU", "--chunk-size", "16",
         "--supported-transfer-mode", "engine_driven", "--no-l1-use-lazy",
         "--shm-name", f"rec{os.getpid()}"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while b"cache server is running" not in open(log.name, "rb").read():
            if srv.poll() is not None or time.monotonic() > deadline:
                sys.exit("lmcache server did not start; see " + log.name)
            time.sleep(0.2)
        proxy = Proxy(front, back)
        proxy.start()
        scenario(f"tcp://127.0.0.1:{front}")
        time.sleep(0.3)
        proxy.stop = True
        proxy.join()
    finally:
        srv.terminate()
        srv.wait(30)
    version = lmc_worker.lmcache_version()
    with open(os.path.join(out, f"conversation-{version}.txt"), "w") as f:
        f.write(f"# lmcache {version}: a real worker and `lmcache server` (record_frames.py)\n")
        for i, (direction, frames) in enumerate(proxy.log):
            f.write(direction + " " + " ".join(fr.hex() for fr in frames) + "\n")
            if direction == "req":
                name = op_name(frames[1])
                with open(os.path.join(out, "corpus", f"{version}-{i:02d}-{name}"), "wb") as c:
                    for fr in frames:
                        c.write(struct.pack("<I", len(fr)) + fr)
    # The whole session as one input of fuzz_lmc (messages ended by the length 0xffffffff).
    with open(os.path.join(out, "corpus", f"{version}-session"), "wb") as c:
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
