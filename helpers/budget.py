"""GPU memory budget of a decoder LLM, from its config alone: weights, KV cache, activations, overhead.

Formulas (b = bytes per element; the notebook 01 derives each one):

* **weights** — ``params × bits_per_weight / 8``. Grouped integer formats add a scale (and a zero
  point) per group: ``bpw = b + (16 + z)/g`` (see :func:`helpers.quant.bits_per_weight`). As in
  GPTQ/AWQ checkpoints, only the decoder's linear layers are quantized; embeddings, norms and
  ``lm_head`` stay in 16 bits.
* **KV cache** — ``2 · layers · kv_heads · head_dim · seq_len · batch · b_kv`` (K and V for every
  layer and token). MHA has ``kv_heads = heads``, GQA fewer, MQA one.
* **activations** — the transient tensors of one decoder block at the widest point of a forward
  pass over ``positions`` tokens (the prefill): the residual stream, then the larger of the attention
  and MLP temporaries, plus the logits (``batch × positions × vocab × 4`` when every position is
  kept, ``batch × vocab × 4`` when only the last is, as ``generate`` does). Eager attention adds the
  score matrix ``batch · heads · positions² · b`` (twice: scores and softmax); SDPA's fused kernels
  do not materialise it.
* **overhead** — CUDA context and allocator slack: measured at run time (``measure.overhead``),
  never guessed; this module takes it as an argument.

Sources: Kwon et al. 2023 (vLLM/PagedAttention) for the KV formula; Korthikanti et al. 2022 for
activation accounting; the ``accelerate estimate-memory`` command for weights from a meta model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

from .allocator_sim import simulate
from .quant import bits_per_weight

GiB = 1024**3
GB = 1e9

# bits per element of each storage format. Grouped formats: (bits, group, symmetric).
WEIGHT_FORMATS = {
    "fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8,
    "int8": (8, None, True),       # per-channel int8 (LLM.int8 / W8A16): per-row scale, negligible
    "int4": (4, 128, False),       # GPTQ/AWQ default: g128 asymmetric, fp16 scale + 4-bit zero
    "int4-g64": (4, 64, False),
    "int3": (3, 128, False),
    "int3-g64": (3, 64, False),
}
KV_FORMATS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
GPUS_GB = {"T4": 16, "L4": 24, "RTX 4090": 24, "A100-40GB": 40, "A100-80GB": 80, "H100-80GB": 80,
           "H200": 141}


def format_bits(fmt: str) -> float:
    """Exact bits per weight of a weight format name (see :data:`WEIGHT_FORMATS`)."""
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; use one of {sorted(WEIGHT_FORMATS)}")
    spec = WEIGHT_FORMATS[fmt]
    if isinstance(spec, tuple):
        bits, group, sym = spec
        return bits_per_weight(bits, group, symmetric=sym)
    return float(spec)


def dtype_bytes(fmt) -> float:
    """Bytes per element of a KV/activation format name or torch dtype."""
    if isinstance(fmt, torch.dtype):
        return torch.empty(0, dtype=fmt).element_size()
    if fmt in KV_FORMATS:
        return KV_FORMATS[fmt] / 8
    raise ValueError(f"unknown dtype {fmt!r}; use one of {sorted(KV_FORMATS)} or a torch.dtype")


@dataclass
class Shape:
    """The numbers of a config that memory depends on (read from a transformers config)."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool = False

    @classmethod
    def from_config(cls, config) -> Shape:
        need = ["num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"]
        missing = [k for k in need if getattr(config, k, None) is None]
        if missing:
            raise ValueError(f"config lacks {missing}: budget() needs a decoder config "
                             "(Llama/Qwen2/Mistral style)")
        heads = config.num_attention_heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size, heads, kv,
                   head_dim, config.vocab_size, bool(getattr(config, "tie_word_embeddings", False)),
                   getattr(config, "model_type", "") in ("qwen2", "qwen2_moe"))


FAMILIES = {  # model_type → what its decoder layer holds beyond the Llama layout
    "llama": {}, "mistral": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True}, "phi3": {"fused": True},
    "gemma": {}, "gemma2": {"sandwich_norms": True}, "gemma3_text": {"sandwich_norms": True, "qk_norm": True},
    "mixtral": {"moe": "mixtral"}, "qwen2_moe": {"qkv_bias": True, "moe": "qwen2_moe"},
    "qwen3_moe": {"qk_norm": True, "moe": "qwen3_moe"}, "deepseek_v2": {"mla": True, "moe": "deepseek"},
}


