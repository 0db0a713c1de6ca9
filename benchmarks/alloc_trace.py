"""The real allocation sequence of one ``generate``, recorded by PyTorch's memory history, beside the
sequence :func:`helpers.budget_replay.generation_ops` assumes: where the reserved-memory prediction comes from,
and, where it misses, which blocks it misses (issue 16's device-level footprint).

    python -m benchmarks.alloc_trace --arch Llama-3.2-1B --layers 2 --seq 2048 --batch 2 --out results/h200/alloc_trace.json

Writes per attention implementation: the allocator events of the call (``alloc``/``free_completed``
with size and the innermost transformers/torch Python frame), the reserved bytes measured and
simulated from the recorded events and from ``generation_ops``. CUDA only.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from helpers import budget_replay, generation, measure, models
from helpers.allocator_sim import simulate


def frame(entry) -> str:
    """The innermost frame of an event from transformers or the course (what made the allocation)."""
    for f in entry.get("frames", []):
        name = f.get("filename", "")
        if "transformers" in name or "helpers" in name:
            return f"{name.split('site-packages/')[-1]}:{f.get('line')} {f.get('name')}"
    return ""


def trace(model, seq: int, batch: int, new_tokens: int) -> dict:
    measure.free_memory()
    base_reserved = torch.cuda.memory_reserved()
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    try:
        m = generation.measure_generate(model, seq, batch, new_tokens)
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for dev in snap["device_traces"] for e in dev if e["action"] in ("alloc", "free_completed")]
    ops, live, out = [], {}, []
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = f"t{i}"
            ops.append(["alloc", f"t{i}", e["size"]])
        elif e["addr"] in live:
            ops.append(["free", live.pop(e["addr"])])
        out.append({"action": e["action"], "size": e["size"], "frame": frame(e)})
    return {"events": out, "reserved_meas_over_start": m["reserved"] - base_reserved,
            "reserved_sim_from_events": simulate(ops)["reserved"], "peak_meas": m["peak_meas"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="Llama-3.2-1B")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--out", default="results/h200/alloc_trace.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("alloc_trace needs a CUDA device")
    rows = []
    for attention in ("sdpa", "eager"):
        model = models.model_from_config(args.arch, device="cuda", dtype=torch.bfloat16, attn_implementation=attention)
        models.keep_first_layers(model, args.layers)
        measure.free_memory()
        generation.measure_generate(model, 64, 1, 2)          # kernels loaded, workspaces allocated
        r = trace(model, args.seq, args.batch, args.new_tokens)
        cfg = model.config
        w_ops = budget_replay.weight_ops(cfg)
        pred = simulate(budget_replay.generation_ops(cfg, args.seq, args.new_tokens, args.batch, attention))["reserved"]
        r.update(arch=args.arch, layers=args.layers, attention=attention, seq_len=args.seq, batch=args.batch,
                 new_tokens=args.new_tokens, reserved_pred_over_weights=pred - simulate(w_ops)["reserved"])
        rows.append(r)
        print({k: v for k, v in r.items() if k != "events"}, flush=True)
        del model
        measure.free_memory()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
