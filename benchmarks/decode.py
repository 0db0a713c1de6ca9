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
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import budget, models, timing, w4_kernel  # noqa: E402
from helpers.cuda_graphs import GraphedCalls  # noqa: E402


def model_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def build(arch: str, fmt: str, tuned: dict):
    model = models.model_from_config(arch, device="cuda", dtype=torch.bfloat16).eval()
    if fmt == "W4A16 ours":
        w4_kernel.swap_linears(model, 128, tuned)
    elif fmt == "W4A16 tinygemm":
        from torchao.quantization import Int4WeightOnlyConfig, quantize_
        quantize_(model.model.layers, Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d"))
    torch.cuda.empty_cache()
    return model


def tune_shapes(model, batches) -> dict:
    """One kernel configuration per (linear shape, row tile), measured on this GPU."""
    shapes = sorted({(m.out_features, m.in_features) for n, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and "lm_head" not in n})
    out = {}
    for n, k in shapes:
        p = w4_kernel.pack_w4(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02, 128)
        out[(n, k)] = {}
        for rows in sorted({w4_kernel.block_rows(b) for b in batches} | {64}):
            x = torch.randn(max(rows, 1), k, device="cuda", dtype=torch.bfloat16)
            cfg, ms = w4_kernel.tuned_config(x, p, lambda fn: timing.gpu_ms(fn, iters=10, warmup=2))
            out[(n, k)][rows] = cfg
            print(f"tuned {n}x{k} rows {rows}: {cfg} {ms:.4f} ms", flush=True)
    return out


@torch.no_grad()
def run(model, batch: int, prompt: int, steps: int, graphs: bool) -> dict:
    from transformers import StaticCache
    cfg = model.config
    dev = next(model.parameters()).device
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cache = StaticCache(config=cfg, max_cache_len=prompt + steps + 8)
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device=dev)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    out = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(prompt, device=dev),
                logits_to_keep=1, use_cache=True)
    sync()
    prefill_s = time.perf_counter() - t
    tok = out.logits[:, -1:].argmax(-1)

    def step(tok, pos):
        return (model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits[:, -1],)
    fn = GraphedCalls(step) if graphs else step
    pos = torch.tensor([prompt], device=dev)
    for _ in range(3):                     # warm-up (captures the graph)
        logits, = fn(tok, pos)
    sync()
    t = time.perf_counter()
    for i in range(steps):
        logits, = fn(tok, pos + i)
        tok = logits.argmax(-1, keepdim=True)
    sync()
    decode_s = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() if cuda else None
    if graphs:
        fn.close()
    return {"prefill_tok_s": batch * prompt / prefill_s, "decode_tok_s": batch * steps / decode_s,
            "decode_ms_per_step": decode_s / steps * 1e3, "peak_bytes": peak}


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
            probe = models.model_from_config(args.arch, device="meta", dtype=torch.bfloat16)
            tuned = tune_shapes(probe, batches)
            del probe
        try:
            model = build(args.arch, fmt, tuned)
        except Exception as e:  # noqa: BLE001 - record what could not be built (e.g. torchao missing)
            rows.append({"model": args.arch, "format": fmt, "error": f"{type(e).__name__}: {e}"})
            print(fmt, "failed:", e, flush=True)
            continue
        wbytes = model_bytes(model)
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