def _family(config) -> dict:
    mt = getattr(config, "model_type", "")
    if mt not in FAMILIES:
        raise ValueError(f"param_counts does not know model_type {mt!r} (known: {sorted(FAMILIES)}): count it "
                         "with budget.meta_param_count(config) instead of trusting a guess")
    return FAMILIES[mt]


def _attention_params(config, s: Shape, fam: dict) -> int:
    """One layer's attention parameters (projections, biases, q/k norms; MLA's low-rank factors)."""
    h, H = s.hidden, s.heads
    if fam.get("mla"):  # DeepSeek-V2 multi-head latent attention (arXiv:2405.04434, §2.1)
        rope, nope, v = config.qk_rope_head_dim, config.qk_nope_head_dim, config.v_head_dim
        r_kv, r_q = config.kv_lora_rank, getattr(config, "q_lora_rank", None)
        q = h * H * (nope + rope) if not r_q else h * r_q + r_q + r_q * H * (nope + rope)
        return q + h * (r_kv + rope) + r_kv + r_kv * H * (nope + v) + H * v * h
    attn = h * H * s.head_dim * 2 + h * s.kv_heads * s.head_dim * 2
    if fam.get("qkv_bias"):
        attn += (H + 2 * s.kv_heads) * s.head_dim
    elif getattr(config, "attention_bias", False):
        attn += (H + 2 * s.kv_heads) * s.head_dim + h
    if fam.get("qk_norm"):
        attn += 2 * s.head_dim
    return attn


def _mlp_params(config, s: Shape, fam: dict, layer: int) -> int:
    """One layer's MLP: dense SwiGLU ``3·h·I``, or a mixture of experts (every expert's weights, the
    router, shared experts) — all experts are resident, only ``num_experts_per_tok`` run per token."""
    h, moe = s.hidden, fam.get("moe")
    dense = 3 * h * s.intermediate + (2 * s.intermediate + h if getattr(config, "mlp_bias", False) else 0)
    if moe == "mixtral":
        return config.num_local_experts * 3 * h * s.intermediate + h * config.num_local_experts
    if moe in ("qwen2_moe", "qwen3_moe"):
        sparse = layer not in (getattr(config, "mlp_only_layers", None) or []) and \
            (layer + 1) % getattr(config, "decoder_sparse_step", 1) == 0
        if not sparse:
            return dense
        shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
        return (config.num_experts * 3 * h * config.moe_intermediate_size + h * config.num_experts
                + (3 * h * shared + h if shared else 0))
    if moe == "deepseek":
        if layer < config.first_k_dense_replace:
            return dense
        shared = (config.n_shared_experts or 0) * config.moe_intermediate_size
        return (config.n_routed_experts * 3 * h * config.moe_intermediate_size + h * config.n_routed_experts
                + 3 * h * shared)
    return dense


def param_counts(config) -> dict:
    """Parameters by part: embeddings, decoder linears (attention + MLP/experts, biases included),
    norms, lm_head — for the families in :data:`FAMILIES` (Llama, Mistral, Qwen2/3, Phi-3, Gemma 1-3,
    Mixtral, Qwen-MoE, DeepSeek-V2). Another ``model_type`` raises: count it on the meta device."""
    fam = _family(config)
    s = Shape.from_config(config)
    attn = _attention_params(config, s, fam)
    linears = sum(attn + _mlp_params(config, s, fam, i) for i in range(s.layers))
    norms = s.layers * (4 if fam.get("sandwich_norms") else 2) * s.hidden + s.hidden
    embed = s.vocab * s.hidden
    head = 0 if s.tied else s.vocab * s.hidden
    return {"embed": embed, "linears": linears, "norms": norms, "lm_head": head,
            "total": embed + linears + norms + head}


def meta_param_count(config) -> int:
    """Parameters of the real transformers architecture built on the meta device (no memory)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def weight_allocation(config, dtype=torch.bfloat16) -> int:
    """Predicted ``memory_allocated`` after instantiating the model on a GPU: every parameter and
    buffer (from a meta-device model, in creation order) replayed through the caching-allocator
    simulator, which adds the block rounding the real allocator applies (a block whose remainder
    would be ≤ 1 MiB is handed out whole)."""
    return simulate(weight_ops(config, dtype))["allocated"]


def weight_ops(config, dtype=torch.bfloat16) -> list:
    """The allocations instantiating the model makes: every parameter and buffer of a meta-device
    model, in creation order, as allocator-simulator ops (``["alloc", name, bytes]``)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return [["alloc", name, t.numel() * t.element_size()]
            for name, t in list(model.named_parameters()) + list(model.named_buffers())]


