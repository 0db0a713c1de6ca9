"""The transient bytes of one decoder block: what a forward holds beside the weights and the KV cache.

:func:`block_transients` (residual stream, SDPA, eager attention's score copies, dense, fused and
mixture-of-experts MLPs, MLA), :func:`eager_score_bytes` (the fp32 softmax copies),
:func:`moe_transients`, and the expert weights a GPU decode step gathers
(:func:`moe_decode_gather_bytes`). Sources: transformers 5.17 (``eager_attention_forward``,
``integrations/moe.py``, ``GenerationMixin._optimize_model_for_decode``, the models' own
``apply_rotary_pos_emb`` and experts); ATen's ``SoftMax.cpp`` for the fp32 softmax copies.
"""
from __future__ import annotations

from .budget_inputs import DEVICES, dtype_bytes, is_fp16, positive_int
from .budget_layout import Layout
from .budget_shape import Shape

ROTARY_IN_FP32 = frozenset({"cohere", "cohere2"})
"""Model types whose ``apply_rotary_pos_emb`` rotates q and k in fp32 (``q = q.float()``, Cohere's
interleaved rotary), so the attention stage holds fp32 copies of q and k and of the rotation's terms."""


EAGER_SOFTMAX_COPIES = {"llama4_text": 2, "llama4": 2, "gpt_oss": 3}
"""Model types whose own ``eager_attention_forward`` keeps the softmax in the model's dtype, with the
score-sized copies alive at its widest: Llama-4 (``softmax(attn_weights)``: input and output, 2),
GPT-OSS (the masked scores, the scores with the sink column, their max-subtracted copy / the
softmax: 3). Everyone else: :func:`eager_score_bytes`."""


def eager_score_bytes(act_dtype="bf16", device: str = "cuda") -> float:
    """Bytes per element of the ``batch × heads × q × k`` score matrix at eager attention's widest point.

    transformers' ``eager_attention_forward`` computes ``softmax(q·kᵀ·s + mask, dtype=float32).to(dtype)``.
    ATen's ``softmax(x, dtype=float32)`` fuses the up-cast only for fp16 on CUDA (``half_to_float``);
    otherwise it first copies ``x`` to fp32 and then writes a new fp32 result (``SoftMax.cpp``). So at
    the softmax, live at once: the ``b``-byte scores + the fp32 copy + the fp32 output = ``b + 8``
    (bf16 anywhere, fp16 on a CPU); fused fp16 on CUDA: ``b + 4``, then ``b`` more for ``.to(dtype)``
    = 8; fp32: input and output only = 8. Checked on the CPU by tests/test_budget_measured.py."""
    b = dtype_bytes(act_dtype)
    if device not in DEVICES:
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if b == 4:
        return 8.0
    if b == 2 and device == "cuda" and is_fp16(act_dtype):
        return 8.0
    return b + 8.0


def score_bytes(s: Shape, act_dtype, device: str) -> float:
    """Bytes per score element at eager attention's widest point for this model: the model's own copies
    (:data:`EAGER_SOFTMAX_COPIES`) × ``b``, else :func:`eager_score_bytes`."""
    copies = EAGER_SOFTMAX_COPIES.get(s.model_type)
    return copies * dtype_bytes(act_dtype) if copies else eager_score_bytes(act_dtype, device)


