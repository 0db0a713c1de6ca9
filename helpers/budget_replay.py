"""The allocator replay: instantiate + ``generate`` as a sequence of allocations, through the
caching-allocator simulator of notebook 02.

:func:`weight_ops` / :func:`weight_allocation` (the parameters and buffers in creation order),
:func:`eager_ops` (eager attention's score copies, per model type's ``eager_attention_forward``),
:func:`generation_ops` (the prefill layer by layer, then every decode step's transients and
``torch.cat``), :func:`decode_allocated` (the decode forwards' peak in the allocator's blocks) and
:func:`device_footprint` (what ``nvidia-smi`` should show). The sizes come from
:mod:`helpers.budget_activations` and :mod:`helpers.budget_kv`; the simulator adds the order, hence
which blocks the allocator can reuse. Source: PyTorch's ``CUDACachingAllocator.cpp`` through
:mod:`helpers.allocator_sim`.
"""
from __future__ import annotations

import torch

from .allocator_sim import simulate
from .budget_activations import block_transients, decode_gather, mla_expand_bytes, repeat_kv_bytes, score_bytes
from .budget_inputs import ATTENTIONS, choice, dtype_bytes, is_fp16, non_negative_int, positive_int
from .budget_kv import kv_tensor_bytes, storage_positions
from .budget_layout import Layout, meta_model
from .budget_shape import Shape
from .models import parse_dtype


def weight_ops(config, dtype=torch.bfloat16) -> list:
    """The allocations instantiating the model makes: every parameter and buffer of a meta-device
    model, in creation order, as allocator-simulator ops (``["alloc", name, bytes]``)."""
    return _tensor_ops(meta_model(config, dtype))


def _tensor_ops(model) -> list:
    return [["alloc", name, t.numel() * t.element_size()]
            for name, t in list(model.named_parameters()) + list(model.named_buffers())]


def weight_allocation(config, dtype=torch.bfloat16) -> int:
    """Predicted ``memory_allocated`` after instantiating the model on a GPU: every parameter and
    buffer (from a meta-device model, in creation order) replayed through the caching-allocator
    simulator, which adds the block rounding the real allocator applies (a block whose remainder
    would be ≤ 1 MiB is handed out whole)."""
    return simulate(weight_ops(config, dtype))["allocated"]


def norm_ops(name: str, n_h: int, b: int) -> list:
    """RMSNorm over ``n_h`` elements as transformers' ``*RMSNorm.forward`` allocates it (``hidden.to(float32)``,
    ``pow(2).mean``, ``hidden * rsqrt(variance + eps)``, ``weight * hidden.to(dtype)``): the fp32 copy,
    its square (dropped after the mean), the fp32 normalised copy (the first dropped), the cast back and
    the weight's product (the cast dropped); the fp32 copy is dropped when the norm returns. Leaves
    ``name`` (``n_h·b``) alive."""
    return [["alloc", f"{name}.f32", n_h * 4], ["alloc", f"{name}.sq", n_h * 4], ["free", f"{name}.sq"],
            ["alloc", f"{name}.f32n", n_h * 4], ["free", f"{name}.f32"], ["alloc", f"{name}.cast", n_h * b],
            ["alloc", name, n_h * b], ["free", f"{name}.cast"], ["free", f"{name}.f32n"]]


def mlp_ops(name: str, s: Shape, lay: Layout, n: int, b: int, mlp_bytes: int) -> list:
    """One prefill MLP's allocations over ``n`` tokens. A dense gated pre-norm MLP
    (``down(act(gate(x)) · up(x))`` on ``x = norm(h)``) as its forward makes and drops its tensors:
    the norm (:func:`norm_ops`), ``gate``, ``act(gate)`` (``gate`` dropped), ``up``, their product
    (``act`` and ``up`` dropped), ``down``'s output (the product dropped) — at most ``n·(h + 3·I)·b``,
    the :func:`~helpers.budget_activations.block_transients` peak ``mlp_bytes``, in separate blocks the
    allocator can place apart (the recorded prefill of Qwen2.5-0.5B SDPA 8192 × 2 makes four 152 MiB
    segments there, ``results/h200/alloc_events_points_2026-12-02.json.gz``). A fused gate|up MLP
    (:attr:`~helpers.budget_layout.Layout.fused_gate_up`: one ``gate_up_proj``, read from the model's
    modules — Phi-3, GLM, GLM-4 in transformers 5.17; ``Phi3MLP.forward`` in ``modeling_phi3.py``:
    ``up_states = gate_up_proj(x)``, ``gate, up_states = up_states.chunk(2, dim=-1)``, ``up_states =
    up_states * act(gate)``, ``down_proj(up_states)``) as :func:`fused_mlp_ops`: one ``2·I`` block,
    whose ``gate`` view keeps it alive until the MLP returns. Other MLPs (ungated, post-norm, experts):
    one block of ``mlp_bytes``."""
    I_b, h_b = n * s.intermediate * b, n * s.hidden * b
    dense_gated = s.has_dense_mlp and lay.gated_mlp and lay.pre_norm
    if dense_gated and lay.fused_gate_up and mlp_bytes == 4 * I_b + h_b:
        return fused_mlp_ops(name, n * s.hidden, I_b, h_b, b)
    if not (dense_gated and not lay.fused_gate_up and mlp_bytes == 3 * I_b + h_b):
        return [["alloc", name, mlp_bytes], ["free", name]]
    t = {k: f"{name}.{k}" for k in ("normed", "gate", "act", "up", "prod", "down")}
    return norm_ops(t["normed"], n * s.hidden, b) + [
        ["alloc", t["gate"], I_b], ["alloc", t["act"], I_b], ["free", t["gate"]],
        ["alloc", t["up"], I_b], ["alloc", t["prod"], I_b], ["free", t["act"]], ["free", t["up"]],
        ["alloc", t["down"], h_b], ["free", t["prod"]], ["free", t["normed"]], ["free", t["down"]]]


