"""Predicted against measured: the memory budget's formulas checked on real ``generate`` calls.

Notebook 01 runs a few points on the learner's GPU; ``benchmarks/budget_accuracy.py`` runs the full
grid on the H200 and writes ``results/h200/budget_accuracy.json``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from . import budget, budget_detail, generation, host_alloc, measure, models
from .config import read_json

ARCHS = ["SmolLM2-135M", "Qwen2.5-0.5B", "TinyLlama-1.1B",          # the course's first three
         "Llama-3.2-1B", "Qwen3-1.7B", "Gemma-2-2B", "Mistral-7B", "Phi-3-mini",   # issue 16's families
         "Qwen1.5-MoE-A2.7B", "DeepSeek-V2-Lite",
         "Gemma-3-1B", "OLMo-2-1B", "SmolLM3-3B", "Qwen3-30B-A3B", "gpt-oss-20b",  # issue 27's families
         "Command-R7B", "Granite-3.1-2B"]
GRID = [(512, 1), (2048, 1), (8192, 1), (512, 16), (2048, 8), (8192, 2)]   # 8192 × 2: past 4096-token windows
ATTENTION = ("sdpa", "eager")
NEW_TOKENS = 32


def predicted_vs_measured(archs=ARCHS, grid=GRID, new_tokens=NEW_TOKENS, out: Path | None = None,
                          echo: bool = True, attentions=ATTENTION) -> list[dict]:
    """For each architecture (random weights, bf16, on CUDA), attention implementation and (seq_len,
    batch) point: predicted and measured weights, KV cache, generation peaks (prefill, decode, whole;
    dynamic and static cache) and the device-level footprint (``smi_pred`` from
    :func:`helpers.budget_detail.device_footprint`: the non-torch memory measured after a warm-up generate of
    the same model plus the simulated reserved memory ``reserved_pred``; ``smi_meas`` from NVML's
    per-process memory, beside ``reserved_meas``). ``out`` is rewritten after every point, so a cut-off run keeps what it measured;
    a point that runs out of memory is recorded as such (``oom``), not raised, and so is an attention
    implementation a model does not have (GPT-OSS has no SDPA path) or weights that do not fit
    (``error``, one row for the architecture and attention)."""
    rows = []
    context = measure.overhead()["context"]          # before anything is allocated: the CUDA context
    workspace = measure.warmup_cublas()  # the first matmul's workspace is overhead, not activations
    for arch in archs:
        cfg = models.architecture_config(arch)
        for attention in attentions:
            try:
                model, w_meas = generation.measure_weights(arch, attn_implementation=attention)
                # a short generate loads the kernels this model and attention use; what the process then
                # holds outside the allocator is the non-torch part of the nvidia-smi prediction
                generation.measure_generate(model, 64, 1, 2)
            except Exception as e:  # no such attention implementation, or the weights do not fit: a row, not a stop
                rows.append({"model": arch, "attention": attention, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                model = None
                measure.free_memory()
                if out:
                    out.write_text(json.dumps(rows, indent=1))
                if echo:
                    print(f"{arch:<18}{attention:>6}  ERROR {rows[-1]['error']}", flush=True)
                continue
            non_torch = measure.non_torch_bytes()
            w_pred = budget_detail.weight_allocation(cfg)   # formula bytes + simulated block rounding
            w_formula = budget.weight_bytes(cfg, "bf16")
            for seq, batch in grid:
                try:
                    rows.append(_point(model, cfg, arch, attention, seq, batch, new_tokens, context, workspace,
                                       w_pred, w_meas, w_formula, non_torch))
                except Exception as e:  # transformers itself failing at a point is a finding: record it, go on
                    rows.append({"model": arch, "attention": attention, "seq_len": seq, "batch": batch,
                                 "error": f"{type(e).__name__}: {str(e)[:300]}"})
                    measure.free_memory()
                if out:  # written after every point, so a cut-off run keeps what it measured
                    out.write_text(json.dumps(rows, indent=1))
                if echo:
                    _echo(rows[-1])
            del model
            measure.free_memory()
    return rows


def _point(model, cfg, arch, attention, seq, batch, new_tokens, context, workspace, w_pred, w_meas, w_formula,
           non_torch) -> dict:
    row = {"model": arch, "attention": attention, "seq_len": seq, "batch": batch, "new_tokens": new_tokens,
           "weights_pred": int(w_pred), "weights_meas": int(w_meas), "weights_formula": int(w_formula),
           "cublas_workspace": workspace, "context": context}
    pred = budget.generation_peak(cfg, seq, new_tokens, batch, attention=attention)
    r = measure.oom_guard(generation.measure_generate, model, seq, batch, new_tokens, cache="baseline")
    if not r["ok"]:
        return {**row, "oom": True, "peak_pred": int(pred["peak"])}
    m = r["result"]
    foot = budget_detail.device_footprint(cfg, seq, new_tokens, batch, non_torch or 0, attention,
                                          workspace_bytes=workspace)
    row.update(kv_pred=int(pred["kv"]), kv_meas=int(m["kv_meas"]), peak_pred=int(pred["peak"]),
               peak_meas=int(m["peak_meas"]), prefill_pred=int(pred["prefill"]), decode_pred=int(pred["decode"]),
               prefill_meas=int(m["prefill_meas"]), decode_meas=int(m["decode_meas"]),
               reserved_meas=int(m["reserved"]), reserved_pred=int(foot["reserved"]), non_torch=non_torch,
               smi_pred=int(foot["total"]) if non_torch is not None else None, smi_meas=m.get("process_gpu_bytes"),
               new_tokens_generated=int(m["new_tokens"]))
    s = measure.oom_guard(generation.measure_generate, model, seq, batch, new_tokens, cache="static")
    spred = budget.generation_peak(cfg, seq, new_tokens, batch, cache="static", attention=attention)
    if s["ok"]:
        row.update(static_kv_meas=int(s["result"]["kv_meas"]), static_peak_meas=int(s["result"]["peak_meas"]),
                   static_peak_pred=int(spred["peak"]))
    return row


def _echo(row: dict) -> None:
    head = f"{row['model']:<18}{row['attention']:>6}{row['seq_len']:>6}{row['batch']:>4}"
    if row.get("error"):
        print(f"{head}  ERROR {row['error']}", flush=True)
        return
    if row.get("oom"):
        print(f"{head}  OOM (predicted peak {row['peak_pred'] / 2**30:.1f} GiB over the weights)", flush=True)
        return
    pct = lambda a, b: f"{100 * (row[a] / row[b] - 1):+.1f}%" if row.get(a) is not None and row.get(b) else "n/a"
    print(f"{head}  w {pct('weights_pred', 'weights_meas')}  kv {row['kv_pred'] - row['kv_meas']:+d} B  "
          f"peak {pct('peak_pred', 'peak_meas')}  prefill {pct('prefill_pred', 'prefill_meas')}  "
          f"decode {pct('decode_pred', 'decode_meas')}  reserved {pct('reserved_pred', 'reserved_meas')}  "
          f"smi {pct('smi_pred', 'smi_meas')}", flush=True)


def cpu_prefill_peak(model, positions: int, batch: int, seed: int = 0) -> int:
    """Measured on a CPU: the peak of live tensor bytes (:mod:`helpers.host_alloc`) during one prefill
    forward of ``batch × positions`` random token ids that keeps only the last logits, as ``generate``
    does — what :func:`helpers.budget.activation_bytes` predicts (``device="cpu"``)."""
    ids = torch.randint(3, model.config.vocab_size - 1, (batch, positions),
                        generator=torch.Generator().manual_seed(seed))
    return host_alloc.peak_bytes(lambda: model(ids, use_cache=False, logits_to_keep=1).logits)["peak"]


def repredict(path: Path) -> list[dict]:
    """Recompute every ``*_pred`` field of a recorded file from the current formulas (CPU only; the
    measured fields are left as they were measured). Keeps a file honest after a formula changes."""
    rows = read_json(path)
    for r in rows:
        if "error" in r:             # nothing was measured: nothing to predict against
            continue
        cfg = models.architecture_config(r["model"])
        attention = r.get("attention", "sdpa")     # rows recorded before the attention key were SDPA runs
        pred = budget.generation_peak(cfg, r["seq_len"], r["new_tokens"], r["batch"], attention=attention)
        spred = budget.generation_peak(cfg, r["seq_len"], r["new_tokens"], r["batch"], cache="static",
                                       attention=attention)
        r.update(weights_pred=int(budget_detail.weight_allocation(cfg)),
                 weights_formula=int(budget.weight_bytes(cfg, "bf16")),
                 kv_pred=int(pred["kv"]), peak_pred=int(pred["peak"]), prefill_pred=int(pred["prefill"]),
                 decode_pred=int(pred["decode"]), static_peak_pred=int(spred["peak"]))
        if "reserved_meas" in r:
            foot = budget_detail.device_footprint(cfg, r["seq_len"], r["new_tokens"], r["batch"], r.get("non_torch") or 0,
                                                  attention, workspace_bytes=r.get("cublas_workspace") or 0)
            r.update(reserved_pred=int(foot["reserved"]),
                     smi_pred=int(foot["total"]) if r.get("non_torch") is not None else None)
    path.write_text(json.dumps(rows, indent=1))
    return rows
