"""One vLLM engine in a process of its own, driven by test_vllm.py.

Usage (the python of the vLLM environment, scripts/vllm-env.sh):
    python tests/vllm/engine.py MODEL_DIR [KV_TRANSFER_CONFIG_JSON]

It builds vLLM's offline engine (`vllm.LLM`) on MODEL_DIR, with LMCache's connector when a
kv-transfer-config is given, then reads requests from stdin, one JSON object per line:
    {"prompt": [token ids], "max_tokens": n}
and answers each with one JSON line on its standard output:
    {"tokens": [greedy tokens], "num_cached_tokens": n, "external_hits": n,
     "external_queries": n, "seconds": t}
where external_hits and external_queries are what vLLM's own counters
vllm:external_prefix_cache_hits and vllm:external_prefix_cache_queries (the connector's hits
and queries, in tokens) gained during the request. The first line, once the engine is built, is
{"ready": true}. End of input ends the process. Everything vLLM, LMCache and torch print goes
to standard error: standard output carries nothing but the answers.

The engine is what a user runs (the engine core and its worker in processes of their own), with
what keeps it small and deterministic here: eager mode, float32, a short max_model_len, no
tokenizer (prompts are token ids), greedy sampling.
"""

import json
import os
import sys
import time
import traceback

# Answers go to a private copy of the standard output; fd 1 becomes standard error, for vLLM's
# logs and for the processes it starts, which inherit it.
ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

MAX_MODEL_LEN = 2048


def counter(llm, name):
    """The sum of one of vLLM's counters over its labels (0 when it is not reported)."""
    return sum(int(m.value) for m in llm.get_metrics() if m.name == name)


def main():
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model = sys.argv[1]
    kw = dict(model=model, skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
              max_model_len=MAX_MODEL_LEN, disable_log_stats=False, seed=0)
    if len(sys.argv) > 2:
        kw["kv_transfer_config"] = json.loads(sys.argv[2])
    llm = LLM(**kw)
    ANSWERS.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        hits = counter(llm, "vllm:external_prefix_cache_hits")
        queries = counter(llm, "vllm:external_prefix_cache_queries")
        params = SamplingParams(temperature=0, max_tokens=req["max_tokens"], detokenize=False)
        t0 = time.monotonic()
        out = llm.generate([TokensPrompt(prompt_token_ids=req["prompt"])], params,
                           use_tqdm=False)[0]
        seconds = time.monotonic() - t0
        ANSWERS.write(json.dumps({
            "tokens": list(out.outputs[0].token_ids),
            "num_cached_tokens": out.num_cached_tokens or 0,
            "external_hits": counter(llm, "vllm:external_prefix_cache_hits") - hits,
            "external_queries": counter(llm, "vllm:external_prefix_cache_queries") - queries,
            "seconds": round(seconds, 3),
        }) + "\n")


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        # vLLM's threads can keep a failed process alive (an engine that did not start does
        # not exit): the test learns of the failure at once, from the exit status and the log.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
