"""Whole-model decode and prefill speed per weight format, against the bandwidth roofline (CUDA).

    python benchmarks/decode.py --out results/h200/decode.json

An 8B-class architecture (Llama-3.1-8B's config, random weights: speed and memory are real, the
tokens mean nothing) in bf16, W4A16 with our Triton kernel (helpers/w4_kernel.py) and W4A16 with
tinygemm (torchao). Per batch: prefill tokens/s (one forward over ``batch × prompt`` tokens) and
decode tokens/s (``batch`` tokens per step, a static KV cache), each decode step replayed as a CUDA
graph (helpers/cuda_graphs.py) and once eagerly (``graphs: false``: the launch overhead).
``roofline_tok_s = batch · copy bandwidth / (weight bytes + batch · KV bytes at mid-decode)``: every
step must read all weights once and each sequence's KV cache.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import budget, models, timing  # noqa: E402
from helpers.decode_bench import build, resident_bytes, run, tune_shapes  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", default="Llama-3.1-8B")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--formats", default="bf16,W4A16 ours,W4A16 tinygemm")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode.py measures CUDA decode; there is no CUDA device here")
    batches = [int(b) for b in args.batches.split(",")]
    copy = timing.copy_bandwidth_gbps()
    config = models.architecture_config(args.arch)
    rows, tuned = [], {}
    for fmt in args.formats.split(","):
        if fmt == "W4A16 ours" and not tuned:
            tuned = tune_shapes(args.arch, batches)
        try:
            model = build(args.arch, fmt, tuned)
        except Exception as e:  # noqa: BLE001 - record what could not be built (e.g. torchao missing)
            rows.append({"model": args.arch, "format": fmt, "error": f"{type(e).__name__}: {e}"})
            print(fmt, "failed:", e, flush=True)
            continue
        wbytes = resident_bytes(model)
        for batch in batches:
            kv_mid = budget.kv_bytes(config, args.prompt + args.steps // 2, 1, "bf16")
            roof = batch * timing.roofline_tokens_per_s(wbytes, copy, batch * kv_mid) if batch else 0
            for graphs in (True, False):
                if not graphs and batch != batches[0]:
                    continue
                try:
                    r = run(model, batch, args.prompt, args.steps, graphs)
                except Exception as e:  # noqa: BLE001 - e.g. a capture that transformers' code breaks
                    r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                row = {"model": f"{args.arch} (random weights)", "format": fmt, "batch": batch, "graphs": graphs,
                       "weights_bytes": wbytes, "roofline_tok_s": roof, "prompt": args.prompt, "steps": args.steps, **r}
                if "decode_tok_s" in r:
                    row["share_of_roofline"] = r["decode_tok_s"] / roof
                rows.append(row)
                print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        del model
        torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_GBps": copy,
            "tuned_configs": {f"{n}x{k}": v for (n, k), v in tuned.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