def fused_mlp_ops(name: str, n_h: int, I_b: int, h_b: int, b: int) -> list:
    """A pre-norm MLP with one fused gate|up projection (``I_b`` = ``n·I·b`` bytes per half) as
    ``Phi3MLP.forward`` makes and drops its tensors: the norm (:func:`norm_ops`), ``gate_up`` (``2·I_b``;
    ``gate`` and ``up`` are views of it), ``act(gate)``, the product (``act`` dropped; the product
    rebinds ``up_states``, but ``gate`` still holds ``gate_up``), ``down``'s output, then on return the
    product and ``gate_up``; the normed input is dropped as the layer rebinds it. At most
    ``h_b + 4·I_b`` (:func:`~helpers.budget_activations.block_transients`' fused MLP), in a ``2·I`` block
    and two ``I`` blocks where an unfused MLP has four ``I`` blocks (:func:`mlp_ops`)."""
    t = {k: f"{name}.{k}" for k in ("normed", "gate_up", "act", "prod", "down")}
    return norm_ops(t["normed"], n_h, b) + [
        ["alloc", t["gate_up"], 2 * I_b], ["alloc", t["act"], I_b], ["alloc", t["prod"], I_b], ["free", t["act"]],
        ["alloc", t["down"], h_b], ["free", t["prod"]], ["free", t["gate_up"]], ["free", t["normed"]], ["free", t["down"]]]


def score_ops(l: int, S: int, b: int, softcap: bool = False) -> list:
    """The score matrix up to its mask, as every ``eager_attention_forward`` of transformers 5.17 starts
    (``modeling_llama.py``, ``modeling_gpt_oss.py``, ``modeling_llama4.py``, ``modeling_gemma2.py``):
    ``torch.matmul(query, key.transpose(2, 3)) * scaling`` (q·kᵀ dropped once scaled), the
    :data:`EAGER_SOFTCAP` models' soft-capping ``tanh(w / softcap) * softcap`` (three more, each
    dropping the last), then ``w + attention_mask``, each ``S·b`` for ``S = batch·heads·q·k`` scores.
    Leaves ``masked{l}`` alive."""
    steps = ["qk", "scaled"] + (["capdiv", "tanh", "capped"] if softcap else []) + ["masked"]
    ops = [["alloc", f"qk{l}", S * b]]
    for prev, step in zip(steps, steps[1:]):
        ops += [["alloc", f"{step}{l}", S * b], ["free", f"{prev}{l}"]]
    return ops


def softmax_fp32_ops(l: int, rows: int, k: int, dtype) -> list:
    """Llama's ``softmax(masked, dtype=float32).to(query.dtype)`` (``modeling_llama.py``
    ``eager_attention_forward``; every model type not in :data:`EAGER_SOFTMAX_OPS`) over ``rows·k``
    scores on CUDA: ATen's ``softmax`` (``SoftMax.cpp``) copies bf16 scores to fp32 first (fp16: fused
    ``half_to_float``, no copy), writes the fp32 result, and the cast back ``weights{l}`` is made while
    the masked scores are still bound (freed as the name is rebound); fp32 scores: the result only, the
    cast a no-op. Leaves ``weights{l}`` (the returned attention weights) alive."""
    S, b = rows * k, int(dtype_bytes(dtype))
    if b == 4:
        return [["alloc", f"weights{l}", S * 4], ["free", f"masked{l}"]]
    if is_fp16(dtype):
        up = [["alloc", f"softmax{l}", S * 4]]
    else:
        up = [["alloc", f"fp32{l}", S * 4], ["alloc", f"softmax{l}", S * 4], ["free", f"fp32{l}"]]
    return up + [["alloc", f"weights{l}", S * b], ["free", f"softmax{l}"], ["free", f"masked{l}"]]


def softmax_in_dtype_ops(l: int, rows: int, k: int, dtype) -> list:
    """Llama-4's ``softmax(masked, dim=-1)`` in the model's dtype (``modeling_llama4.py``
    ``eager_attention_forward``): the weights ``rows·k·b``, the masked scores freed as the name is
    rebound. Leaves ``weights{l}`` alive."""
    return [["alloc", f"weights{l}", rows * k * int(dtype_bytes(dtype))], ["free", f"masked{l}"]]