def weight_bytes(config, fmt: str = "bf16") -> float:
    """Weights in bytes: decoder linears at ``fmt``, the rest at 16 bits (32 if ``fmt='fp32'``)."""
    p = param_counts(config)
    rest_bits = 32 if fmt == "fp32" else 16
    rest = p["embed"] + p["norms"] + p["lm_head"]
    return (p["linears"] * format_bits(fmt) + rest * rest_bits) / 8


def layer_windows(config) -> list[int | None]:
    """Each layer's attention window: ``None`` for full attention, ``sliding_window`` for a sliding
    layer. From ``config.layer_types`` where the config has it (Gemma-2/3's interleaved local/global
    layers, Qwen2's ``max_window_layers``), otherwise every layer slides when ``sliding_window`` is
    set (Mistral) unless ``use_sliding_window`` is False."""
    n, w = config.num_hidden_layers, getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        unknown = set(types) - {"full_attention", "sliding_attention"}
        if unknown:
            raise ValueError(f"layer types {sorted(unknown)} are not modelled (full_attention and "
                             "sliding_attention are)")
        return [w if t == "sliding_attention" else None for t in types]
    if w and getattr(config, "use_sliding_window", True) is not False:
        return [w] * n
    return [None] * n


def kv_positions(config, tokens: int, cache: str = "dynamic") -> list[int]:
    """Positions each layer's KV cache holds after ``tokens`` tokens. A full-attention layer holds
    all of them; a sliding layer in transformers' ``DynamicCache`` keeps the last ``window − 1`` (all
    a later query can attend to besides itself), a ``StaticCache`` allocates ``min(window, length)``."""
    if cache not in ("dynamic", "static"):
        raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
    keep = (lambda w: w - 1) if cache == "dynamic" else (lambda w: w)
    return [tokens if w is None else min(tokens, keep(w)) for w in layer_windows(config)]


def kv_storage_positions(config, prompt_len: int, steps: int = 0) -> list[int]:
    """Positions each layer's K (or V) *storage* holds in transformers' ``DynamicCache`` after the
    prefill of ``prompt_len`` tokens and ``steps`` one-token decode steps. A sliding layer keeps its
    last ``window − 1`` positions as a **view** of the tensor ``torch.cat`` just made
    (``full[:, :, -window + 1:, :]``, ``DynamicSlidingWindowLayer.update``), so after the prefill the
    whole prompt's storage stays alive; each decode step's ``torch.cat`` makes a new tensor of
    ``min(prompt_len + steps, window)`` positions and lets the old one go. Full-attention layers hold
    every position. (:func:`kv_positions` is what the cache *exposes*; this is what it *occupies*.)"""
    _check_positive(prompt_len=prompt_len)
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int ≥ 0 (decode steps after the prefill), got {steps!r}")
    return [prompt_len + steps if w is None or steps == 0 else min(prompt_len + steps, w)
            for w in layer_windows(config)]


def kv_position_bytes(config, kv_dtype="bf16") -> float:
    """Bytes of one position's K and V in one layer for batch 1 (16-bit or fp32 plain formats):
    ``2 · kv_heads · head_dim · b``, or ``(kv_lora_rank + qk_rope_head_dim) · b`` with multi-head
    latent attention (DeepSeek-V2, arXiv:2405.04434 §2.1.2)."""
    s = Shape.from_config(config)
    fam = FAMILIES.get(getattr(config, "model_type", ""), {})
    per_position = config.kv_lora_rank + config.qk_rope_head_dim if fam.get("mla") else 2 * s.kv_heads * s.head_dim
    return per_position * dtype_bytes(kv_dtype)


