"""Whole-model decode, measured: build an architecture in a weight format, then time prefill and
decode steps (a static KV cache; each decode step replayed as a CUDA graph, or eagerly).

Used by notebook 08 (a small live run) and ``benchmarks/decode.py`` (the 8B reference run).
Formats: ``bf16``; ``W4A16 ours`` (every decoder linear → :class:`helpers.w4_linear.W4Linear`);
``W4A16 tinygemm`` (torchao's ``Int4WeightOnlyConfig``, tile-packed, the ``_weight_int4pack_mm`` kernel).
A :class:`Recipe` adds what engines do around the kernel: fused projections, a quantized LM head,
split-KV decode attention.
Random weights: speed and memory are real, the generated tokens mean nothing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from . import decode_attention, models, w4_linear
from .cuda_graphs import GraphedCalls
from .data import random_ids
from .measure import PeakMeter, module_bytes

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


def bytes_read_per_step(model) -> int:
    """Weight bytes one decode step reads: the model's own tensors (:func:`helpers.measure.module_bytes`:
    each storage once, a torchao subclass by what it packs) less the input embedding table, of which a
    step reads one row per token — unless the LM head shares it (tied), which reads all of it."""
    emb = model.get_input_embeddings().weight
    tied = getattr(model.get_output_embeddings(), "weight", None) is emb    # a quantized head has no .weight
    return module_bytes(model) - (0 if tied else emb.untyped_storage().nbytes())


@dataclass(frozen=True)
class Recipe:
    """What an engine does around its matmul kernel, one switch per step measured (``benchmarks/decode.py``):

    * ``fused``: q|k|v one projection and gate|up another (:func:`fused_projections`) — fewer, larger
      matmuls per layer: vLLM's ``QKVParallelLinear`` and ``MergedColumnParallelLinear``, gpt-fast's ``wqkv``;
    * ``head``: the LM head in the weight format too (every ``nn.Linear``: gpt-fast's int4
      ``WeightOnlyInt4QuantHandler``, torchao's ``quantize_`` on the whole model); the 16-bit format
      ignores it;
    * ``attn``: the decode step's attention by the split-KV kernel (:mod:`helpers.decode_attention`:
      Flash-Decoding, the static cache's empty positions masked) instead of transformers' SDPA call."""
    fused: bool = False
    head: bool = False
    attn: bool = False

    SWITCHES = ("fused", "head", "attn")

    @property
    def label(self) -> str:
        return "+".join(name for name in self.SWITCHES if getattr(self, name)) or "plain"

    @classmethod
    def parse(cls, text: str) -> Recipe:
        """``"plain"`` or switches joined by ``+`` (``"fused+head+attn"``: the :attr:`label` format)."""
        parts = set(str(text).split("+")) - {"plain"}
        unknown = parts - set(cls.SWITCHES)
        if unknown or not str(text):
            raise ValueError(f"recipe must be 'plain' or '+'-joined switches from {list(cls.SWITCHES)}, got {text!r}")
        return cls(**{name: name in parts for name in cls.SWITCHES})


def fused_projections(model) -> torch.nn.Module:
    """The same Llama- or Mistral-architecture decoder with ``q|k|v`` as one projection and ``gate|up`` as
    another: transformers' Phi-3 classes, whose ``Phi3Attention`` slices one ``qkv_proj`` output into q, k
    and v and whose ``Phi3MLP`` chunks one ``gate_up_proj`` output (``modeling_phi3.py``), holding the
    weights concatenated along the output dimension; Mistral's ``sliding_window`` is Phi-3's too (both
    pass it to the attention and choose the sliding-window mask by it). It computes the same function
    (tested); each layer runs 4 matmuls instead of 7. The source model's tensors are copied (it can be
    deleted after)."""
    from transformers import AutoModelForCausalLM, Phi3Config
    from transformers.initialization import no_init_weights
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if cfg.model_type not in ("llama", "mistral") or getattr(cfg, "attention_bias", False) \
            or getattr(cfg, "mlp_bias", False) or cfg.hidden_act != "silu" \
            or head_dim != cfg.hidden_size // cfg.num_attention_heads:
        raise ValueError("fused_projections takes a Llama- or Mistral-architecture model (model_type 'llama' or "
                         "'mistral', no biases, SiLU, head_dim = hidden_size / heads); got model_type "
                         f"{cfg.model_type!r}")
    rope = dict(cfg.rope_parameters or {})
    if rope.get("rope_type", "default") != "default":   # Phi3Config accepts 'default' and 'longrope' only
        raise ValueError(f"fused_projections keeps the rotary embedding as Phi-3's classes compute it: rope_type "
                         f"'default' only, got {rope.get('rope_type')!r} (a speed run can use the default rope: "
                         "the rotary tables cost the same)")
    phi = Phi3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                     num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                     num_key_value_heads=cfg.num_key_value_heads, hidden_act="silu",
                     max_position_embeddings=cfg.max_position_embeddings,
                     original_max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
                     tie_word_embeddings=cfg.tie_word_embeddings, rope_parameters=rope,
                     sliding_window=getattr(cfg, "sliding_window", None),
                     bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id)
    phi._attn_implementation = cfg._attn_implementation
    weight = next(model.parameters())
    # built in the source's dtype and device with no random init: every tensor is overwritten below
    with torch.device(weight.device), no_init_weights():
        fused = AutoModelForCausalLM.from_config(phi, dtype=weight.dtype).eval()   # Phi3ForCausalLM
    source, state = model.state_dict(), {}
    for name, t in source.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name or ".mlp.up_proj." in name:
            continue                                  # joined with their q / gate below
        if ".self_attn.q_proj." in name:
            pre = name.split(".self_attn.")[0] + ".self_attn."
            state[pre + "qkv_proj.weight"] = torch.cat([source[pre + f"{p}_proj.weight"] for p in "qkv"])
        elif ".mlp.gate_proj." in name:
            pre = name.split(".mlp.")[0] + ".mlp."
            state[pre + "gate_up_proj.weight"] = torch.cat([t, source[pre + "up_proj.weight"]])
        else:
            state[name] = t
    fused.load_state_dict(state, strict=True)
    return fused


def build(arch: str, fmt: str, tuned: dict | None = None, group_size: int = 128, family: dict | None = None,
          recipe: Recipe = Recipe()):
    """``arch`` with random weights on the GPU, in format ``fmt`` (see :data:`FORMATS`) with ``recipe``'s
    steps around the kernel (:class:`Recipe`); our kernel runs the configs of ``tuned``
    (``{(N, K): {row tile: config}}``, e.g. from :func:`helpers.w4_kernel.tuned_config`) where given, else
    :func:`helpers.w4_kernel.auto_config`'s, chosen from each shape (with ``family``'s kernel family)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a decode_bench.Recipe (e.g. Recipe.parse('fused+head')), got {recipe!r}")
    model = models.model_from_config(arch, device="cuda", dtype=torch.bfloat16).eval()
    if recipe.fused:
        model = fused_projections(model)
        torch.cuda.empty_cache()
    if recipe.attn:
        decode_attention.use(model)
    if fmt == "W4A16 ours":
        w4_linear.swap_linears(model, group_size, tuned, family=family, skip=() if recipe.head else ("lm_head",))
    elif fmt == "W4A16 tinygemm":
        from torchao.quantization import quantize_
        quantize_(model if recipe.head else model.model.layers, tinygemm_config(group_size))
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
def step_profile(model, batch: int, prompt: int, compiled: bool = False, top_n: int = 12) -> dict:
    """Where one decode step's GPU time goes: device microseconds per :func:`kernel_category`
    (``torch.profiler``), the kernel count, the step's wall time (wall − Σ kernels is the launch gaps a
    CUDA graph removes) and the ``top_n`` kernels by time, named. ``compiled``: the step ``torch.compile``d first, as :func:`run`'s
    ``compiled`` rows run it (inductor's fused kernels are what a graph of that step replays)."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import StaticCache
    cfg, dev = model.config, next(model.parameters()).device
    cache = StaticCache(config=cfg, max_cache_len=prompt + 16)
    ids = random_ids(cfg.vocab_size, (batch, prompt), device=dev)
    model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(prompt, device=dev), logits_to_keep=1)
    tok, pos = ids[:, -1:], torch.tensor([prompt], device=dev)

    def step(tok, pos):
        return model(input_ids=tok, past_key_values=cache, cache_position=pos).logits
    if compiled:
        step = torch.compile(step, dynamic=False)
    for i in range(3):
        step(tok, pos + i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        step(tok, pos + 3)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    out = {c: 0.0 for c in (*CATEGORIES, "elementwise and norms")}
    n, kernels = 0, []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0
        if getattr(getattr(e, "device_type", None), "name", "") == "CUDA" and t > 0:
            out[kernel_category(e.key)] += t
            n += e.count
            kernels.append({"kernel": e.key[:120], "category": kernel_category(e.key), "us": t, "calls": e.count})
    top = sorted(kernels, key=lambda r: -r["us"])[:top_n]
    return {"us": out, "kernels": n, "wall_us": wall * 1e6, "kernel_us": sum(out.values()), "top": top}


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