def softmax_with_sinks_ops(l: int, rows: int, k: int, dtype) -> list:
    """GPT-OSS's attention sinks, all in the model's dtype (``modeling_gpt_oss.py``
    ``eager_attention_forward``): ``torch.cat([masked, sinks], dim=-1)`` (``rows·(k+1)``; the sinks are
    an expanded view), ``combined - combined.max(dim=-1, keepdim=True).values`` (the row maxima and their
    int64 indices, dropped; the concatenation dropped as the name is rebound), ``softmax(...,
    dtype=combined.dtype)`` (no copy, a ``rows·(k+1)`` result whose ``[..., :-1]`` view is returned; dropout
    and ``.to`` return it as is). The masked scores are freed when ``attn_weights`` is rebound to that
    view, the max-subtracted copy when the function returns. Leaves ``weights{l}`` alive."""
    b = int(dtype_bytes(dtype))
    S1 = rows * (k + 1)                   # the scores with the sink column
    return [["alloc", f"cat{l}", S1 * b],
            ["alloc", f"rowmax{l}", rows * b], ["alloc", f"argmax{l}", rows * 8], ["free", f"argmax{l}"],
            ["alloc", f"shifted{l}", S1 * b], ["free", f"rowmax{l}"], ["free", f"cat{l}"],
            ["alloc", f"weights{l}", S1 * b], ["free", f"masked{l}"], ["free", f"shifted{l}"]]


EAGER_SOFTMAX_OPS = {"llama4_text": softmax_in_dtype_ops, "llama4": softmax_in_dtype_ops,
                     "gpt_oss": softmax_with_sinks_ops}
"""Model types whose own ``eager_attention_forward`` differs from Llama's after the mask (the op
sequences behind :data:`helpers.budget_activations.EAGER_SOFTMAX_COPIES`); everyone else:
:func:`softmax_fp32_ops`."""

EAGER_SOFTCAP = frozenset({"gemma2", "vaultgemma"})
"""Model types whose attention passes ``softcap=config.attn_logit_softcapping`` to its
``eager_attention_forward`` (``Gemma2Attention.forward``, ``VaultGemmaAttention.forward``; Gemma-3's
function has the parameter but its attention does not pass it)."""


def eager_ops(config, l: int, rows: int, k: int, dtype=torch.bfloat16) -> list:
    """Eager attention's score-sized blocks in layer ``l`` over ``rows = batch·heads·q`` query rows and ``k``
    keys, in the order the model type's own ``eager_attention_forward`` makes and drops them:
    :func:`score_ops`, then :data:`EAGER_SOFTMAX_OPS` (default :func:`softmax_fp32_ops`). Leaves
    ``weights{l}``, the returned attention weights, alive."""
    model_type = getattr(config, "model_type", "")
    softcap = model_type in EAGER_SOFTCAP and getattr(config, "attn_logit_softcapping", None) is not None
    softmax = EAGER_SOFTMAX_OPS.get(model_type, softmax_fp32_ops)
    return score_ops(l, rows * k, int(dtype_bytes(dtype)), softcap) + softmax(l, rows, k, dtype)


def generation_ops(config, prompt_len: int, new_tokens: int, batch: int = 1, attention: str = "sdpa",
                   dtype=torch.bfloat16, score_copies: int = 0) -> list:
    """The allocations of one ``generate`` call with a dynamic cache, as allocator-simulator ops:
    :func:`weight_ops`, then :func:`prefill_ops`, then :func:`decode_ops` — the three phases of
    :func:`generation_phases`, joined."""
    return [op for phase in generation_phases(config, prompt_len, new_tokens, batch, attention, dtype,
                                              score_copies) for op in phase]


def generation_phases(config, prompt_len: int, new_tokens: int, batch: int = 1, attention: str = "sdpa",
                      dtype=torch.bfloat16, score_copies: int = 0) -> tuple[list, list, list]:
    """One ``generate`` with a dynamic cache as three lists of allocator-simulator ops: the weights
    (:func:`weight_ops`), the prefill (:func:`prefill_ops`) and the decode steps (:func:`decode_ops`).
    ``score_copies``: the logits processors' fp32 copies of each step's scores
    (:func:`helpers.budget.generation_peak`)."""
    prompt_len, new_tokens = positive_int(prompt_len, "prompt_len"), positive_int(new_tokens, "new_tokens")
    batch, attention = positive_int(batch, "batch"), choice(attention, "attention", ATTENTIONS)
    score_copies = non_negative_int(score_copies, "score_copies")
    dtype = parse_dtype(dtype)
    s = Shape.from_config(config)
    model = meta_model(config, dtype)
    lay = Layout.from_model(model, s)
    return (_tensor_ops(model), prefill_ops(config, s, lay, prompt_len, batch, attention, dtype, score_copies),
            decode_ops(s, lay, prompt_len, new_tokens, batch, attention, dtype, score_copies))