def kv_bytes(config, seq_len: int, batch: int = 1, kv_dtype="bf16", group_size: int = 64,
             residual_tokens: int = 0, residual_dtype="bf16", cache: str = "dynamic") -> float:
    """KV cache bytes, as the caches really store them (transformers' for the plain formats, the
    course's :mod:`helpers.kvcache` for fp8/int4).

    * plain formats: ``Σ_layers positions_l · 2 · kv_heads · head_dim · batch · b``, with
      ``positions_l`` from :func:`kv_positions` (sliding-window layers hold at most their window);
      multi-head latent attention (DeepSeek-V2) stores ``kv_lora_rank + qk_rope_head_dim`` values per
      position and layer instead of ``2 · kv_heads · head_dim`` (arXiv:2405.04434, §2.1.2);
    * ``"fp8"``: 1-byte codes plus one fp32 scale per layer, KV head and K/V
      (``+ 2 · layers · kv_heads · 4``);
    * ``"int4"``: two codes per byte plus an fp16 scale and an fp16 minimum per ``group_size`` values
      of each token's head (``head_dim/2 + 4·head_dim/g`` bytes per token and head), except the
      ``residual_tokens`` most recent tokens, kept in ``residual_dtype`` (the KIVI-style residual of
      transformers' ``QuantizedLayer``; :func:`int4_residual_tokens` says how many).
    The course's fp8 and int4 layers keep every position (they do not evict outside a window)."""
    _check_positive(seq_len=seq_len, batch=batch)
    s = Shape.from_config(config)
    heads = 2 * s.layers * s.kv_heads
    if kv_dtype == "int4":
        if not isinstance(residual_tokens, int) or not 0 <= residual_tokens <= seq_len:
            raise ValueError(f"residual_tokens must be an int in [0, seq_len={seq_len}], got {residual_tokens!r}")
        g = group_size if s.head_dim % group_size == 0 else s.head_dim
        per_token = s.head_dim / 2 + (s.head_dim // g) * 4
        quantized = seq_len - residual_tokens
        return heads * batch * (quantized * per_token + residual_tokens * s.head_dim * dtype_bytes(residual_dtype))
    if kv_dtype == "fp8":
        return heads * s.head_dim * seq_len * batch * dtype_bytes("fp8") + heads * 4
    return sum(kv_positions(config, seq_len, cache)) * kv_position_bytes(config, kv_dtype) * batch


def int4_residual_tokens(decode_steps: int, residual_length: int = 16) -> int:
    """Tokens in full precision in transformers' ``QuantizedLayer`` after a prefill and
    ``decode_steps`` single-token steps: the residual is re-quantized whenever it would reach
    ``residual_length`` tokens, so it holds ``decode_steps mod residual_length``."""
    return decode_steps % residual_length


def eager_score_bytes(act_dtype="bf16", device: str = "cuda") -> float:
    """Bytes per element of the ``batch × heads × q × k`` score matrix at eager attention's widest point.

    transformers' ``eager_attention_forward`` computes ``softmax(q·kᵀ·s + mask, dtype=float32).to(dtype)``.
    ATen's ``softmax(x, dtype=float32)`` fuses the up-cast only for fp16 on CUDA (``half_to_float``);
    otherwise it first copies ``x`` to fp32 and then writes a new fp32 result (``SoftMax.cpp``). So at
    the softmax, live at once: the ``b``-byte scores + the fp32 copy + the fp32 output = ``b + 8``
    (bf16 anywhere, fp16 on a CPU); fused fp16 on CUDA: ``b + 4``, then ``b`` more for ``.to(dtype)``
    = 8; fp32: input and output only = 8. (Measured on CPU by :mod:`helpers.host_alloc`:
    tests/test_budget_measured.py.)"""
    b = dtype_bytes(act_dtype)
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if b == 4:
        return 8.0
    if b == 2 and device == "cuda" and act_dtype in ("fp16", torch.float16):
        return 8.0
    return b + 8.0


def _has_dense_mlp(config, fam: dict) -> bool:
    """Whether any layer runs a dense MLP of ``intermediate_size`` (every layer of a dense model; the
    first ``first_k_dense_replace`` of DeepSeek; Qwen-MoE's ``mlp_only_layers``)."""
    moe = fam.get("moe")
    if not moe:
        return True
    if moe == "deepseek":
        return config.first_k_dense_replace > 0
    if moe in ("qwen2_moe", "qwen3_moe"):
        return bool(getattr(config, "mlp_only_layers", None)) or getattr(config, "decoder_sparse_step", 1) > 1
    return False


def _moe_bytes(config, fam: dict, n: int, b: float) -> float:
    """A mixture-of-experts block at its widest (transformers' ``grouped_mm`` experts), with ``k``
    experts per token, expert width ``I`` and ``n`` tokens, the larger of two stages:

    * up: the normed input ``h``, the ``k·h`` gathered token copies and the ``k·2I`` gate|up
      projection twice over (``masked_fill`` writes a new copy) — ``h + k·h + 4·k·I`` elements per
      token — plus the shared expert's ``h``-wide output where there is one (Qwen-MoE, DeepSeek);
    * down: the input and shared ``h``, the gathered copies and the down projection's ``k·h`` (each
      ``b`` bytes), then the output weighted by the routing weights and its copy put back in token
      order — ``k·h`` each, in the routing weights' dtype: fp32 in Mixtral's and DeepSeek-V2's routers
      (the product is promoted), the model's dtype in Qwen-MoE's (cast back).

    Measured on CPU (:mod:`helpers.host_alloc`) for Mixtral, Qwen2-MoE and DeepSeek-V2 shapes; at
    DeepSeek-V2-Lite's real widths the down stage is the peak (tests/test_budget_measured.py)."""
    moe = fam.get("moe")
    if not moe:
        return 0
    k, h = config.num_experts_per_tok, config.hidden_size
    width = config.intermediate_size if moe == "mixtral" else config.moe_intermediate_size
    shared = 0 if moe == "mixtral" else h
    w = 4 if moe in ("mixtral", "deepseek") else b       # bytes of a routing weight
    up = (h + k * h + 4 * k * width + shared) * b
    down = (h + shared) * b + k * h * 2 * b + k * h * 2 * w
    return n * max(up, down)


def moe_decode_gather_bytes(config, batch: int = 1, act_dtype="bf16") -> float:
    """Transient bytes of one mixture-of-experts layer in a GPU decode step. On a non-CPU device
    ``generate`` switches the experts from ``grouped_mm`` to ``batched_mm`` for the decoding stage
    (transformers ``GenerationMixin._optimize_model_for_decode``: "trade off a bit of memory (by
    duplicating selected experts weights) for much better speed"), which *gathers* every selected
    expert's weights per token: with ``k`` experts per token of width ``I`` over ``h``, the gate|up
    copy ``k·2I·h`` is still bound while the down copy ``k·I·h`` is made, so per token
    ``k·(3·I·h + h + 3·I)`` elements (the weights, the gathered input, the projections). 0 for a
    dense model. About 99 MiB per sequence for DeepSeek-V2-Lite in bf16 — at batch 16 more than its
    whole KV cache at 512 tokens."""
    _check_positive(batch=batch)
    fam = FAMILIES.get(getattr(config, "model_type", ""), {})
    moe = fam.get("moe")
    if not moe:
        return 0
    k, h = config.num_experts_per_tok, config.hidden_size
    width = config.intermediate_size if moe == "mixtral" else config.moe_intermediate_size
    return batch * k * (3 * width * h + h + 3 * width) * dtype_bytes(act_dtype)


def activation_bytes(config, positions: int, batch: int = 1, act_dtype="bf16", attention: str = "sdpa",
                     keep_all_logits: bool = False, device: str = "cuda") -> dict:
    """Transient bytes at the widest point of one forward over ``positions`` tokens.

    Per block, with ``n = batch · positions`` tokens and ``b`` bytes per element:
    hidden-size tensors ``3·n·hidden·b`` that stay alive across the block (the embeddings, still
    referenced by the model's forward; the block's input, held by the caller's loop; the residual
    sum), the rotary ``cos``/``sin`` ``2·n·head_dim·b`` shared by all layers, then the larger of
    MLP ``n·(3·intermediate + hidden)·b`` (gate/up/product live at once, plus the normed input;
    ``4·intermediate`` where gate and up come out of one fused projection, Phi-3) and attention
    (a fused ``qkv_proj``, Phi-3, keeps its output alive beside the rotated q and k):

    * SDPA (fused kernels never hold the scores): ``n·(2·heads + 2·kv_heads)·head_dim·b`` (q, k, v,
      attention output);
    * eager, at its softmax: q, k, v ``n·(heads + 2·kv_heads)·head_dim·b``, the K and V repeated to
      every query head when ``kv_heads < heads`` (``repeat_kv``: ``2·n·heads·head_dim·b``), the scores
      ``batch·heads·positions²`` × :func:`eager_score_bytes`; and, alive beside the MLP too, the
      additive masks the model built once for the whole forward (``batch·positions²·b`` per kind of
      layer, full and sliding) and the layer's returned attention weights (``batch·heads·positions²·b``,
      bound to ``_`` in the decoder layer until it returns).

    Logits: ``batch·vocab·(b + 4)`` for the last position (model output + fp32 copy in generate),
    or ``batch·positions·vocab·(b + 4)`` when all positions are kept (training, perplexity).
    Checked against measurement: the H200 (``results/h200/budget_accuracy.json``) and, without a GPU,
    the CPU allocation tracker on ten model families (tests/test_budget_measured.py).
    """
    _check_positive(positions=positions, batch=batch)
    if attention not in ("sdpa", "eager"):
        raise ValueError(f"attention must be 'sdpa' or 'eager' (the implementations budget models), got {attention!r}")
    s = Shape.from_config(config)
    fam = FAMILIES.get(getattr(config, "model_type", ""), {})
    fused = fam.get("fused", False)
    b = dtype_bytes(act_dtype)
    n = batch * positions
    rope_dim = config.qk_rope_head_dim if fam.get("mla") else s.head_dim
    residual = 3 * n * s.hidden * b + 2 * n * rope_dim * b
    mlp = max(n * ((4 if fused else 3) * s.intermediate + s.hidden) * b if _has_dense_mlp(config, fam) else 0,
              _moe_bytes(config, fam, n, b))
    if fam.get("mla"):   # multi-head latent attention (arXiv:2405.04434 §2.1), as transformers computes it
        qk_dim, v_dim, rope = config.qk_nope_head_dim + config.qk_rope_head_dim, config.v_head_dim, config.qk_rope_head_dim
        r = config.kv_lora_rank
        # per token: q_proj's output (its q_nope view keeps it), the rotated q_pe, the query cat; the
        # latent (r + rope) and its normed copy r, the rotated k_pe; kv_b_proj's per-head output
        # (k_nope, v are views of it) and the key cat
        qkv = n * (s.heads * qk_dim + s.heads * rope + s.heads * qk_dim + (r + rope) + r + rope
                   + s.heads * (config.qk_nope_head_dim + v_dim) + s.heads * qk_dim) * b
        out, qk, repeated = n * s.heads * v_dim * b, 0, 0
    else:
        qkv = n * (s.heads + 2 * s.kv_heads) * s.head_dim * b
        qk = qkv - n * s.kv_heads * s.head_dim * b if fused else 0  # rotated q, k beside the fused output
        out = n * s.heads * s.head_dim * b
        repeated = 2 * n * s.heads * s.head_dim * b if s.kv_heads < s.heads else 0
    if attention == "sdpa":
        attn = qkv + qk + out
    else:
        # the masks live through the whole forward; the layer keeps the returned attention weights
        # (``hidden_states, _ = self.self_attn(...)``: ``_`` holds them) while its MLP runs
        residual += len({w is None for w in layer_windows(config)}) * batch * positions**2 * b
        mlp += batch * s.heads * positions**2 * b
        scores = batch * s.heads * positions**2 * eager_score_bytes(act_dtype, device)
        attn = qkv + qk + repeated + scores
    logits = batch * (positions if keep_all_logits else 1) * s.vocab * (b + 4)
    block = residual + max(mlp, attn)
    return {"residual": residual, "mlp": mlp, "attention": attn, "logits": logits,
            "peak": max(block, residual + logits)}


def generation_peak(config, prompt_len: int, new_tokens: int, batch: int = 1, act_dtype="bf16",
                    kv_dtype="bf16", cache: str = "dynamic", attention: str = "sdpa", device: str = "cuda") -> dict:
    """Predicted peak memory *over the weights* during ``generate`` (prefill, then decode).

    prefill: the KV storage of the prompt + the prefill activations; decode ends with the KV of
    ``prompt_len + new_tokens − 1`` positions (the last generated token is never fed back) plus one
    layer's K being re-allocated by ``torch.cat`` (dynamic cache), the last-token logits, and the
    previous step's fp32 logits ``batch·vocab·4`` that generate's loop still holds while the next
    forward runs. With sliding-window layers the dynamic cache's *storage* is the whole prompt until
    the first decode step copies the window out (:func:`kv_storage_positions`): the prefill and the
    first decode step hold the unwindowed prompt KV, later steps only the windows. A static cache
    allocates ``prompt_len + new_tokens`` positions up front. On a GPU a mixture-of-experts decode
    step also holds the gathered expert weights of :func:`moe_decode_gather_bytes`. ``kv`` is what
    the cache exposes (:func:`kv_bytes`).
    ``attention`` (``"sdpa"`` or ``"eager"``) is the model's ``attn_implementation``: eager's scores
    dominate the prefill (:func:`activation_bytes`); a decode step's ``batch·heads·positions`` scores
    are small next to the KV cache and are not counted.
    """
    _check_positive(prompt_len=prompt_len, new_tokens=new_tokens, batch=batch)
    if cache not in ("dynamic", "static"):
        raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
    s = Shape.from_config(config)
    total = prompt_len + new_tokens - (1 if cache == "dynamic" else 0)
    kv_full = kv_bytes(config, total, batch, kv_dtype, cache=cache)
    act = activation_bytes(config, prompt_len, batch, act_dtype, attention, device=device)
    carried = batch * s.vocab * 4  # the previous step's fp32 next-token logits, alive in generate's loop
    step = carried + activation_bytes(config, 1, batch, act_dtype)["peak"]
    if device == "cuda":      # generate decodes MoE layers with batched_mm on a GPU: gathered expert weights
        step += moe_decode_gather_bytes(config, batch, act_dtype)
    if cache == "static":
        prefill, decode = kv_full + act["peak"], kv_full + step
    else:
        plain = kv_dtype in ("bf16", "fp16", "fp32") or isinstance(kv_dtype, torch.dtype)
        if plain:     # bytes of the storage, which a sliding layer's view keeps whole after the prefill
            per = kv_position_bytes(config, kv_dtype) * batch
            held = lambda steps: sum(kv_storage_positions(config, prompt_len, steps)) * per  # noqa: E731
            first_cat = kv_storage_positions(config, prompt_len, 1)[0] * per / 2     # layer 0's new K
            kv_prompt, first = held(0), held(0) + first_cat
        else:
            kv_prompt = first = kv_bytes(config, prompt_len, batch, kv_dtype)
        layer_kv = kv_full / s.layers / 2
        prefill = kv_prompt + act["peak"]
        decode = max(first, kv_full + layer_kv) + step
    return {"prefill": prefill, "decode": decode, "peak": max(prefill, decode), "kv": kv_full}


def generation_ops(config, prompt_len: int, new_tokens: int, batch: int = 1, attention: str = "sdpa",
                   dtype=torch.bfloat16) -> list:
    """The allocations of one ``generate`` call with a dynamic cache, as allocator-simulator ops: the
    weights (:func:`weight_ops`), then the prefill layer by layer — the attention transients
    (eager: the score matrix's copies in the order ``eager_attention_forward`` makes them: q·kᵀ, ×
    scaling, + mask, the fp32 copy and the fp32 softmax, the ``.to(dtype)`` weights kept while the MLP
    runs), the layer's K and V (kept by the cache), the MLP transients — then every decode step's
    ``torch.cat`` of each layer's K and V one position longer (a new block, the old one freed). The
    sizes come from :func:`activation_bytes` and :func:`kv_bytes`; what the simulator adds is the
    *order*, hence which blocks the caching allocator can reuse and which make it reserve more."""
    s = Shape.from_config(config)
    b = int(dtype_bytes(dtype))
    act = activation_bytes(config, prompt_len, batch, act_dtype=dtype, attention=attention)
    per_pos = kv_position_bytes(config, dtype) * batch / 2                      # K (or V) bytes per position
    pos0 = kv_storage_positions(config, prompt_len)                              # the prefill's storage
    ops = weight_ops(config, dtype) + [["alloc", "residual", int(act["residual"])]]
    S = batch * s.heads * prompt_len**2                                    # eager's score elements
    for l in range(s.layers):
        if attention == "eager":
            rest = int(act["attention"] - S * eager_score_bytes(dtype))
            ops += [["alloc", f"qkv{l}", rest],
                    ["alloc", f"qk{l}", S * b], ["alloc", f"scaled{l}", S * b], ["free", f"qk{l}"],
                    ["alloc", f"masked{l}", S * b], ["free", f"scaled{l}"],
                    ["alloc", f"fp32{l}", S * 4], ["alloc", f"softmax{l}", S * 4], ["free", f"fp32{l}"],
                    ["free", f"masked{l}"], ["alloc", f"weights{l}", S * b], ["free", f"softmax{l}"],
                    ["free", f"qkv{l}"]]
            mlp = int(act["mlp"] - S * b)
        else:
            ops += [["alloc", f"qkv{l}", int(act["attention"])], ["free", f"qkv{l}"]]
            mlp = int(act["mlp"])
        ops += [["alloc", f"K{l}_0", int(per_pos * pos0[l])], ["alloc", f"V{l}_0", int(per_pos * pos0[l])],
                ["alloc", f"mlp{l}", mlp], ["free", f"mlp{l}"]]
        if attention == "eager":
            ops.append(["free", f"weights{l}"])
    ops += [["alloc", "logits", int(act["logits"])], ["free", "logits"], ["free", "residual"]]
    for t in range(1, new_tokens):        # the last generated token is never fed back
        pos = kv_storage_positions(config, prompt_len, t)
        gather = int(moe_decode_gather_bytes(config, batch, dtype))
        if gather:             # batched_mm's gathered expert weights: gate|up, then down while gate|up is bound
            up = gather * 2 // 3
            ops += [["alloc", f"moe_up{t}", up], ["alloc", f"moe_down{t}", gather - up],
                    ["free", f"moe_up{t}"], ["free", f"moe_down{t}"]]
        for l in range(s.layers):
            for kv in "KV":
                ops += [["alloc", f"{kv}{l}_{t}", int(per_pos * pos[l])], ["free", f"{kv}{l}_{t - 1}"]]
    return ops


def device_footprint(config, prompt_len: int, new_tokens: int, batch: int = 1, non_torch_bytes: int = 0,
                     attention: str = "sdpa", dtype=torch.bfloat16, workspace_bytes: int = 0) -> dict:
    """What ``nvidia-smi`` should show for the process after ``generate``: the memory outside PyTorch's
    allocator (CUDA context, loaded kernels, library handles: ``non_torch_bytes``, measured once per
    process after a warm-up, :func:`helpers.measure.non_torch_bytes` — vLLM's "non-torch memory")
    plus the allocator's *reserved* memory: the cuBLAS/cuBLASLt workspaces the first matmuls took
    through the allocator (``workspace_bytes``, :func:`helpers.measure.warmup_cublas`; tens of MiB,
    most of the gap on a small model) and the replay of :func:`generation_ops` through the allocator
    simulator (the weights, the prefill's blocks, the KV cache growing by ``torch.cat``).
    Checked by ``benchmarks/budget_accuracy.py`` (``smi_pred`` vs ``smi_meas``)."""
    for name, v in (("non_torch_bytes", non_torch_bytes), ("workspace_bytes", workspace_bytes)):
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise ValueError(f"{name} must be bytes ≥ 0 (measured by helpers.measure."
                             f"{'non_torch_bytes' if name == 'non_torch_bytes' else 'warmup_cublas'}), got {v!r}")
    reserved = workspace_bytes + simulate(generation_ops(config, prompt_len, new_tokens, batch, attention, dtype))["reserved"]
    return {"non_torch": non_torch_bytes, "reserved": reserved, "total": non_torch_bytes + reserved}


def budget(config, dtype: str = "bf16", seq_len: int = 2048, batch: int = 1, kv_dtype: str | None = None,
           overhead: float = 0.0, new_tokens: int = 1, attention: str = "sdpa") -> dict:
    """The four parts of the budget (bytes): weights, KV cache, activations, overhead, and the total.

    ``seq_len`` counts the prompt; ``new_tokens`` the generated tokens (the KV holds both).
    ``dtype`` is the weight format; weight-only formats (int4, int8, …) keep a 16-bit KV cache and
    16-bit activations unless ``kv_dtype`` asks for a KV format (fp32 weights: fp32 KV).
    ``overhead`` is the measured CUDA context + allocator slack (``helpers.measure.overhead``).
    ``attention`` is the model's ``attn_implementation`` (``"sdpa"`` or ``"eager"``).
    """
    format_bits(dtype)
    act_dtype = "fp32" if dtype == "fp32" else "bf16"
    kv_dtype = kv_dtype or act_dtype
    dtype_bytes(kv_dtype)
    if not overhead >= 0:
        raise ValueError(f"overhead must be ≥ 0 bytes (measured by helpers.measure.overhead), got {overhead}")
    w = weight_bytes(config, dtype)
    gen = generation_peak(config, seq_len, new_tokens, batch, act_dtype, kv_dtype, attention=attention)
    act = gen["peak"] - gen["kv"]
    return {"weights": w, "kv_cache": gen["kv"], "activations": act, "overhead": float(overhead),
            "total": w + gen["peak"] + overhead}


def fits_table(config, seq_len: int, batch: int, formats=("fp16", "int8", "int4"), kv_dtype="fp16",
               gpus: dict = GPUS_GB, overhead_gb: float = 1.0) -> list[dict]:
    """For each weight format: total GB and, per GPU, whether it fits (with ``overhead_gb`` reserve)."""
    rows = []
    for fmt in formats:
        b = budget(config, fmt, seq_len, batch, kv_dtype, overhead=overhead_gb * GB)
        row = {"format": fmt, "weights_GB": b["weights"] / GB, "kv_GB": b["kv_cache"] / GB,
               "act_GB": b["activations"] / GB, "total_GB": b["total"] / GB}
        row.update({gpu: ("yes" if b["total"] <= gb * GB else "no") for gpu, gb in gpus.items()})
        rows.append(row)
    return rows


def _check_positive(**kw):
    for k, v in kw.items():
        if not isinstance(v, (int,)) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")
