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