def prefill_ops(config, s: Shape, lay: Layout, prompt_len: int, batch: int, attention: str, dtype,
                score_copies: int = 0) -> list:
    """The prefill layer by layer — the attention transients (eager: the score matrix's copies in the
    order the model type's ``eager_attention_forward`` makes them, :func:`eager_ops`, the returned
    weights kept while the MLP runs), the layer's K and V (kept by the cache), the MLP transients —
    then the last position's logits and their fp32 copy (``carried0``, held into the first decode
    step, with ``score_copies`` processed copies). Each attention comes with its RMSNorm's fp32
    copies (:func:`norm_ops`: before it, or after it in a post-norm layer), and a dense gated MLP is
    its separate tensors (:func:`mlp_ops`; a fused ``gate_up_proj``'s one ``2·I`` block,
    :func:`fused_mlp_ops`). The sizes come from :func:`block_transients` and the KV storage; what the
    simulator adds is the *order*, hence which blocks the caching allocator can reuse and which make
    it reserve more. The model types of :data:`LLAMA_OPS` with an attention of
    :data:`LLAMA_OPS_ATTENTIONS` (where :func:`follows_llama_ops`) are replayed op by op instead:
    :func:`llama_prefill_ops`."""
    b = int(dtype_bytes(dtype))
    if attention in LLAMA_OPS_ATTENTIONS and follows_llama_ops(config, s, lay, prompt_len, attention):
        return llama_prefill_ops(config, s, lay, prompt_len, batch, attention, dtype, score_copies)
    act = block_transients(s, lay, prompt_len, batch, dtype, attention, "cuda", cached=True)
    per_pos = dict(zip("KV", (x * batch for x in kv_tensor_bytes(s, b))))   # bytes per position (MLA: the two latents)
    pos0 = storage_positions(s, prompt_len, 0)                            # the prefill's storage
    ops = [["alloc", "residual", int(act["residual"])]]
    S = batch * s.heads * prompt_len**2                                    # eager's score elements
    for l in range(s.layers):
        if attention == "eager":
            # q and what else the attention holds beside its scores (none left in a post-norm MHA layer:
            # k and v are the cache's, and the hidden-size tensor it reads is the residual's)
            rest = int(act["attention"] - S * score_bytes(s, dtype, "cuda"))
            scores = eager_ops(config, l, batch * s.heads * prompt_len, prompt_len, dtype)
            attn = [["alloc", f"qkv{l}", rest], *scores, ["free", f"qkv{l}"]] if rest > 0 else scores
            mlp = int(act["mlp"] - S * b)
        else:
            attn = [["alloc", f"qkv{l}", int(act["attention"])], ["free", f"qkv{l}"]]
            mlp = int(act["mlp"])
        # the attention's norm: before it (pre-norm: its input), or after it (post-norm, OLMo-2: its output)
        norm = norm_ops(f"ln{l}", batch * prompt_len * s.hidden, b)
        ops += (norm + attn if lay.pre_norm else attn + norm) + [["free", f"ln{l}"]]
        if pos0[l]:               # a layer reading another layer's cache stores nothing
            ops += [["alloc", f"{kv}{l}_0", int(per_pos[kv] * pos0[l])] for kv in "KV"]
        ops += mlp_ops(f"mlp{l}", s, lay, batch * prompt_len, b, mlp)
        if attention == "eager":
            ops.append(["free", f"weights{l}"])
    return ops + _logits_ops(0, s, batch, b, score_copies) + [["free", "residual"]]


LLAMA_OPS = frozenset({"llama", "qwen2", "mistral"})
"""Model types whose prefill :func:`llama_prefill_ops` replays op by op: their modeling files in
transformers 5.17 (``modeling_llama.py``, ``modeling_qwen2.py``, ``modeling_mistral.py``) share
``*Model.forward``, ``*DecoderLayer.forward``, ``*Attention.forward``, ``apply_rotary_pos_emb``,
``*RotaryEmbedding.forward``, ``*RMSNorm``, ``*MLP`` and ``eager_attention_forward`` op for op (Qwen2:
biases on q, k, v, which ``addmm`` folds into the projection's one output; Mistral: a sliding-window
mask). Other model types keep the lumped replay of :func:`prefill_ops`."""


LLAMA_OPS_ATTENTIONS = ("eager",)
"""The attention implementations :func:`prefill_ops` replays op by op for :data:`LLAMA_OPS`. The SDPA
sequence of :func:`llama_prefill_ops` matches the recorded SDPA prefills too (every block of 200 KiB
or more, in order: ``tests/test_budget.py``) but is not switched on: a recorded SDPA row's reserved
memory can hold one large segment more or fewer depending on what ran before it in the process, which
a replay from an empty allocator cannot tell (README, "Reference results", the budget's item 5)."""

EMBEDDINGS_IN_MASK_KWARGS = frozenset({"qwen2"})
""":data:`LLAMA_OPS` model types whose ``*Model.forward`` builds its masks from a ``mask_kwargs`` dict
that holds ``inputs_embeds`` (``Qwen2Model.forward``): as the forward's frame is cleared, the masks
(``causal_mask_mapping``) go before the embeddings (``mask_kwargs``); Llama's and Mistral's frames drop
the argument ``inputs_embeds`` first (the recorded Qwen2.5-0.5B eager 8192 × 1 and SmolLM2-135M eager
512 × 16 prefills)."""


def follows_llama_ops(config, s: Shape, lay: Layout, prompt_len: int, attention: str) -> bool:
    """Whether :func:`llama_prefill_ops` replays this prefill: a :data:`LLAMA_OPS` model type with
    the Llama layout (separate q, k, v projections, no q/k norms, a dense gated pre-norm MLP with
    separate gate and up, one rotary table, no experts or latents), grouped KV heads that
    ``repeat_kv`` copies (``1 < kv_heads``; one KV head is a strided view that each ``matmul`` copies,
    :func:`repeat_kv_bytes`), every layer caching (full or sliding), and an attention whose ops are
    read: eager, or SDPA without a mask (``masking_utils._ignore_causal_mask_sdpa``: no window the
    prompt reaches), where the kernel takes grouped K and V as they are (``use_gqa_in_sdpa``) and
    writes its output already in the transposed layout. SDPA with a mask (``repeat_kv`` copies and the
    kernel's own mask handling) keeps the lumped replay."""
    caches = s.check_caches()
    if getattr(config, "model_type", "") not in LLAMA_OPS or s.mla or s.moe is not None or s.rope_tables != 1:
        return False
    if lay.fused_qkv or lay.qk_norm or lay.fused_gate_up or not (lay.gated_mlp and lay.pre_norm):
        return False
    if not (1 < s.kv_heads <= s.heads and s.heads % s.kv_heads == 0) or s.head_dim % 2:
        return False
    if any(c.kind not in ("full", "sliding") for c in caches):
        return False
    return attention == "eager" or not any(c.window is not None and prompt_len >= c.window for c in caches)


