"""Predicted against measured: the memory budget's formulas checked on real ``generate`` calls.

Notebook 01 runs a few points on the learner's GPU; ``benchmarks/budget_accuracy.py`` runs the full
grid on the H200 and writes ``results/h200/budget_accuracy.json``.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import budget, generation, measure, models
from .config import read_json

ARCHS = ["SmolLM2-135M", "Qwen2.5-0.5B", "TinyLlama-1.1B"]
GRID = [(512, 1), (2048, 1), (8192, 1), (512, 16), (2048, 8), (4096, 16)]
NEW_TOKENS = 32


def predicted_vs_measured(archs=ARCHS, grid=GRID, new_tokens=NEW_TOKENS, out: Path | None = None,
                          echo: bool = True) -> list[dict]:
    """For each architecture (random weights, bf16, on CUDA) and (seq_len, batch) point: predicted and
    measured weights, KV cache, and generation peaks (prefill, decode, whole; dynamic and static
    cache). ``out`` is rewritten after every point, so a cut-off run keeps what it measured."""
    rows = []
    workspace = measure.warmup_cublas()  # the first matmul's workspace is overhead, not activations
    for arch in archs:
        cfg = models.architecture_config(arch)
        model, w_meas = generation.measure_weights(arch)
        w_pred = budget.weight_allocation(cfg)          # formula bytes + simulated block rounding
        w_formula = budget.weight_bytes(cfg, "bf16")
        for seq, batch in grid:
            pred = budget.generation_peak(cfg, seq, new_tokens, batch)
            row = {"model": arch, "seq_len": seq, "batch": batch, "new_tokens": new_tokens,
                   "weights_pred": int(w_pred), "weights_meas": int(w_meas), "weights_formula": int(w_formula),
                   "cublas_workspace": workspace}
            m = generation.measure_generate(model, seq, batch, new_tokens, cache="baseline")
            row.update(kv_pred=int(pred["kv"]), kv_meas=int(m["kv_meas"]), peak_pred=int(pred["peak"]),
                       peak_meas=int(m["peak_meas"]), prefill_pred=int(pred["prefill"]),
                       decode_pred=int(pred["decode"]), prefill_meas=int(m["prefill_meas"]),
                       decode_meas=int(m["decode_meas"]))
            s = generation.measure_generate(model, seq, batch, new_tokens, cache="static")
            spred = budget.generation_peak(cfg, seq, new_tokens, batch, cache="static")
            row.update(static_kv_meas=int(s["kv_meas"]), static_peak_meas=int(s["peak_meas"]),
                       static_peak_pred=int(spred["peak"]))
            rows.append(row)
            if out:  # written after every point, so a cut-off run keeps what it measured
                out.write_text(json.dumps(rows, indent=1))
            if echo:
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
    rows = read_json(path)
    for r in rows:
        cfg = models.architecture_config(r["model"])
        pred = budget.generation_peak(cfg, r["seq_len"], r["new_tokens"], r["batch"])
        spred = budget.generation_peak(cfg, r["seq_len"], r["new_tokens"], r["batch"], cache="static")
        r.update(weights_pred=int(budget.weight_allocation(cfg)), weights_formula=int(budget.weight_bytes(cfg, "bf16")),
                 kv_pred=int(pred["kv"]), peak_pred=int(pred["peak"]), prefill_pred=int(pred["prefill"]),
                 decode_pred=int(pred["decode"]), static_peak_pred=int(spred["peak"]))
    path.write_text(json.dumps(rows, indent=1))
    return rows
