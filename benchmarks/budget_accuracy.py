"""Predicted vs measured GPU memory for real architectures (random weights), on the live CUDA device.

    python benchmarks/budget_accuracy.py [--out results/h200/budget_accuracy.json]
    python benchmarks/budget_accuracy.py --repredict      # after a formula change: predictions only

Rows: model, attention (sdpa | eager), seq_len, batch, weights_pred/meas, kv_pred/meas,
peak_pred/meas (bytes; peaks are over the weights, during ``generate`` with a dynamic bf16 cache),
the same peak split into the prefill (first forward) and decode (later forwards) phases, the
static-cache peak, and the device-level footprint smi_pred/smi_meas (NVML's per-process memory)
beside reserved_meas. Ten architectures by default (``helpers.budget_check.ARCHS``; ``--archs`` picks
some), six points each including 8192 × 2 (past 4096-token sliding windows). Targets (issue 16), on
every row: weights ≤ 0.5 %, KV exact, generation peak ≤ 5 %, device-level footprint ≤ 5 %.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers.budget_check import predicted_vs_measured, repredict  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/h200/budget_accuracy.json")
    ap.add_argument("--repredict", action="store_true", help="only recompute the predictions in --out")
    ap.add_argument("--archs", nargs="*", default=None, help="architecture names (default: all ten)")
    args = ap.parse_args()
    if args.repredict:
        for r in repredict(Path(args.out)):
            print(r["model"], r.get("attention", "sdpa"), r["seq_len"], r["batch"], f"peak {100 * (r['peak_pred'] / r['peak_meas'] - 1):+.2f}%",
                  f"decode {100 * (r['decode_pred'] / r['decode_meas'] - 1):+.2f}%")
        return
    if not torch.cuda.is_available():
        sys.exit("budget_accuracy needs a CUDA device (it measures real allocations)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    kw = {"archs": args.archs} if args.archs else {}
    predicted_vs_measured(out=Path(args.out), **kw)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
