"""GPU memory budget of a decoder LLM, from its config alone: weights, KV cache, activations, overhead.

The four parts notebook 01 derives (b = bytes per element):

* **weights** — ``params × bits_per_weight / 8``. The parameters by hand, Llama's layout:
  ``V·h`` embeddings, per layer ``h·(H + 2K)·d + H·d·h`` attention and ``3·h·I`` MLP and two norms
  ``2h``, a final norm ``h``, and ``V·h`` for an untied ``lm_head``. Checked against the real
  transformers model built on the meta device (exact, no download; what ``accelerate
  estimate-memory`` counts), which is also what the bytes use, so any decoder transformers can build
  is counted exactly and a formula that misses a part says so (:func:`param_check`). Grouped integer
  formats add a scale (and a zero point) per group: ``bpw = b + (16 + z)/g``
  (:func:`helpers.quant.bits_per_weight`); as in GPTQ/AWQ checkpoints only the decoder's linear
  layers are quantized, embeddings, norms and ``lm_head`` stay in 16 bits.
* **KV cache** — ``2 · layers · kv_heads · head_dim · seq_len · batch · b_kv`` (K and V for every
  layer and token). MHA has ``kv_heads = heads``, GQA fewer, MQA one.
* **activations** — the transient tensors of one decoder block at the widest point of the prefill:
  the residual stream, then the larger of the MLP's and attention's temporaries, or the logits
  (``batch × vocab × 4`` for the last position, as ``generate`` keeps; ``× positions`` when every
  position is kept). Eager attention adds the ``batch · heads · positions²`` scores, several copies.
* **overhead** — CUDA context and allocator slack: measured at run time (``measure.overhead``),
  never guessed; :func:`budget` takes it as an argument.

Where an architecture departs from the Llama layout — sliding, chunked and cache-less layers,
mixtures of experts, latent attention, fused projections, eager attention's fp32 copies, what the
KV storage holds right after the prefill — the terms come from the fidelity layer, read once from
the config and from the model transformers builds on the meta device: :mod:`helpers.budget_shape`
(the sizes and per-layer caches), :mod:`helpers.budget_layout` (what the modeling code builds, the
exact parameter count), :mod:`helpers.budget_kv` (positions and bytes the cache stores),
:mod:`helpers.budget_activations` (one block's transients), :mod:`helpers.budget_replay` (the
allocator replay of instantiate + ``generate``); their argument checks are
:mod:`helpers.budget_inputs`'. Sources: Kwon et al. 2023 (vLLM/PagedAttention) for the KV formula;
Korthikanti et al. 2022 for activation accounting; ``accelerate estimate-memory`` for the meta model.
"""
from __future__ import annotations

import torch

from .budget_activations import block_transients, decode_gather, mla_expand_bytes, repeat_kv_bytes
from .budget_inputs import (
    ATTENTIONS,
    CACHES,
    DEVICES,
    PLAIN_FORMATS,
    byte_count,
    choice,
    dtype_bytes,
    non_negative_int,
    positive_int,
)
from .budget_kv import KVLayout, exposed_positions, kv_tensor_bytes, kv_widths, position_bytes, storage_positions
from .budget_layout import Layout, attention_params, meta_model, mlp_params, norm_params, parameter_parts
from .budget_shape import Shape
from .quant import bits_per_weight
from .units import GB

# bits per element of each storage format. Grouped formats: (bits, group, symmetric).
WEIGHT_FORMATS = {
    "fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8,
    "int8": (8, None, True),       # per-channel int8 (LLM.int8 / W8A16): per-row scale, negligible
    "int4": (4, 128, False),       # GPTQ/AWQ default: g128 asymmetric, fp16 scale + 4-bit zero
    "int4-g64": (4, 64, False),
    "int3": (3, 128, False),
    "int3-g64": (3, 64, False),
}
GPUS_GB = {"T4": 16, "L4": 24, "RTX 4090": 24, "A100-40GB": 40, "A100-80GB": 80, "H100-80GB": 80,
           "H200": 141}


