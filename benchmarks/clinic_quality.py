"""Notebook 09's quality claims on the real model, recorded (CPU): FP8 KV-cache scales (calibrated vs
1.0), RTN group size against perplexity, and perplexity against a copy task.

    python -m benchmarks.clinic_quality --out results/cpu/clinic_quality.json

Runs the course model with real weights on real text (the offline SmolLM2 and WikiText-2, or the hub
model) in the full profile; it refuses to write where the weights or the text are not real, since the
notebook shows these numbers where its own model is random (on the course's GPU machine).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from helpers import clinic, course_model, generation


def main():
    ap = argparse.ArgumentParser(prog="python -m benchmarks.clinic_quality")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=8192)
    args = ap.parse_args()
    os.environ.setdefault("COURSE_PROFILE", "full")
    t0 = time.perf_counter()
    bench = course_model.setup(device="cpu")
    if not bench.quality_meaningful:
        sys.exit("the model or the text is not real here (or the profile cuts the model): nothing to record")
    model, ids = bench.model, bench.eval_ids
    n_ctx, n_cont = 512, 128
    prompts = torch.stack([ids[i * 1000:i * 1000 + n_ctx] for i in range(4)])
    cont = torch.stack([ids[i * 1000 + n_ctx:i * 1000 + n_ctx + n_cont] for i in range(4)])
    out = {"meta": {"weights": "real", "model": bench.name, "tokens": args.max_tokens, "torch": torch.__version__,
                    "device": "cpu", "dtype": str(bench.dtype)}}
    out["case8"] = generation.kv_quality(model, prompts, cont, ["baseline", "fp8-e4m3", "fp8-e4m3-unit", "fp8-e5m2",
                                                                "fp8-e5m2-unit"])
    print("case 8 done", flush=True)
    out["groups"] = clinic.group_sweep(model, ids, max_tokens=args.max_tokens)
    print("groups done", flush=True)
    out["copy_task"] = clinic.task_drops(model, ids, max_tokens=args.max_tokens)
    out["meta"]["seconds"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(clinic.rankings(out["copy_task"]))
    print("wrote", args.out, f"({out['meta']['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
