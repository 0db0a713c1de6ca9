"""The KV-cache A/B test over several context lengths.

    python -m benchmarks.kv_ab --out results/h200/kv_ab.json      # CUDA: architecture from config
    python -m benchmarks.kv_ab --out results/cpu/kv_ab.json       # CPU: the offline real model

On CUDA the model is SmolLM2-135M's architecture with random weights (the offline weights cannot
travel to the GPU machine): bytes, peaks and speed are real; agreement/KL then only says the cache
reproduces the same computation, not that a trained model keeps its quality. On CPU the real
(offline) model and real text give the quality numbers.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from helpers import data, generation, models
from helpers.config import write_json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", default="SmolLM2-135M")
    ap.add_argument("--contexts", default=None, help="comma-separated context lengths")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    contexts = [int(c) for c in (args.contexts or ("1024,4096,16384,32768" if cuda else "256,1024")).split(",")]
    batch = args.batch or (8 if cuda else 1)
    if cuda:
        model = models.model_from_config(args.arch, device="cuda", dtype=torch.bfloat16)
        source = f"{args.arch} architecture, random weights, bf16, CUDA"
        stream = None
    else:
        model, tok = models.load_model("offline", dtype=torch.float32, device="cpu", echo=False)
        source = "offline SmolLM2-135M-Instruct (dequantized Q4_1), fp32, CPU, WikiText-2 eval text"
        stream = data.tokens(tok, "eval")
    rows = []
    for ctx in contexts:
        if stream is None:
            prompts = data.random_ids(model.config.vocab_size, (batch, ctx), seed=ctx, device="cuda")
        else:
            prompts = torch.stack([stream[i * ctx:(i + 1) * ctx] for i in range(batch)])
        for r in generation.kv_ab(model, prompts, args.new_tokens):
            r.update(source=source, new_tokens=args.new_tokens,
                     torch=torch.__version__, gpu=torch.cuda.get_device_name() if cuda else "cpu")
            rows.append(r)
            write_json(Path(args.out), rows)
            print({k: r[k] for k in ("kv_format", "context", "kv_bytes", "peak", "tokens_per_s", "top1_agreement", "mean_kl")}, flush=True)
    write_json(Path(args.out), rows)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
