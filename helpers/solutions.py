"""Solutions to the notebooks' "your turn" exercises. Learners: try first — the notebooks check your
version against the course's helpers; CI (the ``ci`` profile) runs these so every notebook runs end to end."""
from __future__ import annotations

import torch


def w4_gemv(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> torch.Tensor:
    """08: ``y = Σ_g s_g · (Σ_{k∈g} x_k q_k − z_g · Σ_{k∈g} x_k)`` — the scale applied once per group."""
    n, k = codes.shape
    q = codes.float().reshape(n, k // group, group)
    xg = x.float().reshape(k // group, group)
    dots = (q * xg).sum(-1)                       # [n, groups]: Σ x·q per group
    return (scale.float() * (dots - zero.float() * xg.sum(-1))).sum(-1)


def narrow_split(tiles: int, steps: int, sms: int, warps: int, per_sm: int) -> int:
    """08: the divisor ``d`` of ``steps`` nearest in ratio to ``per_sm · sms / (tiles · warps)``."""
    import math
    target = per_sm * sms / (max(tiles, 1) * warps)
    return min((d for d in range(1, steps + 1) if steps % d == 0), key=lambda d: abs(math.log(d / target)))


def programs_per_sm(registers: int, warps: int) -> int:
    """08: programs of ``warps`` warps at ``registers`` per thread one H100 SM holds: registers go to a warp in
    units of 256 from one of four register files of 16,384; at most 64 warps and 32 programs."""
    per_warp = -(-registers * 32 // 256) * 256
    return min(4 * (16384 // per_warp) // warps, 64 // warps, 32)


def kv_pool_blocks(usable: float, weights: float, activation_peak: float, non_torch: float,
                   bytes_per_token: int, block_size: int = 16) -> int:
    """09 repair: vLLM's KV blocks are what is left after weights, activations and non-torch memory."""
    return int((usable - weights - activation_peak - non_torch) // (bytes_per_token * block_size))


def correct_vocab_check(tokenizer_len: int, embedding_rows: int) -> bool:
    """09 repair: every token id must have an embedding row; extra (padded) rows are fine."""
    return tokenizer_len <= embedding_rows


def free_after_loop(tensors: list) -> None:
    """09 repair: the list holds the references, so empty it (deleting the loop variable frees nothing)."""
    tensors.clear()


def param_count(vocab: int, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
                tied: bool) -> int:
    """00: a Llama-style decoder's parameters from its config: embeddings, per layer q/k/v/o + gate/up/down
    + two RMSNorms, the final norm, and the LM head unless tied to the embeddings."""
    head_dim = hidden // heads
    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    mlp = 3 * hidden * intermediate
    return vocab * hidden * (1 if tied else 2) + layers * (attn + mlp + 2 * hidden) + hidden


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, seq_len: int, batch: int, bytes_per_value: float) -> float:
    """01: keys and values of every layer, KV head, position and sequence."""
    return 2 * layers * kv_heads * head_dim * seq_len * batch * bytes_per_value


def round_alloc(size: int) -> int:
    """02: the caching allocator rounds every request up to a multiple of 512 bytes (512 at least)."""
    return max(512, 512 * ((size + 511) // 512))


def group_fake_quant(w, bits: int, group: int):
    """03: asymmetric round-to-nearest per group of ``group`` columns, dequantized back."""
    import torch
    rows, cols = w.shape
    g = w.float().reshape(rows, cols // group, group)
    lo, hi = g.amin(-1, keepdim=True).clamp(max=0), g.amax(-1, keepdim=True).clamp(min=0)
    qmax = 2 ** bits - 1
    scale = ((hi - lo) / qmax).clamp(min=1e-8)
    zero = torch.round(-lo / scale)
    q = torch.clamp(torch.round(g / scale) + zero, 0, qmax)
    return ((q - zero) * scale).reshape(rows, cols)


def gptq_column_step(W1, Hinv1, i: int, q):
    """04: GPTQ's error feedback for column ``i`` already quantized to ``q``: the error, divided by the
    inverse Hessian's diagonal, is spread over the later columns (Frantar et al. 2022, Algorithm 1)."""
    err = (W1[:, i] - q) / Hinv1[i, i]
    W1[:, i:] -= err[:, None] @ Hinv1[i, i:][None, :]
    return W1


def awq_alpha_error(w, X, alpha: float, bits: int, group: int) -> float:
    """05: the output error of one linear for one α: ``s = mean|x|^α`` (normalised), quantize ``W·diag(s)``,
    undo the scale, and measure ``‖X (Ŵ − W)ᵀ‖² / (tokens · outputs)`` (Lin et al. 2023, eq. 5)."""
    s = X.abs().mean(0).pow(alpha).clamp(min=1e-4)
    s = s / (s.max() * s.min()).sqrt()
    E = group_fake_quant(w * s, bits, group) / s - w
    return ((X @ E.T) ** 2).sum().item() / (X.shape[0] * w.shape[0])


def ppl_from_logits(logits, tokens) -> float:
    """06: ``exp`` of the mean negative log-likelihood of ``tokens[1:]`` under ``logits[:-1]``."""
    import torch
    nll = -torch.log_softmax(logits[:-1].double(), -1).gather(-1, tokens[1:, None]).mean()
    return float(torch.exp(nll))


def int4_kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, group: int) -> float:
    """07: an INT4 KV cache stores half a byte per value plus an fp16 scale and an fp16 minimum per group
    of ``group`` values, for K and V of every layer and KV head."""
    return 2 * layers * kv_heads * (head_dim / 2 + (head_dim // group) * 4)


def diagnose_snapshot(snapshot: list, request: int, cap: int) -> str:
    """09 diagnosis: what an allocation of ``request`` bytes meets, from a memory snapshot (segments
    and their blocks, ``torch.cuda.memory_snapshot()``'s shape) and the allocator cap: ``"fits"`` when a
    free block holds it or a new segment stays under the cap, ``"fragmentation"`` when it fails although
    the free cached bytes add up to it, ``"too-big"`` when they do not."""
    reserved = sum(s["total_size"] for s in snapshot)
    blocks = [b for s in snapshot for b in s["blocks"]]
    free = [b["size"] for b in blocks if not b["state"].startswith("active")]
    if max(free, default=0) >= request or reserved + request <= cap:
        return "fits"
    return "fragmentation" if sum(free) >= request else "too-big"


def tp_kv_bytes_per_rank(layers: int, kv_heads: int, head_dim: int, tp: int, tokens: int,
                         bytes_per_value: float) -> float:
    """10: one GPU's KV cache under tensor parallelism of degree ``tp``: each rank keeps
    ``max(1, kv_heads / tp)`` KV heads — with fewer KV heads than ranks, a head is replicated, not split
    (vLLM's QKVParallelLinear)."""
    return 2 * layers * max(1, kv_heads // tp) * head_dim * tokens * bytes_per_value