def llama_mask_kinds(config, s: Shape) -> list:
    """The causal masks a :data:`LLAMA_OPS` model's forward builds, in order (transformers 5.17):
    ``LlamaModel`` one full mask (``create_causal_mask``); ``MistralModel`` one, sliding when the
    config has a ``sliding_window`` (``create_sliding_window_causal_mask``, every layer then slides);
    ``Qwen2Model`` the full mask always and a sliding one when ``layer_types`` has sliding layers."""
    sliding = any(c.kind == "sliding" for c in s.check_caches())
    full = not sliding or getattr(config, "model_type", "") == "qwen2"
    return ["full"] * full + ["sliding"] * sliding


def causal_mask_ops(kind: str, batch: int, q: int, b: int | None) -> list:
    """The prefill's causal mask of one kind of layer (``"full"`` or ``"sliding"``) as
    ``masking_utils.sdpa_mask`` builds it over ``q`` positions from generate's 2-D mask of ones
    (transformers 5.17, ``masking_utils.py``): ``and_masks(mask_function, padding_mask_function)``
    evaluated by broadcasting. Each ``and_mask`` starts from a 0-d ``True`` and rebinds ``result = result
    & fn(...)``: the causal function's ``kv_idx <= q_idx`` (``q²`` bools) and its conjunction (``q²``);
    a sliding mask's function is itself ``and_masks(sliding_window_overlay, causal_mask_function)``,
    whose ``q²`` result the outer ``and_mask`` conjoins again; the padding function's
    ``padding_mask[batch_idx, kv_idx]`` (``batch·q``, small) widens the result to ``batch·q²``. With
    ``b`` (eager: ``eager_mask``) ``torch.where(mask, 0, min)`` makes the additive mask ``batch·q²·b``
    and drops the boolean one. Leaves ``mask.{kind}`` alive. (The index vectors and 0-d tensors, a few
    KiB, are left out.)"""
    q2, m = q * q, f"mask.{kind}"
    ops = [["alloc", f"{m}.causal", q2], ["alloc", f"{m}.and1", q2], ["free", f"{m}.causal"]]
    last = f"{m}.and1"
    if kind == "sliding":    # the inner and_mask: overlay, causal; then the outer result & it
        ops = [["alloc", f"{m}.window", q2], ["alloc", f"{m}.in1", q2], ["free", f"{m}.window"],
               ["alloc", f"{m}.causal", q2], ["alloc", f"{m}.in2", q2], ["free", f"{m}.causal"], ["free", f"{m}.in1"],
               ["alloc", f"{m}.and1", q2], ["free", f"{m}.in2"]]
    bool_mask = m if b is None else f"{m}.bool"
    ops += [["alloc", bool_mask, batch * q2], ["free", last]]
    if b is not None:
        ops += [["alloc", m, batch * q2 * b], ["free", bool_mask]]
    return ops