def format_bits(fmt: str) -> float:
    """Exact bits per weight of a weight format name (see :data:`WEIGHT_FORMATS`)."""
    if not isinstance(fmt, str) or fmt not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; use one of {sorted(WEIGHT_FORMATS)}")
    spec = WEIGHT_FORMATS[fmt]
    if isinstance(spec, tuple):
        bits, group, sym = spec
        return bits_per_weight(bits, group, symmetric=sym)
    return float(spec)


# --------------------------------------------------------------------------- 1. weights
def param_counts(config) -> dict:
    """Parameters by part, by hand from the config's fields: ``embed`` ``V·h``; ``linears`` — per
    layer the attention ``h·(H + 2K)·d + H·d·h`` and the MLP ``3·h·I`` (mixtures of experts, latent
    attention, biases, sinks: :func:`helpers.budget_layout.attention_params` and ``mlp_params``);
    ``norms`` — two ``h`` vectors per layer and a final one (sandwich and q/k norms:
    ``norm_params``); ``lm_head`` ``V·h`` unless tied; and ``total``. Which extra norms and biases a
    layer has is the modeling code's, read from the meta-device model (:class:`Layout`); the sizes
    are the config's. :func:`param_check` compares this with the meta model's exact count."""
    try:
        s = Shape.from_config(config)
    except ValueError as e:
        raise ValueError(f"param_counts does not know model_type {getattr(config, 'model_type', None)!r}: {e}; "
                         "count a model transformers can build with budget.meta_param_counts(config)") from None
    return _formula(s, Layout.from_config(config))


def _formula(s: Shape, lay: Layout) -> dict:
    embed = s.vocab * s.hidden
    linears = sum(attention_params(s, lay) + mlp_params(s, lay, i) for i in range(s.layers))
    norms = norm_params(s, lay)
    head = 0 if s.tied else s.vocab * s.hidden
    return {"embed": embed, "linears": linears, "norms": norms, "lm_head": head,
            "total": embed + linears + norms + head}


def meta_param_counts(config) -> dict:
    """The exact parameters by part of the transformers model built from ``config`` on the meta device
    (no memory): ``embed``, ``linears``, ``norms``, ``lm_head``, ``total`` (:class:`Layout`)."""
    return parameter_parts(meta_model(config))


def meta_param_count(config) -> int:
    """Parameters of the real transformers architecture built on the meta device (no memory)."""
    return meta_param_counts(config)["total"]


def param_check(config) -> dict:
    """The hand formula (:func:`param_counts`) against the meta model, part by part:
    ``{"formula", "meta", "difference"`` (meta − formula, per part), ``"matches", "note"}`` — the note
    names the parts the formula misses (or over-counts) and by how many parameters; the bytes
    (:func:`weight_bytes`) always use the meta count."""
    s = Shape.from_config(config)
    lay = Layout.from_config(config)
    formula, meta = _formula(s, lay), dict(lay.parts)
    diff = {k: meta[k] - formula[k] for k in meta}
    off = [f"{k} {diff[k]:+,}" for k in ("embed", "linears", "norms", "lm_head") if diff[k]]
    note = None if not off else (
        f"model_type {s.model_type!r}: the hand formula is off by {', '.join(off)} parameters "
        f"(meta − formula; total {diff['total']:+,} of {meta['total']:,}): its layout departs from the "
        "formula's; the weight bytes use the meta model's exact count")
    return {"formula": formula, "meta": meta, "difference": diff, "matches": not off, "note": note}


def weight_bytes(config, fmt: str = "bf16") -> float:
    """Weights in bytes: the decoder's linears (projections, experts, routers, their biases) at
    ``fmt``, the rest — embeddings, norms, ``lm_head`` — at 16 bits (32 if ``fmt='fp32'``). The
    parameters are the meta model's exact count by part (:func:`meta_param_counts`)."""
    return parts_bytes(meta_param_counts(config), fmt)


