"""Predicted vs measured GPU memory for real architectures (random weights), on the live CUDA device.

    python -m benchmarks.budget_accuracy [--out results/h200/budget_accuracy.json]
    python -m benchmarks.budget_accuracy --repredict      # after a formula change: predictions only
    python -m benchmarks.budget_accuracy --merge NEW.json [NEW.json ...]   # later runs replace their points in --out

Rows: model, attention (sdpa | eager), seq_len, batch, weights_pred/meas, kv_pred/meas,
peak_pred/meas (bytes; peaks are over the weights, during ``generate`` with a dynamic bf16 cache),
the same peak split into the prefill (first forward) and decode (later forwards) phases (the decode
peak twice: in the tensors' bytes, ``decode_pred`` vs ``decode_requested``, and in the allocator's
blocks, ``decode_blocks_pred`` from the replay vs ``decode_meas``), the static-cache peak, and the device-level footprint smi_pred/smi_meas (NVML's per-process memory)
beside reserved_meas. Seventeen architectures by default (``helpers.budget_check.ARCHS``: the ten of
issue 16 and Gemma-3, OLMo-2, SmolLM3, Qwen3-MoE, GPT-OSS, Cohere2, Granite; ``--archs`` picks some,
e.g. ``--archs Gemma-3-1B OLMo-2-1B SmolLM3-3B Qwen3-30B-A3B gpt-oss-20b Command-R7B Granite-3.1-2B
--out results/h200/budget_accuracy_new.json``), six points each including 8192 × 2 (past 4096-token
sliding windows); a point that runs out of memory is recorded as such. ``--repredict`` recomputes
every ``*_pred`` field of ``--out`` from the current formulas on the CPU and leaves the measured
fields as they are. Targets (issues 16, 27), on every row: weights ≤ 0.5 %, KV exact, generation,
prefill and decode peaks ≤ 5 %, device-level footprint ≤ 5 %.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from helpers.budget_check import grid_points, merge_rows, predicted_vs_measured, repredict
from helpers.config import read_json
from helpers.models import ARCHITECTURES


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/h200/budget_accuracy.json")
    ap.add_argument("--repredict", action="store_true", help="only recompute the predictions in --out")
    ap.add_argument("--merge", nargs="+", default=None, help="recorded files whose rows replace their points in --out")
    ap.add_argument("--archs", nargs="*", default=None, help="architecture names (default: all of helpers.budget_check.ARCHS)")
    args = ap.parse_args()
    unknown = sorted(set(args.archs or []) - set(ARCHITECTURES))
    if unknown:
        ap.error(f"unknown architectures {unknown}; known: {sorted(ARCHITECTURES)}")
    if args.merge:
        out = Path(args.out)
        rows = read_json(out) if out.exists() else []
        for f in args.merge:
            rows = merge_rows(rows, read_json(f))
        out.write_text(json.dumps(rows, indent=1))
        print(f"{len(rows)} rows in {out}; run --repredict to recompute their predictions")
        return
    if args.repredict:
        for r in repredict(Path(args.out)):
            if not r.get("peak_meas"):       # an error or OOM row: nothing measured to compare with
                continue
            print(r["model"], r.get("attention", "sdpa"), r["seq_len"], r["batch"], f"peak {100 * (r['peak_pred'] / r['peak_meas'] - 1):+.2f}%",
                  f"decode {100 * (r['decode_blocks_pred'] / r['decode_meas'] - 1):+.2f}% (blocks)"
                  if r.get("decode_blocks_pred") else "")
        return
    if not torch.cuda.is_available():
        sys.exit("budget_accuracy needs a CUDA device (it measures real allocations)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    predicted_vs_measured(grid_points(args.archs) if args.archs else None, out=Path(args.out))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
