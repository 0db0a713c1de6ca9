"""The allocator replay: instantiate + ``generate`` as a sequence of allocations, through the
caching-allocator simulator of notebook 02.

:func:`weight_ops` / :func:`weight_allocation` (the parameters and buffers in creation order),
:func:`generation_ops` (the prefill layer by layer, then every decode step's ``torch.cat``), and
:func:`device_footprint` (what ``nvidia-smi`` should show). The sizes come from
:mod:`helpers.budget_activations` and :mod:`helpers.budget_kv`; the simulator adds the order, hence
which blocks the allocator can reuse. Source: PyTorch's ``CUDACachingAllocator.cpp`` through
:mod:`helpers.allocator_sim`.
"""
from __future__ import annotations

import torch

from .allocator_sim import simulate
from .budget_activations import block_transients, decode_gather, score_bytes
from .budget_inputs import ATTENTIONS, choice, dtype_bytes, non_negative_int, positive_int
from .budget_kv import position_bytes, storage_positions
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
    segments there, ``results/h200/alloc_events_points_2026-12-02.json.gz``). Other MLPs (fused
    gate|up, ungated, post-norm, experts): one block of ``mlp_bytes``."""
    I_b, h_b = n * s.intermediate * b, n * s.hidden * b
    if not (s.has_dense_mlp and lay.gated_mlp and lay.pre_norm and not lay.fused_gate_up
            and mlp_bytes == 3 * I_b + h_b):
        return [["alloc", name, mlp_bytes], ["free", name]]
    t = {k: f"{name}.{k}" for k in ("normed", "gate", "act", "up", "prod", "down")}
    return norm_ops(t["normed"], n * s.hidden, b) + [
        ["alloc", t["gate"], I_b], ["alloc", t["act"], I_b], ["free", t["gate"]],
        ["alloc", t["up"], I_b], ["alloc", t["prod"], I_b], ["free", t["act"]], ["free", t["up"]],
        ["alloc", t["down"], h_b], ["free", t["prod"]], ["free", t["normed"]], ["free", t["down"]]]


def generation_ops(config, prompt_len: int, new_tokens: int, batch: int = 1, attention: str = "sdpa",
                   dtype=torch.bfloat16) -> list:
    """The allocations of one ``generate`` call with a dynamic cache, as allocator-simulator ops: the
    weights (:func:`weight_ops`), then the prefill layer by layer — the attention transients
    (eager: the score matrix's copies in the order ``eager_attention_forward`` makes them: q·kᵀ, ×
    scaling, + mask, the fp32 copy and the fp32 softmax, the ``.to(dtype)`` weights kept while the MLP
    runs), the layer's K and V (kept by the cache), the MLP transients — then every decode step's
    ``torch.cat`` of each layer's K and V one position longer (a new block, the old one freed). Each
    attention comes with its RMSNorm's fp32 copies (:func:`norm_ops`: before it, or after it in a
    post-norm layer), and a dense gated MLP is its separate tensors (:func:`mlp_ops`). The
    sizes come from :func:`block_transients` and the KV storage; what the simulator adds is the
    *order*, hence which blocks the caching allocator can reuse and which make it reserve more."""
    prompt_len, new_tokens = positive_int(prompt_len, "prompt_len"), positive_int(new_tokens, "new_tokens")
    batch, attention = positive_int(batch, "batch"), choice(attention, "attention", ATTENTIONS)
    dtype = parse_dtype(dtype)
    s = Shape.from_config(config)
    model = meta_model(config, dtype)
    lay = Layout.from_model(model, s)
    b = int(dtype_bytes(dtype))
    act = block_transients(s, lay, prompt_len, batch, dtype, attention, "cuda")
    logits = batch * s.vocab * (b + 4)
    per_pos = position_bytes(s, b) * batch / 2                          # K (or V) bytes per position
    pos0 = storage_positions(s, prompt_len, 0)                            # the prefill's storage
    ops = _tensor_ops(model)
    ops.append(["alloc", "residual", int(act["residual"])])
    S = batch * s.heads * prompt_len**2                                    # eager's score elements
    for l in range(s.layers):
        if attention == "eager":
            rest = int(act["attention"] - S * score_bytes(s, dtype, "cuda"))
            attn = [["alloc", f"qkv{l}", rest],
                    ["alloc", f"qk{l}", S * b], ["alloc", f"scaled{l}", S * b], ["free", f"qk{l}"],
                    ["alloc", f"masked{l}", S * b], ["free", f"scaled{l}"],
                    ["alloc", f"fp32{l}", S * 4], ["alloc", f"softmax{l}", S * 4], ["free", f"fp32{l}"],
                    ["free", f"masked{l}"], ["alloc", f"weights{l}", S * b], ["free", f"softmax{l}"],
                    ["free", f"qkv{l}"]]
            mlp = int(act["mlp"] - S * b)
        else:
            attn = [["alloc", f"qkv{l}", int(act["attention"])], ["free", f"qkv{l}"]]
            mlp = int(act["mlp"])
        # the attention's norm: before it (pre-norm: its input), or after it (post-norm, OLMo-2: its output)
        norm = norm_ops(f"ln{l}", batch * prompt_len * s.hidden, b)
        ops += (norm + attn if lay.pre_norm else attn + norm) + [["free", f"ln{l}"]]
        if pos0[l]:               # a layer reading another layer's cache stores nothing
            ops += [["alloc", f"K{l}_0", int(per_pos * pos0[l])], ["alloc", f"V{l}_0", int(per_pos * pos0[l])]]
        ops += mlp_ops(f"mlp{l}", s, lay, batch * prompt_len, b, mlp)
        if attention == "eager":
            ops.append(["free", f"weights{l}"])
    ops += [["alloc", "logits", int(logits)], ["free", "logits"], ["free", "residual"]]
    gather = int(decode_gather(s, lay, batch, b))
    for t in range(1, new_tokens):        # the last generated token is never fed back
        pos = storage_positions(s, prompt_len, t)
        if gather:             # batched_mm's gathered expert weights: gate|up, then down while gate|up is bound
            up = gather * 2 // 3
            ops += [["alloc", f"moe_up{t}", up], ["alloc", f"moe_down{t}", gather - up],
                    ["free", f"moe_up{t}"], ["free", f"moe_down{t}"]]
        for l in (l for l in range(s.layers) if pos[l]):
            for kv in "KV":
                ops += [["alloc", f"{kv}{l}_{t}", int(per_pos * pos[l])], ["free", f"{kv}{l}_{t - 1}"]]
    return ops


def device_footprint(config, prompt_len: int, new_tokens: int, batch: int = 1, non_torch_bytes: int = 0,
                     attention: str = "sdpa", dtype=torch.bfloat16, workspace_bytes: int = 0) -> dict:
    """What ``nvidia-smi`` should show for the process after ``generate``: the memory outside PyTorch's
    allocator (CUDA context, loaded kernels, library handles: ``non_torch_bytes``, measured once per
    process after a warm-up, :func:`helpers.measure.non_torch_bytes` — vLLM's "non-torch memory")
    plus the allocator's *reserved* memory: the cuBLAS/cuBLASLt workspaces the first matmuls took
    through the allocator (``workspace_bytes``, :func:`helpers.measure.warmup_cublas`) and the replay
    of :func:`generation_ops` through the allocator simulator (the weights, the prefill's blocks, the
    KV cache growing by ``torch.cat``).
    Checked by ``benchmarks/budget_accuracy.py`` (``smi_pred`` vs ``smi_meas``)."""
    for name, v in (("non_torch_bytes", non_torch_bytes), ("workspace_bytes", workspace_bytes)):
        try:
            non_negative_int(v, name)
        except ValueError:
            raise ValueError(f"{name} must be bytes ≥ 0 (measured by helpers.measure."
                             f"{'non_torch_bytes' if name == 'non_torch_bytes' else 'warmup_cublas'}), "
                             f"got {v!r}") from None
    non_torch_bytes, workspace_bytes = int(non_torch_bytes), int(workspace_bytes)
    reserved = workspace_bytes + simulate(generation_ops(config, prompt_len, new_tokens, batch, attention, dtype))["reserved"]
    return {"non_torch": non_torch_bytes, "reserved": reserved, "total": non_torch_bytes + reserved}