def parts_bytes(parts: dict, fmt: str = "bf16") -> float:
    """Bytes of parameter counts by part (``linears``, ``embed``, ``norms``, ``lm_head``): the linears at
    ``fmt``'s bits per weight (:func:`format_bits`), the rest at 16 bits (32 if ``fmt='fp32'``)."""
    rest_bits = 32 if fmt == "fp32" else 16
    return (parts["linears"] * format_bits(fmt) + (parts["embed"] + parts["norms"] + parts["lm_head"]) * rest_bits) / 8


# --------------------------------------------------------------------------- 2. the KV cache
def kv_bytes(config, seq_len: int, batch: int = 1, kv_dtype="bf16", layout: KVLayout | None = None,
             decode_steps: int = 0, cache: str = "dynamic") -> float:
    """KV cache bytes, as the caches really store them (transformers' for the plain formats, the
    course's :mod:`helpers.kvcache` for fp8/int4), holding ``seq_len`` tokens.

    * plain formats: ``Σ_layers positions_l · 2 · kv_heads · head_dim · batch · b`` — the lesson's
      ``2 · layers · kv_heads · head_dim · seq_len · batch · b`` when every layer is full attention;
      ``positions_l`` from :func:`helpers.budget_kv.kv_positions` (a sliding or chunked layer holds
      at most its window, a layer without a cache nothing); multi-head latent attention (DeepSeek-V2)
      stores ``kv_lora_rank + qk_rope_head_dim`` values per position and layer instead of
      ``2 · kv_heads · head_dim`` (arXiv:2405.04434, §2.1.2);
    * ``"fp8"``: 1-byte codes plus one fp32 scale per layer, KV head and K/V
      (``+ 2 · layers · kv_heads · 4``);
    * ``"int4"``, laid out as ``layout`` says (:class:`~helpers.budget_kv.KVLayout`; None: the
      cache's defaults): two codes per byte plus an fp16 scale and an fp16 minimum per
      ``layout.group_size`` values of each token's head (``head_dim/2 + 4·head_dim/g`` bytes per
      token and head), except the ``r`` newest tokens, unquantized in ``layout.residual_dtype``
      (KIVI's residual in transformers' ``QuantizedLayer``): ``r = layout.residual_tokens(decode_steps)``
      after ``decode_steps`` of the ``seq_len`` tokens were decoded one at a time.
    ``layout`` and ``decode_steps`` change only the int4 bytes. The course's fp8 and int4 layers
    keep every position (they do not evict outside a window)."""
    seq_len, batch = positive_int(seq_len, "seq_len"), positive_int(batch, "batch")
    layout = KVLayout() if layout is None else layout
    if not isinstance(layout, KVLayout):
        raise TypeError(f"layout must be a KVLayout (e.g. KVLayout(group_size=64), the int4 cache's layout) or None, "
                        f"got {type(layout).__name__} {layout!r}")
    decode_steps = non_negative_int(decode_steps, "decode_steps")
    if decode_steps >= seq_len:
        raise ValueError(f"decode_steps must be below seq_len={seq_len} (the tokens decoded one at a time after a "
                         f"prompt of at least one token), got {decode_steps}")
    choice(cache, "cache", CACHES)
    b = dtype_bytes(kv_dtype)
    s = Shape.from_config(config)
    heads, k_dim, v_dim = kv_widths(s)
    tensors = s.cached_layers * heads                      # K (or V) tensors' heads over the layers
    if s.mla and kv_dtype in ("fp8", "int4"):
        raise ValueError(f"kv_dtype={kv_dtype!r}: the course's fp8 and int4 caches (helpers.kvcache) store K and V "
                         "of one shape, and multi-head latent attention caches latents of two widths "
                         f"(kv_lora_rank {k_dim}, qk_rope_head_dim {v_dim}); use a plain format (bf16, fp16, fp32)")
    if kv_dtype == "int4":
        residual, r = layout.residual_tokens(decode_steps), dtype_bytes(layout.residual_dtype)

        def per_token(dim):                                # codes + fp16 scale and minimum per group
            g = layout.group_size if dim % layout.group_size == 0 else dim
            return dim / 2 + (dim // g) * 4
        quantized = seq_len - residual
        return tensors * batch * (quantized * (per_token(k_dim) + per_token(v_dim))
                                  + residual * (k_dim + v_dim) * r)
    if kv_dtype == "fp8":
        return tensors * (k_dim + v_dim) * seq_len * batch * b + 2 * tensors * 4
    return sum(exposed_positions(s, seq_len, cache)) * position_bytes(s, b) * batch


# --------------------------------------------------------------------------- 3. activations
def activation_bytes(config, positions: int, batch: int = 1, act_dtype="bf16", attention: str = "sdpa",
                     keep_all_logits: bool = False, device: str = "cuda", cached: bool = False) -> dict:
    """Transient bytes at the widest point of one forward over ``positions`` tokens.

    With ``n = batch · positions`` tokens and ``b`` bytes per element, for a Llama block: the
    residual stream ``3·n·hidden·b`` plus the rotary ``cos``/``sin`` ``2·n·head_dim·b``; then the
    larger of the MLP ``n·(3·intermediate + hidden)·b`` and SDPA's attention
    ``n·(2·heads + 2·kv_heads)·head_dim·b`` (eager: the scores ``batch·heads·positions²`` ×
    :func:`~helpers.budget_activations.eager_score_bytes`, the repeated K and V, the masks and the kept attention weights; fused
    projections, experts, latent attention: :func:`helpers.budget_activations.block_transients`). Logits:
    ``batch·vocab·(b + 4)`` for the last position (model output + fp32 copy in generate), or
    ``batch·positions·vocab·(b + 4)`` when all positions are kept (training, perplexity).
    ``cached``: a forward of ``generate``, whose cache takes each layer's K and V before the attention
    runs (those bytes are the KV cache's, :func:`generation_peak`); without a cache they are
    transients. Checked on the CPU by tests/test_budget_measured.py and on a GPU by ``benchmarks/budget_accuracy.py``.
    """
    positions, batch = positive_int(positions, "positions"), positive_int(batch, "batch")
    s = Shape.from_config(config)
    if not isinstance(cached, bool):
        raise ValueError(f"cached must be True or False, got {cached!r}")
    return _activations(s, Layout.from_config(config), positions, batch, act_dtype, attention, keep_all_logits, device,
                        cached)


def _activations(s: Shape, lay: Layout, positions, batch, act_dtype, attention, keep_all_logits=False,
                 device="cuda", cached: bool = False) -> dict:
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be 'sdpa' or 'eager' (the implementations budget models), got {attention!r}")
    choice(device, "device", DEVICES)
    if not isinstance(keep_all_logits, bool):
        raise ValueError(f"keep_all_logits must be True or False, got {keep_all_logits!r}")
    b = dtype_bytes(act_dtype)
    t = block_transients(s, lay, positions, batch, act_dtype, attention, device, cached)
    logits = batch * (positions if keep_all_logits else 1) * s.vocab * (b + 4)
    block = t["residual"] + max(t["mlp"], t["attention"])
    return {**t, "logits": logits, "peak": max(block, t["residual"] + logits)}


# --------------------------------------------------------------------------- the total: generate, budget, fits
def generation_peak(config, prompt_len: int, new_tokens: int, batch: int = 1, act_dtype="bf16",
                    kv_dtype="bf16", cache: str = "dynamic", attention: str = "sdpa", device: str = "cuda",
                    score_copies: int = 0) -> dict:
    """Predicted peak memory *over the weights* during ``generate`` (prefill, then decode).

    prefill: the KV storage of the prompt + the prefill activations; decode ends with the KV of
    ``prompt_len + new_tokens − 1`` positions (the last generated token is never fed back) plus one
    layer's K being re-allocated by ``torch.cat`` (dynamic cache), the last-token logits, and the
    previous step's fp32 logits ``batch·vocab·4`` that generate's loop still holds while the next
    forward runs. With sliding-window layers the dynamic cache's *storage* is the whole prompt until
    the first decode step copies the window out (:func:`~helpers.budget_kv.kv_storage_positions`): the prefill and the
    first decode step hold the unwindowed prompt KV, later steps only the windows. A static cache
    allocates ``prompt_len + new_tokens`` positions up front. On a GPU a mixture-of-experts decode
    step also holds the gathered expert weights of :func:`~helpers.budget_activations.moe_decode_gather_bytes`. ``kv`` is what
    the cache exposes (:func:`kv_bytes`).
    ``attention`` (``"sdpa"`` or ``"eager"``) is the model's ``attn_implementation``: eager's scores
    dominate the prefill (:func:`activation_bytes`); a decode step's ``batch·heads·positions`` scores
    are small next to the KV cache and are not counted, but eager's ``repeat_kv`` copies the layer's
    whole K and V to every query head at each step, ``2·batch·heads·positions·head_dim·b`` when
    ``kv_heads < heads`` (positions: what the layer attends to at the last step fed), which outgrows
    one layer's ``torch.cat``; with MLA (DeepSeek-V2) each step expands the cached latents into every
    head's keys and values (:func:`~helpers.budget_activations.mla_expand_bytes`). ``score_copies``: the fp32 ``batch·vocab`` copies generate's logits
    processors make of each step's scores and hold into the next step (0 for plain greedy decoding;
    1 with ``min_new_tokens``, whose processor returns ``torch.where(eos, −inf, scores)`` — how the
    course's measurements force their token count).
    """
    prompt_len = positive_int(prompt_len, "prompt_len")
    if not (isinstance(score_copies, int) and not isinstance(score_copies, bool) and score_copies >= 0):
        raise ValueError(f"score_copies must be an int ≥ 0 (logits processors' copies of the scores), got {score_copies!r}")
    new_tokens, batch = positive_int(new_tokens, "new_tokens"), positive_int(batch, "batch")
    if cache not in CACHES:
        raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
    s = Shape.from_config(config)
    lay = Layout.from_config(config)
    total = prompt_len + new_tokens - (1 if cache == "dynamic" else 0)
    kv_full = kv_bytes(config, total, batch, kv_dtype, cache=cache)
    # with a cache: the attention reads K and V from it, the projected k and v already handed over
    act = _activations(s, lay, prompt_len, batch, act_dtype, attention, device=device, cached=True)
    carried = batch * s.vocab * 4  # the previous step's fp32 next-token logits, alive in generate's loop
    # ... and its processors' copies of them, alive through the next forward (the H200's recorded
    # blocks at an eager decode peak: generate's fp32 logits and MinNewTokens' where(); at the logits
    # stage the measured peaks hold one copy, as without processors)
    processed = batch * s.vocab * 4 * score_copies
    one = _activations(s, lay, 1, batch, act_dtype, "sdpa", device=device, cached=True)
    # generate decodes MoE layers with batched_mm on a GPU: gathered expert weights, alive in the MLP
    gather = decode_gather(s, lay, batch, dtype_bytes(act_dtype)) if device == "cuda" else 0

    def step(cat, repeated):
        """One decode step over the cache: the attention (with a layer's torch.cat or eager's
        repeated K and V, one after the other), the MLP (with the gathered experts) or the logits."""
        return carried + one["residual"] + max(processed + one["attention"] + max(cat, repeated),
                                               processed + one["mlp"] + gather, one["logits"])

    b = dtype_bytes(act_dtype)
    eager = attention == "eager" and new_tokens > 1        # a step fed back to the model, whose attention repeats K, V

    def expanded(positions):
        """What a fed step's attention makes from a cache of ``positions``: eager's repeated K and V, or
        MLA's keys and values expanded from the cached latents (:func:`mla_expand_bytes`)."""
        if new_tokens == 1:
            return 0
        return (repeat_kv_bytes(s, batch * positions, b) if eager else 0) + sum(
            mla_expand_bytes(s, batch, positions, b, attention))
    # the last step fed: a static layer returns all its allocated positions; a dynamic one what it stores
    seen = prompt_len + new_tokens if cache == "static" else max(storage_positions(s, prompt_len, new_tokens - 1))
    last = expanded(seen)
    first_layer = next(i for i, c in enumerate(s.caches) if c.kind != "none")
    k_one, v_one = kv_tensor_bytes(s, 1)
    k_share = k_one / (k_one + v_one)                  # K's part of a position's bytes: ½, or MLA's latent
    if cache == "static":
        prefill, decode = kv_full + act["peak"], kv_full + step(0, last)
    else:
        if kv_dtype in PLAIN_FORMATS or isinstance(kv_dtype, torch.dtype):
            # the bytes of the storage, which a sliding layer's view keeps whole after the prefill
            per = position_bytes(s, dtype_bytes(kv_dtype)) * batch
            held = lambda steps: sum(storage_positions(s, prompt_len, steps)) * per  # noqa: E731
            first_cat = storage_positions(s, prompt_len, 1)[first_layer] * per * k_share   # its new K
            kv_prompt = held(0)
        else:
            kv_prompt, first_cat = kv_bytes(config, prompt_len, batch, kv_dtype), 0
        layer_kv = kv_full / s.layers * k_share      # one layer's new K (the larger latent with MLA)
        prefill = kv_prompt + act["peak"]
        first_repeated = expanded(storage_positions(s, prompt_len, 1)[first_layer])
        decode = max(kv_prompt + step(first_cat, first_repeated), kv_full + step(layer_kv, last))
    return {"prefill": prefill, "decode": decode, "peak": max(prefill, decode), "kv": kv_full}


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
    try:
        positive_int(seq_len, "seq_len")
    except ValueError:
        raise ValueError(f"seq_len is the prompt's length: prompt_len must be a positive integer, got {seq_len!r}") from None
    act_dtype = "fp32" if dtype == "fp32" else "bf16"
    kv_dtype = kv_dtype or act_dtype
    dtype_bytes(kv_dtype)
    overhead = byte_count(overhead, "overhead", " (measured by helpers.measure.overhead)")
    w = weight_bytes(config, dtype)
    gen = generation_peak(config, seq_len, new_tokens, batch, act_dtype, kv_dtype, attention=attention)
    act = gen["peak"] - gen["kv"]
    return {"weights": w, "kv_cache": gen["kv"], "activations": act, "overhead": float(overhead),
            "total": w + gen["peak"] + overhead}


def fits_table(config, seq_len: int, batch: int, formats=("fp16", "int8", "int4"), kv_dtype="fp16",
               gpus: dict = GPUS_GB, overhead_gb: float = 1.0) -> list[dict]:
    """For each weight format: total GB and, per GPU, whether it fits (with ``overhead_gb`` reserve)."""
    if isinstance(formats, str) or not formats:
        raise ValueError(f"formats must be a non-empty list of weight formats from {sorted(WEIGHT_FORMATS)}, "
                         f"got {formats!r}")
    for fmt in formats:
        format_bits(fmt)
    if not isinstance(gpus, dict) or not gpus:
        raise ValueError(f"gpus must be a non-empty dict of GPU name → memory in GB, got {gpus!r}")
    for gpu, gb in gpus.items():
        byte_count(gb, f"gpus[{gpu!r}]", unit="GB")
    overhead_gb = byte_count(overhead_gb, "overhead_gb", unit="GB")
    rows = []
    for fmt in formats:
        b = budget(config, fmt, seq_len, batch, kv_dtype, overhead=overhead_gb * GB)
        row = {"format": fmt, "weights_GB": b["weights"] / GB, "kv_GB": b["kv_cache"] / GB,
               "act_GB": b["activations"] / GB, "total_GB": b["total"] / GB}
        row.update({gpu: ("yes" if b["total"] <= gb * GB else "no") for gpu, gb in gpus.items()})
        rows.append(row)
    return rows
