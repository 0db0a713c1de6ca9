"""Whole-model decode, measured: build an architecture in a weight format, then time prefill and
decode steps (a static KV cache; each decode step replayed as a CUDA graph, or eagerly).

Used by notebook 08 (a small live run) and ``benchmarks/decode.py`` (the 8B reference run).
Formats: ``bf16``; ``W4A16 ours`` (every decoder linear → :class:`helpers.w4_kernel.W4Linear`);
``W4A16 tinygemm`` (torchao's ``Int4WeightOnlyConfig``, tile-packed, the ``_weight_int4pack_mm`` kernel).
Random weights: speed and memory are real, the generated tokens mean nothing.
"""
from __future__ import annotations

import time

import torch

from . import models, timing, w4_kernel
from .cuda_graphs import GraphedCalls

FORMATS = ("bf16", "W4A16 ours", "W4A16 tinygemm")


def model_bytes(model) -> int:
    """Bytes of every parameter and buffer (packed buffers included)."""
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def tinygemm_config(group_size: int = 128):
    """torchao's int4 weight-only config on tinygemm (``_weight_int4pack_mm``), or None without torchao."""
    try:
        from torchao.quantization import Int4WeightOnlyConfig
    except ImportError:
        return None
    return Int4WeightOnlyConfig(group_size=group_size, int4_packing_format="tile_packed_to_4d")


def tinygemm_linear(w: torch.Tensor, group_size: int = 128):
    """A bias-free bf16 ``Linear`` holding ``w [N, K]``, quantized by torchao for tinygemm (None without torchao)."""
    config = tinygemm_config(group_size)
    if config is None:
        return None
    from torchao.quantization import quantize_
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=torch.bfloat16)
    lin.weight.data.copy_(w)
    quantize_(lin, config)
    return lin


def resident_bytes(model) -> int:
    """What the model occupies on the GPU, as the allocator counts it (a tensor subclass such as
    torchao's packed int4 weight reports its dense size through ``numel``; the allocator does not lie)."""
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def tune_shapes(arch: str, batches=(1,)) -> dict:
    """One kernel configuration per (linear shape, row tile) of ``arch``, measured on this GPU."""
    with torch.device("meta"):
        model = models.model_from_config(arch, device="meta")
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


def build(arch: str, fmt: str, tuned: dict | None = None):
    """``arch`` with random weights on the GPU, in format ``fmt`` (see :data:`FORMATS`); our kernel's
    configurations are tuned on this GPU unless ``tuned`` (from :func:`tune_shapes`) is given."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if fmt == "W4A16 ours" and not tuned:
        tuned = tune_shapes(arch)
    model = models.model_from_config(arch, device="cuda", dtype=torch.bfloat16).eval()
    if fmt == "W4A16 ours":
        w4_kernel.swap_linears(model, 128, tuned)
    elif fmt == "W4A16 tinygemm":
        from torchao.quantization import quantize_
        quantize_(model.model.layers, tinygemm_config(128))
    torch.cuda.empty_cache()
    return model


@torch.no_grad()
def run(model, batch: int, prompt: int, steps: int, graphs: bool) -> dict:
    from transformers import StaticCache
    cfg = model.config
    dev = next(model.parameters()).device
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cache = StaticCache(config=cfg, max_cache_len=prompt + steps + 8)
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device=dev)
    model(input_ids=ids[:, :16], use_cache=False, logits_to_keep=1)   # warm-up: library handles, autotuning
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
