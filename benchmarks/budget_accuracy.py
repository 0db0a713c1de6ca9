"""Predicted vs measured GPU memory for real architectures (random weights), on the live CUDA device.

    python benchmarks/budget_accuracy.py [--out results/h200/budget_accuracy.json]
    python benchmarks/budget_accuracy.py --repredict      # after a formula change: predictions only

Rows: model, seq_len, batch, weights_pred/meas, kv_pred/meas, peak_pred/meas (bytes; peaks are over
the weights, during ``generate`` with a dynamic bf16 cache), the same peak split into the prefill
(first forward) and decode (later forwards) phases, plus the static-cache peak.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import budget, measure, models  # noqa: E402

ARCHS = ["SmolLM2-135M", "Qwen2.5-0.5B", "TinyLlama-1.1B"]
GRID = [(512, 1), (2048, 1), (8192, 1), (512, 16), (2048, 8), (4096, 16)]
NEW_TOKENS = 32


def run(archs=ARCHS, grid=GRID, new_tokens=NEW_TOKENS, out: Path | None = None) -> list[dict]:
    rows = []
    workspace = measure.warmup_cublas()  # the first matmul's workspace is overhead, not activations
    for arch in archs:
        cfg = models.architecture_config(arch)
        model, w_meas = measure.measure_weights(arch)
        w_pred = budget.weight_allocation(cfg)          # formula bytes + simulated block rounding
        w_formula = budget.weight_bytes(cfg, "bf16")
        for seq, batch in grid:
            pred = budget.generation_peak(cfg, seq, new_tokens, batch)
            row = {"model": arch, "seq_len": seq, "batch": batch, "new_tokens": new_tokens,
                   "weights_pred": int(w_pred), "weights_meas": int(w_meas), "weights_formula": int(w_formula),
                   "cublas_workspace": workspace}
            m = measure.measure_generate(model, seq, batch, new_tokens, cache="baseline")
            row.update(kv_pred=int(pred["kv"]), kv_meas=int(m["kv_meas"]), peak_pred=int(pred["peak"]),
                       peak_meas=int(m["peak_meas"]), prefill_pred=int(pred["prefill"]),
                       decode_pred=int(pred["decode"]), prefill_meas=int(m["prefill_meas"]),
                       decode_meas=int(m["decode_meas"]))
            s = measure.measure_generate(model, seq, batch, new_tokens, cache="static")
            spred = budget.generation_peak(cfg, seq, new_tokens, batch, cache="static")
            row.update(static_kv_meas=int(s["kv_meas"]), static_peak_meas=int(s["peak_meas"]),
                       static_peak_pred=int(spred["peak"]))
            rows.append(row)
            if out:  # written after every point, so a cut-off run keeps what it measured
                out.write_text(json.dumps(rows, indent=1))
            print(f"{arch:<15}{seq:>6}{batch:>4}  w {100 * (w_pred / w_meas - 1):+.2f}%  "
                  f"kv {row['kv_pred'] - row['kv_meas']:+d} B  peak {100 * (row['peak_pred'] / row['peak_meas'] - 1):+.1f}%  "
                  f"prefill {100 * (row['prefill_pred'] / row['prefill_meas'] - 1):+.1f}%  "
                  f"decode {100 * (row['decode_pred'] / row['decode_meas'] - 1):+.1f}%  "
                  f"static {100 * (row['static_peak_pred'] / row['static_peak_meas'] - 1):+.1f}%", flush=True)
        del model
        measure.free_memory()
    return rows


def repredict(path: Path) -> list[dict]:
    """Recompute every ``*_pred`` field of a recorded file from the current formulas (CPU only; the
    measured fields are left as they were measured). Keeps a file honest after a formula changes."""
    rows = json.loads(path.read_text())
    for r in rows:
        cfg = models.architecture_config(r["model"])
        pred = budget.generation_peak(cfg, r["seq_len"], r["new_tokens"], r["batch"])
        spred = budget.generation_peak(cfg, r["seq_len"], r["new_tokens"], r["batch"], cache="static")
        r.update(weights_pred=int(budget.weight_allocation(cfg)), weights_formula=int(budget.weight_bytes(cfg, "bf16")),
                 kv_pred=int(pred["kv"]), peak_pred=int(pred["peak"]), prefill_pred=int(pred["prefill"]),
                 decode_pred=int(pred["decode"]), static_peak_pred=int(spred["peak"]))
    path.write_text(json.dumps(rows, indent=1))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/h200/budget_accuracy.json")
    ap.add_argument("--repredict", action="store_true", help="only recompute the predictions in --out")
    args = ap.parse_args()
    if args.repredict:
        for r in repredict(Path(args.out)):
            print(r["model"], r["seq_len"], r["batch"], f"peak {100 * (r['peak_pred'] / r['peak_meas'] - 1):+.2f}%",
                  f"decode {100 * (r['decode_pred'] / r['decode_meas'] - 1):+.2f}%")
        return
    if not torch.cuda.is_available():
        sys.exit("budget_accuracy needs a CUDA device (it measures real allocations)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run(out=Path(args.out))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
