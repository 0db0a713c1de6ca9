"""KV-cache formats' quality on the real offline model (CPU): teacher-forced on WikiText continuations.

    python -m benchmarks.kv_quality --out results/cpu/kv_quality.json

Rows: kv_format, context, batch, continuation, top1_agreement, mean_kl (vs the baseline cache), ppl
(of the true continuation), weights = "real". Quality needs real weights: the H200 A/B
(results/h200/kv_ab.json) ran with random weights and serves bytes, speed and OOM points only.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from helpers import data, generation, models


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="256,1024,2048")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--continuation", type=int, default=64)
    args = ap.parse_args()
    model, tok = models.load_model("offline", dtype=torch.float32, device="cpu", echo=False)
    stream = data.tokens(tok, "eval")
    rows, out = [], Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for ctx in [int(c) for c in args.contexts.split(",")]:
        span = ctx + args.continuation
        windows = torch.stack([stream[i * span:(i + 1) * span] for i in range(args.batch)])
        for r in generation.kv_quality(model, windows[:, :ctx], windows[:, ctx:]):
            r.update(weights="real", model="SmolLM2-135M-Instruct (offline, dequantized Q4_1), fp32",
                     device=f"cpu ({platform.machine()})", torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
            rows.append(r)
            out.write_text(json.dumps(rows, indent=1))
            print({k: r[k] for k in ("kv_format", "context", "top1_agreement", "mean_kl", "ppl")}, flush=True)
    print("wrote", out)


if __name__ == "__main__":
    main()
