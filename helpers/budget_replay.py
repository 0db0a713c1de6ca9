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


def generation_ops(config, prompt_len: int, new_tokens: int, batch: int = 1, attention: str = "sdpa",
                   dtype=torch.bfloat16) -> list:
    """The allocations of one ``generate`` call with a dynamic cache, as allocator-simulator ops: the
    weights (:func:`weight_ops`), then the prefill layer by layer — the attention transients
    (eager: the score matrix's copies in the order ``eager_attention_forward`` makes them: q·kᵀ, ×
    scaling, + mask, the fp32 copy and the fp32 softmax, the ``.to(dtype)`` weights kept while the MLP
    runs), the layer's K and V (kept by the cache), the MLP transients — then every decode step's
    ``torch.cat`` of each layer's K and V one position longer (a new block, the old one freed). The
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
        if pos0[l]:               # a layer reading another layer's cache stores nothing
            ops += [["alloc", f"K{l}_0", int(per_pos * pos0[l])], ["alloc", f"V{l}_0", int(per_pos * pos0[l])]]
        ops += [["alloc", f"mlp{l}", mlp], ["free", f"mlp{l}"]]
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