def moe_transients(s: Shape, lay: Layout, n: int, b: float) -> float:
    """A mixture-of-experts block at its widest over ``n`` tokens, ``k`` experts per token of width
    ``I``. Through transformers' ``grouped_mm`` experts, the larger of two stages:

    * up: the normed input ``h``, the ``k·h`` gathered token copies and the ``k·2I`` gate|up
      projection twice over (``masked_fill`` writes a new copy) — ``h + k·h + 4·k·I`` elements per
      token — plus the shared expert's ``h``-wide output where there is one (Qwen-MoE, DeepSeek);
      experts with biases (GPT-OSS) also hold each token's gathered gate|up biases ``k·2I``, and
      GPT-OSS's own gate (``_apply_gate``: clamped gate and up, ``up + 1``, the GLU, their product)
      ``3·k·I`` more than ``act(gate) · up``;
    * down: the input and shared ``h``, the gathered copies and the down projection's ``k·h`` (each
      ``b`` bytes; the gathered down biases ``k·h`` more), then the output weighted by the routing
      weights and its copy put back in token order — ``k·h`` each, in the routing weights' dtype
      (:data:`helpers.budget_shape.ROUTING_IN_FP32`).

    Experts that run outside those kernels (Llama-4's ``Llama4TextExperts``: every token through every
    one of ``E`` experts, ``hidden.repeat(E, 1)`` then weighted) hold per token the input ``h`` plus
    ``E·(h + 4I)`` at the product ``up · act(gate)`` (the weighted copies, gate|up, the activation,
    the product; read from ``Llama4TextMoe.forward``). Checked on the CPU by tests/test_budget_measured.py."""
    m = s.moe
    if m is None:
        return 0
    k, h, width = s.experts_per_token(), s.hidden, m.width
    shared = h if (m.shared_width or lay.shared_expert) else 0
    if not lay.experts_kernel:
        return n * (h + m.experts * (h + 4 * width)) * b
    w = 4 if m.fp32_routing else b       # bytes of a routing weight
    up = (h + k * h + (4 + (2 if lay.expert_bias else 0) + (3 if lay.custom_gate else 0)) * k * width + shared) * b
    down = (h + shared) * b + k * h * (3 if lay.expert_bias else 2) * b + k * h * 2 * w
    return n * max(up, down)


def decode_gather(s: Shape, lay: Layout, batch: int, b: float) -> float:
    """:func:`moe_decode_gather_bytes` for a :class:`Shape` and :class:`Layout` already read:
    ``batch · k · (3·I·h + h + 3·I) · b``, 0 without transformers' experts kernels."""
    m = s.moe
    if m is None or not lay.experts_kernel:
        return 0
    return batch * s.experts_per_token() * (3 * m.width * s.hidden + s.hidden + 3 * m.width) * b


def moe_decode_gather_bytes(config, batch: int = 1, act_dtype="bf16") -> float:
    """Transient bytes of one mixture-of-experts layer in a GPU decode step. On a non-CPU device
    ``generate`` switches the experts from ``grouped_mm`` to ``batched_mm`` for the decoding stage
    (transformers ``GenerationMixin._optimize_model_for_decode``: "trade off a bit of memory (by
    duplicating selected experts weights) for much better speed"), which *gathers* every selected
    expert's weights per token: with ``k`` experts per token of width ``I`` over ``h``, the gate|up
    copy ``k·2I·h`` is still bound while the down copy ``k·I·h`` is made, so per token
    ``k·(3·I·h + h + 3·I)`` elements (the weights, the gathered input, the projections). 0 for a
    dense model and for experts outside transformers' experts kernels (Llama-4)."""
    batch = positive_int(batch, "batch")
    s = Shape.from_config(config)
    if s.moe is None:
        return 0
    return decode_gather(s, Layout.from_config(config), batch, dtype_bytes(act_dtype))


def repeat_kv_bytes(s: Shape, n: int, b: float) -> float:
    """Eager attention's ``repeat_kv``: K and V over ``n = batch · positions`` token positions copied to
    every query head, ``2·n·heads·head_dim·b`` (none when ``kv_heads = heads``, or with MLA, whose
    heads are not grouped). With one KV head (multi-query, Gemma-3-1B) ``expand(...).reshape(...)``
    is a view with a zero stride, and each ``torch.matmul`` makes its own contiguous copy of that
    operand, freed when it returns: one ``n·heads·head_dim·b`` at a time (the recorded decode peak of
    Gemma-3-1B eager 512 × 16 holds V's copy, allocated at ``matmul(attn_weights, value_states)``,
    and no K copy; ``results/h200/alloc_events_points_2026-12-03.json.gz``). transformers 5.17
    ``repeat_kv`` and ``eager_attention_forward``."""
    if s.mla or s.kv_heads >= s.heads:
        return 0
    copies = 1 if s.kv_heads == 1 else 2
    return copies * n * s.heads * s.head_dim * b


