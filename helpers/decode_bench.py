"""Whole-model decode, measured: build an architecture in a weight format, then time prefill and
decode steps (a static KV cache; each decode step replayed as a CUDA graph, or eagerly).

Used by notebook 08 (a small live run) and ``benchmarks/decode.py`` (the 8B reference run).
Formats: ``bf16``; ``W4A16 ours`` (every decoder linear → :class:`helpers.w4_linear.W4Linear`);
``W4A16 tinygemm`` (torchao's ``Int4WeightOnlyConfig``, tile-packed, the ``_weight_int4pack_mm`` kernel).
Random weights: speed and memory are real, the generated tokens mean nothing.
"""
from __future__ import annotations

import time

import torch

from . import models, w4_linear
from .cuda_graphs import GraphedCalls
from .data import random_ids
from .measure import PeakMeter

FORMATS = ("bf16", "W4A16 ours", "W4A16 tinygemm")
CATEGORIES = {  # kernel-name fragments → what a decode step spends its time on
    "weight matmuls": ("gemm", "gemv", "w4a16", "int4", "tinygemm", "cutlass", "nvjet", "sm90_xmma", "matmul"),
    "attention": ("flash", "fmha", "attention", "sdpa", "efficient"),
    "copies and fills": ("memcpy", "memset", "copy_", "fill_", "cat"),
}


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
    return None if config is None else torchao_linear(w, config)


def torchao_linear(w: torch.Tensor, config) -> torch.nn.Module:
    """A bias-free bf16 ``Linear`` holding ``w [N, K]``, quantized in place by torchao with ``config``."""
    from torchao.quantization import quantize_
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=torch.bfloat16)
    lin.weight.data.copy_(w)
    quantize_(lin, config)
    return lin


def fp8_rowwise(w: torch.Tensor):
    """W8A8 FP8 e4m3 with a scale per weight row and per activation row (``torch._scaled_mm``):
    ``(run, weight bytes)``; ``run(x)`` quantizes the activations then multiplies, and
    ``run.matmul_only(x)`` returns a call that only multiplies (activations already FP8)."""
    ws = w.abs().amax(1, keepdim=True).float().clamp(min=1e-12) / 448.0
    wq = (w.float() / ws).to(torch.float8_e4m3fn)

    def quant(x):
        xs = x.abs().amax(1, keepdim=True).float().clamp(min=1e-12) / 448.0
        return (x.float() / xs).to(torch.float8_e4m3fn), xs

    def run(x):
        xq, xs = quant(x)
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)

    def matmul_only(x):
        xq, xs = quant(x)
        return lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)
    run.matmul_only = matmul_only
    return run, wq.numel() + ws.numel() * 4


def resident_bytes(model) -> int:
    """What the model occupies on the GPU, as the allocator counts it (a tensor subclass such as
    torchao's packed int4 weight reports its dense size through ``numel``; the allocator does not lie)."""
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def build(arch: str, fmt: str, tuned: dict | None = None, group_size: int = 128, family: dict | None = None):
    """``arch`` with random weights on the GPU, in format ``fmt`` (see :data:`FORMATS`); our kernel runs
    the configs of ``tuned`` (``{(N, K): {row tile: config}}``, e.g. from :func:`helpers.w4_kernel.tuned_config`)
    where given, else
    :func:`helpers.w4_kernel.auto_config`'s, chosen from each shape (with ``family``'s kernel family)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    model = models.model_from_config(arch, device="cuda", dtype=torch.bfloat16).eval()
    if fmt == "W4A16 ours":
        w4_linear.swap_linears(model, group_size, tuned, family=family)
    elif fmt == "W4A16 tinygemm":
        from torchao.quantization import quantize_
        quantize_(model.model.layers, tinygemm_config(group_size))
    torch.cuda.empty_cache()
    return model


def kernel_category(name: str) -> str:
    """Which part of a decode step a CUDA kernel belongs to, from its name (:data:`CATEGORIES`; the
    rest — norms, rotary embeddings, activations, sampling — is "elementwise and norms")."""
    low = name.lower()
    for cat, keys in CATEGORIES.items():
        if any(k in low for k in keys):
            return cat
    return "elementwise and norms"


@torch.no_grad()
def step_profile(model, batch: int, prompt: int) -> dict:
    """Where one eager decode step's GPU time goes: device microseconds per :func:`kernel_category`
    (``torch.profiler``), the kernel count, and the step's wall time; wall − Σ kernels is the launch
    gaps a CUDA graph removes."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import StaticCache
    cfg, dev = model.config, next(model.parameters()).device
    cache = StaticCache(config=cfg, max_cache_len=prompt + 16)
    ids = random_ids(cfg.vocab_size, (batch, prompt), device=dev)
    model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(prompt, device=dev), logits_to_keep=1)
    tok, pos = ids[:, -1:], torch.tensor([prompt], device=dev)
    for i in range(3):
        model(input_ids=tok, past_key_values=cache, cache_position=pos + i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        model(input_ids=tok, past_key_values=cache, cache_position=pos + 3)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    out = {c: 0.0 for c in (*CATEGORIES, "elementwise and norms")}
    n = 0
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0
        if getattr(getattr(e, "device_type", None), "name", "") == "CUDA" and t > 0:
            out[kernel_category(e.key)] += t
            n += e.count
    return {"us": out, "kernels": n, "wall_us": wall * 1e6, "kernel_us": sum(out.values())}


@torch.no_grad()
def run(model, batch: int, prompt: int, steps: int, graphs: bool, compiled: bool = False) -> dict:
    """Prefill then ``steps`` decode steps of ``batch`` sequences; each step replayed as a CUDA graph
    (``graphs``) and/or ``torch.compile``d first (``compiled``: inductor fuses the norms, rotary
    embeddings, activations and cache updates between the matmuls; compiled during the warm-up)."""
    from transformers import StaticCache
    cfg = model.config
    dev = next(model.parameters()).device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    cache = StaticCache(config=cfg, max_cache_len=prompt + steps + 8)
    ids = random_ids(cfg.vocab_size, (batch, prompt), device=dev)
    # warm-up at the timed prefill's own shape: library handles, kernel choice and autotuning for those
    # rows happen here, not inside the timed call
    model(input_ids=ids, use_cache=False, logits_to_keep=1)
    sync()
    with PeakMeter(dev) as meter:
        t = time.perf_counter()
        out = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(prompt, device=dev),
                    logits_to_keep=1, use_cache=True)
        sync()
        prefill_s = time.perf_counter() - t
        tok = out.logits[:, -1:].argmax(-1)

        def step(tok, pos):
            return (model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits[:, -1],)
        if compiled:
            step = torch.compile(step, dynamic=False)
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
    peak = None if meter.peak is None else meter.base + meter.peak     # weights and cache included
    if graphs:
        fn.close()
    return {"prefill_tok_s": batch * prompt / prefill_s, "decode_tok_s": batch * steps / decode_s,
            "decode_ms_per_step": decode_s / steps * 1e3, "peak_bytes": peak}
