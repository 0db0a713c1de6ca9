"""llama.cpp (the offline GGUF Q4_1 file) vs the course's transformers model, on this CPU.

    python -m benchmarks.gguf --out results/cpu/gguf.json

Perplexity on the course's evaluation windows (same token ids, same windows: helpers.evaluate.windows)
from llama.cpp's logits and from helpers.evaluate.perplexity (fp32), and greedy decode speed of both.
Needs the optional extra llama-cpp-python (helpers/gguf_run.py says how to build it).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

from helpers import course_model, evaluate, generation, gguf_run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=32 * 512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    bench = course_model.setup("offline", device="cpu")
    if not bench.quality_meaningful:
        sys.exit("needs the offline model and real text (set COURSE_WIKITEXT)")
    ours = evaluate.perplexity(bench.model, bench.eval_ids, seq_len=args.seq_len, max_tokens=args.tokens)
    with gguf_run.open_gguf(n_ctx=args.seq_len + 8, n_threads=args.threads) as llm:
        cpp = gguf_run.perplexity(llm, bench.eval_ids, seq_len=args.seq_len, max_tokens=args.tokens)
        cpp_speed = gguf_run.decode_speed(llm, bench.eval_ids[:128].tolist(), 64)
    ours_speed = generation.decode_speed(bench.model, bench.eval_ids[:128], 64)
    out = {"meta": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                    "torch": torch.__version__, "seq_len": args.seq_len, "tokens": args.tokens,
                    "llama_cpp_build": "llama-cpp-python 0.3.36, " + gguf_run.INSTALL.split(" pip")[0]},
           "rows": [{"engine": "llama.cpp GGUF Q4_1", **cpp, **cpp_speed},
                    {"engine": "ours: transformers fp32 (dequantized Q4_1)", **ours, **ours_speed}],
           "ppl_ratio": cpp["ppl"] / ours["ppl"]}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