def mla_expand_bytes(s: Shape, batch: int, positions: int, b: float, attention: str) -> tuple:
    """The tensors a decode step's MLA attention makes from the cached latents of ``positions``
    positions, per layer, as ``(kv_b_proj's output, the keys, eager's copy of the values)``:
    ``batch·positions·heads·(nope + v)·b`` (``kv_b_proj`` over every cached latent; k_nope and the
    values are views of it), ``batch·positions·heads·(nope + rope)·b`` (``key_states``, a new tensor
    the two key parts are copied into), and with eager attention at ``batch > 1`` the values'
    contiguous copy ``batch·positions·heads·v·b``: a value view's batch and head strides do not fold
    into one, so ``torch.matmul(attn_weights, value_states)`` copies it (at batch 1 they fold and it
    does not). transformers 5.17 ``DeepseekV2Attention.expand_kv``, run after the cache's
    ``update`` has returned the latents; the H200's recorded DeepSeek-V2-Lite decode peaks at 8192
    positions (``results/h200/budget_accuracy.json``). ``()`` without MLA."""
    if not s.mla:
        return ()
    a, n = s.mla, batch * positions
    values = n * s.heads * a.v_dim * b if attention == "eager" and batch > 1 else 0
    return (n * s.heads * (a.nope_dim + a.v_dim) * b, n * s.heads * (a.nope_dim + a.rope_dim) * b, values)