def rotary_table_ops(n: int, dim: int, b: int) -> list:
    """``LlamaRotaryEmbedding.forward`` over ``n`` token positions (``modeling_llama.py``): in fp32
    ``freqs = inv_freq @ position_ids`` (``n·dim/2``), ``emb = cat(freqs, freqs)``, ``emb.cos() *
    attention_scaling`` and ``emb.sin() * attention_scaling`` (each product drops its operand), then
    ``cos`` and ``sin`` cast to the model dtype (``n·dim·b`` each), the fp32 tensors dropped as the
    method returns. Leaves ``cos`` and ``sin`` alive for the whole forward."""
    f = n * dim * 4
    return [["alloc", "rope.freqs", f // 2], ["alloc", "rope.emb", f],
            ["alloc", "rope.cos32", f], ["alloc", "rope.cos32s", f], ["free", "rope.cos32"],
            ["alloc", "rope.sin32", f], ["alloc", "rope.sin32s", f], ["free", "rope.sin32"],
            ["alloc", "cos", n * dim * b], ["alloc", "sin", n * dim * b],
            ["free", "rope.freqs"], ["free", "rope.emb"], ["free", "rope.cos32s"], ["free", "rope.sin32s"]]


def rotate_ops(name: str, size: int) -> list:
    """``apply_rotary_pos_emb``'s ``(x * cos) + (rotate_half(x) * sin)`` on a ``size``-byte ``x``
    (``modeling_llama.py``): ``x·cos``, ``rotate_half``'s ``-x2`` (half) and ``torch.cat`` (the half
    dropped), ``·sin`` (the cat dropped), the sum (both products dropped). Leaves ``{name}.rot``."""
    t = {k: f"{name}.{k}" for k in ("cos", "neg", "half", "sin", "rot")}
    return [["alloc", t["cos"], size], ["alloc", t["neg"], size // 2], ["alloc", t["half"], size],
            ["free", t["neg"]], ["alloc", t["sin"], size], ["free", t["half"]],
            ["alloc", t["rot"], size], ["free", t["cos"]], ["free", t["sin"]]]


def llama_attention_ops(config, s: Shape, l: int, q: int, batch: int, attention: str, dtype, kv: list) -> list:
    """Layer ``l``'s ``LlamaAttention.forward`` over ``batch × q`` tokens (``modeling_llama.py``,
    transformers 5.17), from the normed input ``ln{l}``: ``q_proj``, ``k_proj``, ``v_proj``
    (``n·H·d``, ``n·K·d``, ``n·K·d``), the rotation of q then k (:func:`rotate_ops`; the projections of
    q and k dropped as the names are rebound), ``past_key_values.update`` (``kv``: the cache's
    ``torch.cat`` copies of K and V; the rotated k and the projected v dropped as the names are rebound
    to the cache's), then the attention: eager (``eager_attention_forward``) ``repeat_kv`` of K and V
    (``n·H·d`` each), ``torch.matmul``'s contiguous copy of q when ``batch > 1`` (q's batch and head
    strides do not fold; it is dropped once q·kᵀ exists), the score copies (:func:`eager_ops`),
    ``matmul(weights, v)`` and its ``transpose(1, 2).contiguous()`` (the first dropped), the repeated K
    and V dropped as the function returns; SDPA (``sdpa_attention_forward``, no mask: grouped K and V
    go in as they are) the kernel's output, already laid out as the transpose. Then ``o_proj``
    (``n·h``; the attention output dropped), and on return the rotated q. Leaves ``o{l}`` (and eager's
    ``weights{l}``) alive."""
    b, n, d = int(dtype_bytes(dtype)), batch * q, s.head_dim
    q_b, kv_b, o = n * s.heads * d * b, n * s.kv_heads * d * b, f"o{l}"
    ops = [["alloc", f"q{l}", q_b], ["alloc", f"k{l}", kv_b], ["alloc", f"v{l}", kv_b],
           *rotate_ops(f"q{l}", q_b), *rotate_ops(f"k{l}", kv_b), ["free", f"q{l}"], ["free", f"k{l}"],
           *kv, ["free", f"k{l}.rot"], ["free", f"v{l}"]]
    if attention == "eager":
        rep = [f"rk{l}", f"rv{l}"] if s.kv_heads < s.heads else []
        ops += [["alloc", r, q_b] for r in rep]
        scores = eager_ops(config, l, batch * s.heads * q, q, dtype)
        if batch > 1:
            ops += [["alloc", f"qc{l}", q_b], scores[0], ["free", f"qc{l}"], *scores[1:]]
        else:
            ops += scores
        ops += [["alloc", f"av{l}", q_b], ["alloc", f"attn{l}", q_b], ["free", f"av{l}"]]
        ops += [["free", r] for r in rep]
    else:
        ops.append(["alloc", f"attn{l}", q_b])
    return ops + [["alloc", o, n * s.hidden * b], ["free", f"attn{l}"], ["free", f"q{l}.rot"]]


def llama_layer_ops(config, s: Shape, lay: Layout, l: int, q: int, batch: int, attention: str, dtype, kv: list) -> list:
    """``LlamaDecoderLayer.forward`` of layer ``l`` over ``batch × q`` tokens (``modeling_llama.py``):
    the input norm (:func:`norm_ops`), the attention (:func:`llama_attention_ops`; the normed input
    dropped as it returns), ``residual + attn`` (``sum{l}``; the attention's output dropped), the MLP
    (:func:`mlp_ops`: its norm, gate, up, product, down) and ``residual + mlp`` (``out{l}``, made before
    the MLP's output is dropped); as the layer returns its ``sum{l}`` and eager's attention weights
    (bound to ``_``) are dropped. Leaves ``out{l}``; the layer's input is the caller's to drop."""
    b, n = int(dtype_bytes(dtype)), batch * q
    h_b, I_b = n * s.hidden * b, n * s.intermediate * b
    mlp = mlp_ops(f"mlp{l}", s, lay, n, b, 3 * I_b + h_b)
    assert mlp[-1] == ["free", f"mlp{l}.down"], mlp[-1]      # the dense gated MLP of follows_llama_ops
    ops = norm_ops(f"ln{l}", n * s.hidden, b) + llama_attention_ops(config, s, l, q, batch, attention, dtype, kv)
    ops += [["free", f"ln{l}"], ["alloc", f"sum{l}", h_b], ["free", f"o{l}"]]
    ops += mlp[:-1] + [["alloc", f"out{l}", h_b], ["free", f"mlp{l}.down"], ["free", f"sum{l}"]]
    return ops + ([["free", f"weights{l}"]] if attention == "eager" else [])


def llama_prefill_ops(config, s: Shape, lay: Layout, prompt_len: int, batch: int, attention: str, dtype,
                      score_copies: int = 0) -> list:
    """The prefill of a :data:`LLAMA_OPS` model op by op, as ``LlamaForCausalLM.forward`` and
    ``LlamaModel.forward`` make and drop its tensors (``modeling_llama.py``, transformers 5.17): the
    embeddings ``emb`` (``n·h``, held by the forward to its end), the causal masks (eager: one additive
    mask per kind of layer, :func:`causal_mask_ops`; SDPA: none), ``cos`` and ``sin``
    (:func:`rotary_table_ops`), each layer (:func:`llama_layer_ops`, the cache's K and V copies made in
    its attention) with the previous layer's output dropped as the loop rebinds ``hidden_states``, the
    final norm (the last layer's output dropped), then embeddings, masks and rotary tables dropped as
    the model returns, the last position's logits (the final norm's output dropped with the model's
    output) and generate's fp32 copies (:func:`_logits_ops`). Checked against the recorded events of
    SmolLM2-135M eager 512 × 16, Qwen2.5-0.5B eager 8192 × 1, Llama-3.2-1B eager 2048 × 1,
    Qwen2.5-0.5B SDPA 8192 × 2 and Mistral-7B SDPA 512 × 1 (``results/h200/alloc_events_*.json.gz``)."""
    b = int(dtype_bytes(dtype))
    n = batch * prompt_len
    per_pos = dict(zip("KV", (x * batch for x in kv_tensor_bytes(s, b))))
    pos0 = storage_positions(s, prompt_len, 0)
    kinds = llama_mask_kinds(config, s) if attention == "eager" else []
    ops = [["alloc", "emb", n * s.hidden * b]]
    for kind in kinds:
        ops += causal_mask_ops(kind, batch, prompt_len, b)
    ops += rotary_table_ops(n, s.head_dim, b)
    x = "emb"
    for l in range(s.layers):
        kv = [["alloc", f"{k}{l}_0", int(per_pos[k] * pos0[l])] for k in "KV"]
        ops += llama_layer_ops(config, s, lay, l, prompt_len, batch, attention, dtype, kv)
        if x != "emb":
            ops.append(["free", x])
        x = f"out{l}"
    masks = [["free", f"mask.{kind}"] for kind in kinds]
    emb = [["free", "emb"]]
    ops += norm_ops("final", n * s.hidden, b) + [["free", x]]
    ops += (masks + emb if config.model_type in EMBEDDINGS_IN_MASK_KWARGS else emb + masks) + [["free", "cos"], ["free", "sin"]]
    logits = _logits_ops(0, s, batch, b, score_copies)
    return ops + logits[:1] + [["free", "final"]] + logits[1:]


def _logits_ops(t: int, s: Shape, batch: int, b: int, score_copies: int) -> list:
    """Step ``t``'s last-position logits in the model dtype, generate's fp32 copy ``carried{t}`` and the
    processors' ``score_copies`` copies of it (``torch.where``), the previous step's freed as they are
    rebound; the logits themselves are freed with the model's output."""
    fp32 = batch * s.vocab * 4
    ops = [["alloc", f"logits{t}", batch * s.vocab * b], ["alloc", f"carried{t}", fp32]]
    if t:
        ops.append(["free", f"carried{t - 1}"])
    for c in range(score_copies):
        ops.append(["alloc", f"processed{t}.{c}", fp32])
        if t:
            ops.append(["free", f"processed{t - 1}.{c}"])
    return ops + [["free", f"logits{t}"]]


def decode_ops(s: Shape, lay: Layout, prompt_len: int, new_tokens: int, batch: int, attention: str, dtype,
               score_copies: int = 0) -> list:
    """Every decode step fed back to the model (``new_tokens − 1``; the last generated token never is):
    its one-position residual, per layer the step's attention transients with ``torch.cat`` of the
    layer's K and V one position longer (each at its own width — MLA's two latents, ``kv_lora_rank``
    and the rotary key, are two tensors of different sizes; a new block, the old one freed: a full layer's
    ``DynamicLayer.update`` rebinds ``self.keys`` before V's ``cat``, so the old K is free when the
    new V is placed; a sliding or chunked layer's ``DynamicSlidingWindowLayer.update`` makes both
    ``cat`` results before it rebinds either — transformers 5.17, ``cache_utils.py`` lines 146–147
    and 251–258; eager's ``repeat_kv`` copy of the whole K and V when ``kv_heads < heads``,
    :func:`repeat_kv_bytes`; MLA's keys and values expanded from the cached latents, each its own
    tensor, :func:`mla_expand_bytes`) and the MLP's (with a
    mixture of experts' gathered weights, :func:`decode_gather`), then :func:`_logits_ops`. The
    generate's scores are freed after the last step."""
    b = int(dtype_bytes(dtype))
    one = block_transients(s, lay, 1, batch, dtype, "sdpa", "cuda", cached=True)
    per_pos = dict(zip("KV", (x * batch for x in kv_tensor_bytes(s, b))))
    gather = int(decode_gather(s, lay, batch, b))
    caches = s.check_caches()
    ops = []
    for t in range(1, new_tokens):
        pos = storage_positions(s, prompt_len, t)
        ops.append(["alloc", f"res{t}", int(one["residual"])])
        for l in range(s.layers):
            ops.append(["alloc", f"att{t}.{l}", int(one["attention"])])
            if pos[l]:
                new = [["alloc", f"{kv}{l}_{t}", int(per_pos[kv] * pos[l])] for kv in "KV"]
                old = [["free", f"{kv}{l}_{t - 1}"] for kv in "KV"]
                ops += new + old if caches[l].window is not None else [new[0], old[0], new[1], old[1]]
            rep = int(repeat_kv_bytes(s, batch * (pos[l] or max(pos)), b)) if attention == "eager" else 0
            if rep:
                ops += [["alloc", f"rep{t}.{l}", rep], ["free", f"rep{t}.{l}"]]
            expand = [x for x in mla_expand_bytes(s, batch, pos[l] or max(pos), b, attention) if x]
            ops += [["alloc", f"mla{t}.{l}.{i}", int(x)] for i, x in enumerate(expand)]
            ops += [["free", f"mla{t}.{l}.{i}"] for i in range(len(expand))]
            ops += [["free", f"att{t}.{l}"], ["alloc", f"mlp{t}.{l}", int(one["mlp"])]]
            if gather and l in s.moe.sparse_layers:   # batched_mm's gathered expert weights: gate|up, then down
                up = gather * 2 // 3
                ops += [["alloc", f"moe_up{t}.{l}", up], ["alloc", f"moe_down{t}.{l}", gather - up],
                        ["free", f"moe_up{t}.{l}"], ["free", f"moe_down{t}.{l}"]]
            ops.append(["free", f"mlp{t}.{l}"])
        ops += _logits_ops(t, s, batch, b, score_copies) + [["free", f"res{t}"]]
    last = new_tokens - 1
    return ops + [["free", f"carried{last}"]] + [["free", f"processed{last}.{c}"] for c in range(score_copies)]


def decode_allocated(config, prompt_len: int, new_tokens: int, batch: int = 1, attention: str = "sdpa",
                     dtype=torch.bfloat16, score_copies: int = 0) -> int:
    """The simulated peak of ``max_memory_allocated`` inside the decode steps' forward calls over what
    was allocated when ``generate`` started (the weights) — what ``measure_generate``'s
    ``decode_meas`` reads with hooks on the model: the allocator's *blocks* (a large-pool block is
    split only when more than 1 MiB would remain, so a K or V just over 1 MiB can take a whole
    remainder), which the budget's tensor-level ``decode`` (:func:`helpers.budget.generation_peak`)
    does not see."""
    return _replay(config, prompt_len, new_tokens, batch, attention, dtype, score_copies)["decode_allocated"]


def _replay(config, prompt_len, new_tokens, batch, attention, dtype, score_copies) -> dict:
    """One simulation of :func:`generation_phases`: the reserved memory at the end and the decode
    forwards' allocated peak over the weights (a step's forward runs from its ``res{t}`` to its
    ``logits{t}``; generate's fp32 copies are made between forwards)."""
    w, pre, dec = generation_phases(config, prompt_len, new_tokens, batch, attention, dtype, score_copies)
    sim = simulate(w + pre + dec)
    trace = sim["trace"]
    start = trace[len(w) - 1][0] if w else 0
    peak, inside = start, False
    for op, (allocated, _) in zip(dec, trace[len(w) + len(pre):]):
        if op[0] == "alloc" and op[1].startswith("res"):
            inside = True
        if inside:
            peak = max(peak, allocated)
        if op[0] == "alloc" and op[1].startswith("logits"):
            inside = False
    return {"reserved": sim["reserved"], "decode_allocated": peak - start}


def device_footprint(config, prompt_len: int, new_tokens: int, batch: int = 1, non_torch_bytes: int = 0,
                     attention: str = "sdpa", dtype=torch.bfloat16, workspace_bytes: int = 0,
                     score_copies: int = 0) -> dict:
    """What ``nvidia-smi`` should show for the process after ``generate``: the memory outside PyTorch's
    allocator (CUDA context, loaded kernels, library handles: ``non_torch_bytes``, measured once per
    process after a warm-up, :func:`helpers.measure.non_torch_bytes` — vLLM's "non-torch memory")
    plus the allocator's *reserved* memory: the cuBLAS/cuBLASLt workspaces the first matmuls took
    through the allocator (``workspace_bytes``, :func:`helpers.measure.warmup_cublas`) and the replay
    of :func:`generation_ops` through the allocator simulator (the weights, the prefill's blocks, the
    KV cache growing by ``torch.cat``, every decode step's transients and generate's fp32 scores,
    ``score_copies`` of them processed). Also ``decode_allocated`` from the same replay
    (:func:`decode_allocated`). Checked by ``benchmarks/budget_accuracy.py`` (``smi_pred`` vs
    ``smi_meas``, ``decode_blocks_pred`` vs ``decode_meas``)."""
    for name, v in (("non_torch_bytes", non_torch_bytes), ("workspace_bytes", workspace_bytes)):
        try:
            non_negative_int(v, name)
        except ValueError:
            raise ValueError(f"{name} must be bytes ≥ 0 (measured by helpers.measure."
                             f"{'non_torch_bytes' if name == 'non_torch_bytes' else 'warmup_cublas'}), "
                             f"got {v!r}") from None
    non_torch_bytes, workspace_bytes = int(non_torch_bytes), int(workspace_bytes)
    replay = _replay(config, prompt_len, new_tokens, batch, attention, dtype, score_copies)
    reserved = workspace_bytes + replay["reserved"]
    return {"non_torch": non_torch_bytes, "reserved": reserved, "total": non_torch_bytes + reserved,
            "decode_allocated": replay["decode_allocated"]}