def block_transients(s: Shape, lay: Layout, positions: int, batch: int, act_dtype, attention: str,
                     device: str, cached: bool = False) -> dict:
    """The transient bytes of one decoder block over ``positions`` tokens (``n = batch · positions``,
    ``b`` bytes per element), as ``{"residual", "mlp", "attention"}``:

    * residual: hidden-size tensors ``3·n·hidden·b`` alive across the block (the embeddings, still
      referenced by the model's forward; the block's input, held by the caller's loop; the residual
      sum) and the rotary ``cos``/``sin`` ``2·n·rope_dim·b`` shared by all layers (one pair per
      :attr:`~helpers.budget_shape.Shape.rope_tables`), and with SDPA the boolean masks
      ``batch·positions²`` of the windowed layer kinds whose window the positions reach;
    * MLP: ``n·(3·I + h)·b`` (gate, up, their product, the normed input — none in a post-norm layer,
      OLMo-2, whose MLP reads the residual sum itself; ``4·I`` where gate and up come out of one fused
      projection, Phi-3; ``2·I`` ungated), or the experts' stage
      (:func:`moe_transients`), whichever is larger;
    * attention: SDPA (fused kernels never hold the scores) ``n·(2·H + 2·K)·d·b`` (q, k, v, output),
      plus the rotated q, k beside a fused ``qkv_proj``'s output, plus the fp32 rotation of
      :data:`ROTARY_IN_FP32` (``n·(4·H + K)·d·4`` at ``rotate_half(q)·sin``, before the attention's
      output or scores exist); MLA as transformers computes it;
      eager at its softmax: q, k, v, K and V repeated to every query head when ``K < H``
      (``repeat_kv``: ``2·n·H·d·b``), the scores ``batch·H·positions²`` × :func:`eager_score_bytes`
      (:data:`EAGER_SOFTMAX_COPIES` for the models whose softmax stays in their dtype);
      and, alive beside the MLP too, the additive masks the model built once for the whole forward
      (``batch·positions²·b`` per kind of layer: full, sliding, chunked) and the layer's returned
      attention weights (``batch·H·positions²·b``, bound to ``_`` until the layer returns). In a
      post-norm layer (OLMo-2) the attention reads the residual itself: one hidden-size tensor
      fewer, ``−n·h·b``, while it runs.

    ``cached``: a forward of ``generate``, whose cache takes this layer's K and V — ``cache.update``
    stores copies (``torch.cat`` into the dynamic layer, ``index_copy_`` into the static one) and the
    projected k and v are freed as the attention rebinds them to what it returns. So at the
    eager attention's scores k and v (``2·n·K·d·b``) are no transients: they are the KV bytes; the
    rotation before it still holds them. Measured on the CPU with a cache (tests/test_budget_measured.py).
    Eager only: SDPA's widest point in the H200 rows is the MLP, and on a CPU its kernel's own
    buffers hide the difference. (Separate projections; a fused ``qkv_proj``'s output stays alive
    through v's view, and MLA is computed as transformers does: both unchanged.)"""
    b = dtype_bytes(act_dtype)
    n = batch * positions
    rope_dim = s.mla.rope_dim if s.mla else s.head_dim
    residual = 3 * n * s.hidden * b + 2 * n * rope_dim * b * s.rope_tables
    width = (4 if lay.fused_gate_up else 3 if lay.gated_mlp else 2) * s.intermediate
    mlp = max(n * (width + (s.hidden if lay.pre_norm else 0)) * b if s.has_dense_mlp else 0,
              moe_transients(s, lay, n, b))
    if s.mla:
        a = s.mla
        qk_dim = a.nope_dim + a.rope_dim
        # per token: q_proj's output (its q_nope view keeps it), the rotated q_pe, the query cat; the
        # latent (r + rope) and its normed copy r, the rotated k_pe; kv_b_proj's per-head output
        # (k_nope, v are views of it) and the key tensor
        qkv = n * (s.heads * qk_dim + s.heads * a.rope_dim + s.heads * qk_dim + (a.kv_lora_rank + a.rope_dim)
                   + a.kv_lora_rank + a.rope_dim + s.heads * (a.nope_dim + a.v_dim) + s.heads * qk_dim) * b
        out, qk, repeated, rotation = n * s.heads * a.v_dim * b, 0, 0, 0
    else:
        qkv = n * (s.heads + 2 * s.kv_heads) * s.head_dim * b
        qk = qkv - n * s.kv_heads * s.head_dim * b if lay.fused_qkv else 0
        out = n * s.heads * s.head_dim * b
        repeated = repeat_kv_bytes(s, n, b)
        # q.float(), k.float(), then q·cos, rotate_half(q), rotate_half(q)·sin: before the attention itself
        rotation = n * ((s.heads + s.kv_heads) + 3 * s.heads) * s.head_dim * 4 if s.model_type in ROTARY_IN_FP32 else 0
    # k and v handed to the cache (its copies are the KV bytes) by the time the attention runs
    stored = 2 * n * s.kv_heads * s.head_dim * b if cached and not (s.mla or lay.fused_qkv) else 0
    if attention == "sdpa":
        attn = qkv + qk + max(out, rotation)
        # a window SDPA's is_causal cannot express (masking_utils._ignore_causal_mask_sdpa keeps the
        # mask once kv_length >= the window): one boolean mask per windowed kind of layer
        windowed = {c.kind for c in s.check_caches() if c.window is not None and positions >= c.window}
        residual += len(windowed) * batch * positions**2
    else:
        kinds = {c.kind for c in s.check_caches() if c.kind != "none"} or {"full"}
        residual += len(kinds) * batch * positions**2 * b
        mlp += batch * s.heads * positions**2 * b
        scores = batch * s.heads * positions**2 * score_bytes(s, act_dtype, device)
        attn = max(qkv + rotation, qkv - stored + qk + repeated + scores)
    if not lay.pre_norm:       # no normed copy of the residual beside the attention
        attn -= n * s.hidden * b
    return {"residual": residual, "mlp": mlp, "attention": attn}
