"""Decode attention as serving engines run it: one new token per sequence against its whole KV cache,
the cache's length split across programs (Flash-Decoding), in Triton.

At a decode step each sequence brings one query row per head; the keys and values are the cache,
``L`` positions long. One program per (sequence, KV head) would leave most multiprocessors idle at
batch 1 (Llama-3.1-8B: 8 KV heads), so the cache is cut into ``splits`` chunks and every chunk gets
its own program (Dao, Haziza, Massa and Sizov, "Flash-Decoding for long-context inference", 2023):

    for chunk c:   m_c = max_j s_j,   l_c = Σ_j e^(s_j − m_c),   o_c = Σ_j e^(s_j − m_c) · v_j
                   (s_j = q·k_j · scale over the chunk's positions j, masked ones left out)
    then           M = max_c m_c,     out = Σ_c e^(m_c − M) · o_c  /  Σ_c e^(m_c − M) · l_c

which is ``softmax(q Kᵀ · scale + mask) V`` exactly (the online softmax of FlashAttention, with the
chunks combined by a second kernel). The query heads that share a KV head (grouped-query attention)
are one 16-row tile of ``tl.dot``, so each key is read once for all of them.

``mask`` is the boolean mask SDPA takes (``True``: attend), broadcast over heads: with a static cache
it is what leaves the cache's empty positions out. :func:`use` registers the kernel with transformers
as the attention implementation ``"course_decode"`` (its ``AttentionInterface``; more than one query
row — the prefill — goes to transformers' own SDPA path). The reference is
``torch.nn.functional.scaled_dot_product_attention``; the tests compare them in Triton's interpreter.
"""
from __future__ import annotations

import math
import os

import torch

try:  # Triton is optional: CPU installs without it still import this module (the kernel then refuses)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None

NAME = "course_decode"
BLOCK_L = 64         # cache positions per inner step of a program
HEAD_TILE = 16       # query heads per program: tl.dot's smallest tile (a KV head's group is padded to it)
_KERNELS: dict = {}


def _attention_partials_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, ml_ptr, L, H_KV, GROUP, CHUNK, scale,
                     sq_b, sq_h, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, sm_b, sm_l,
                     D: tl.constexpr, BLOCK_L: tl.constexpr, HEAD_TILE: tl.constexpr, HAS_MASK: tl.constexpr,
                     DOT_DT: tl.constexpr, PREC: tl.constexpr):
    """One chunk of one (sequence, KV head, tile of its query heads): the chunk's ``m``, ``l`` and
    un-normalised ``o`` (module docstring), written to ``ml`` and ``o`` at [row, split]."""
    bh, split, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_splits = tl.num_programs(1)
    b, hk = (bh // H_KV).to(tl.int64), bh % H_KV      # 64-bit offsets: a batch of long caches passes 2^31 elements
    g = tile * HEAD_TILE + tl.arange(0, HEAD_TILE)                 # query heads within the KV head's group
    g_ok = g < GROUP
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * sq_b + (hk * GROUP + g)[:, None] * sq_h + d[None, :], mask=g_ok[:, None], other=0.0)
    q = (q.to(tl.float32) * scale).to(DOT_DT)
    m_i = tl.full([HEAD_TILE], -1e30, tl.float32)   # finite: a chunk with every position masked stays 0 / 0-free
    l_i = tl.zeros([HEAD_TILE], tl.float32)
    acc = tl.zeros([HEAD_TILE, D], tl.float32)
    start = split * CHUNK
    for j0 in range(start, tl.minimum(start + CHUNK, L), BLOCK_L):
        j = j0 + tl.arange(0, BLOCK_L)
        ok = (j < start + CHUNK) & (j < L)
        if HAS_MASK:
            ok = ok & (tl.load(mask_ptr + b * sm_b + j * sm_l, mask=ok, other=0) != 0)
        k = tl.load(k_ptr + b * sk_b + hk * sk_h + j[:, None] * sk_l + d[None, :], mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k.to(DOT_DT)), input_precision=PREC)                       # [HEAD_TILE, BLOCK_L], fp32
        s = tl.where(ok[None, :], s, -1e30)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.where(ok[None, :], tl.exp(s - m_new[:, None]), 0.0)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_ptr + b * sv_b + hk * sv_h + j[:, None] * sv_l + d[None, :], mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DT), v.to(DOT_DT), input_precision=PREC)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    row = (b * H_KV + hk) * GROUP + g                               # the query head's row of the outputs
    at = row * n_splits + split
    tl.store(o_ptr + at[:, None] * D + d[None, :], acc, mask=g_ok[:, None])
    tl.store(ml_ptr + at * 2, m_i, mask=g_ok)
    tl.store(ml_ptr + at * 2 + 1, l_i, mask=g_ok)


def _attention_combine_kernel(o_ptr, ml_ptr, out_ptr, SPLITS, D: tl.constexpr, SPLITS_P2: tl.constexpr):
    """One query head's output: its chunks' partials combined (module docstring), in ``out``'s dtype."""
    row = tl.program_id(0)
    c = tl.arange(0, SPLITS_P2)
    c_ok = c < SPLITS
    m = tl.load(ml_ptr + (row * SPLITS + c) * 2, mask=c_ok, other=-1e30)
    lse = tl.load(ml_ptr + (row * SPLITS + c) * 2 + 1, mask=c_ok, other=0.0)
    w = tl.where(c_ok, tl.exp(m - tl.max(m, 0)), 0.0)
    d = tl.arange(0, D)
    o = tl.load(o_ptr + (row * SPLITS + c)[:, None] * D + d[None, :], mask=c_ok[:, None], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(lse * w, 0)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty))


def _kernel(name: str):
    if triton is None:
        raise RuntimeError("decode attention needs Triton: pip install triton (Linux), or use SDPA")
    if name not in _KERNELS:
        _KERNELS[name] = triton.jit({"partials": _attention_partials_kernel, "combine": _attention_combine_kernel}[name])
    return _KERNELS[name]


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def num_splits(rows: int, length: int, sms: int) -> int:
    """Chunks per (sequence, KV head, head tile): enough programs for two per multiprocessor over the
    ``rows`` programs there already are, each chunk at least :data:`BLOCK_L` positions long."""
    return max(1, min(math.ceil(length / BLOCK_L), math.ceil(2 * sms / max(rows, 1))))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                     scale: float | None = None, splits: int | None = None) -> torch.Tensor:
    """``softmax(q kᵀ · scale + mask) v`` for one query position: ``q[B, H, 1, D]``, ``k, v[B, H_kv, L, D]``
    (``H`` a multiple of ``H_kv``: grouped-query heads share their KV head), ``mask`` a boolean
    ``[B, 1, 1, L]`` (``True``: attend; SDPA's boolean mask) or None (every position), ``scale``
    default ``1/√D``. Returns ``[B, H, 1, D]`` in ``q``'s dtype. ``splits``: chunks of the cache
    (default :func:`num_splits`). Without CUDA it runs in Triton's interpreter (small shapes)."""
    if q.dim() != 4 or q.shape[2] != 1:
        raise ValueError(f"q must be [batch, heads, 1, head_dim] (one decode position), got {tuple(q.shape)}")
    if k.dim() != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"k and v must both be [batch={q.shape[0]}, kv_heads, length, head_dim={q.shape[3]}], "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")
    bsz, heads, _, dim = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"q's {heads} heads must be a multiple of k's {kv_heads} KV heads")
    if dim & (dim - 1) or dim < 16:
        raise ValueError(f"head_dim must be a power of two ≥ 16 for this kernel, got {dim}")
    if mask is not None:
        if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1 \
                or mask.shape[3] != length or mask.shape[0] not in (1, bsz):
            raise ValueError(f"mask must be a boolean [batch, 1, 1, {length}] (SDPA's), got "
                             f"{mask.dtype} {tuple(mask.shape)}")
    if q.device.type != "cuda" and not _interpreted():
        raise RuntimeError("without CUDA the kernel runs only in Triton's interpreter: call "
                           "helpers.device.use_triton_interpreter_without_gpu() before anything imports triton")
    group = heads // kv_heads
    tiles = math.ceil(group / HEAD_TILE)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 8
    splits = splits or num_splits(bsz * kv_heads * tiles, length, sms)
    chunk = math.ceil(math.ceil(length / splits) / BLOCK_L) * BLOCK_L
    splits = math.ceil(length / chunk)
    q = q.contiguous()
    k, v = (t if t.stride(3) == 1 else t.contiguous() for t in (k, v))   # each position's head_dim values adjacent
    o = torch.empty(bsz * heads, splits, dim, dtype=torch.float32, device=q.device)
    ml = torch.empty(bsz * heads, splits, 2, dtype=torch.float32, device=q.device)
    out = q.new_empty(q.shape)
    m = mask if mask is not None else q
    sm_b = (m.stride(0) if m.shape[0] > 1 else 0) if mask is not None else 0
    # Triton's interpreter multiplies bf16 tiles wrongly (NumPy has no bf16): there the tiles are fp32
    dot_dt = tl.float32 if _interpreted() or q.dtype == torch.float32 else \
        tl.bfloat16 if q.dtype == torch.bfloat16 else tl.float16
    _kernel("partials")[(bsz * kv_heads, splits, tiles)](
        q, k, v, m, o, ml, length, kv_heads, group, chunk, scale if scale is not None else dim ** -0.5,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        sm_b, m.stride(3) if mask is not None else 0,
        D=dim, BLOCK_L=BLOCK_L, HEAD_TILE=HEAD_TILE, HAS_MASK=mask is not None, DOT_DT=dot_dt,
        PREC="ieee" if q.dtype == torch.float32 else "tf32")   # fp32 stays fp32 (not TF32)
    _kernel("combine")[(bsz * heads,)](o, ml, out, splits, D=dim, SPLITS_P2=triton.next_power_of_2(splits))
    return out


def decode_attention_op():
    """:func:`decode_attention` as the custom operator ``torch.ops.course.decode_attention`` (registered
    on first use), so ``torch.compile`` sees one op of known output shape, not the launcher's Python."""
    if not hasattr(torch.ops.course, "decode_attention"):
        @torch.library.custom_op("course::decode_attention", mutates_args=())
        def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               scale: float) -> torch.Tensor:
            return decode_attention(q, k, v, mask, scale)

        @op.register_fake
        def _(q, k, v, mask, scale):
            return q.new_empty(q.shape)   # contiguous, as decode_attention returns it
    return torch.ops.course.decode_attention


def kernel_takes(query, key, mask, dropout: float = 0.0, **kwargs) -> bool:
    """Whether :func:`decode_attention` computes this attention call exactly as transformers' SDPA path
    would: one query position, no dropout, no extra terms (soft-capping, sinks, position bias), a
    power-of-two head size, and no mask or SDPA's boolean ``[B or 1, 1, 1, ≥ L]`` one."""
    if query.shape[2] != 1 or dropout != 0.0 or any(kwargs.get(k) is not None for k in _EXTRA_TERMS):
        return False
    dim = query.shape[-1]
    if dim & (dim - 1) or dim < 16 or query.shape[1] % key.shape[1]:
        return False
    if query.device.type != "cuda" and not _interpreted():
        return False
    return mask is None or (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[0] in (1, query.shape[0])
                            and mask.shape[1] == 1 and mask.shape[2] == 1 and mask.shape[3] >= key.shape[2])


_EXTRA_TERMS = ("softcap", "s_aux", "sinks", "position_bias")   # attention terms SDPA-style kernels add; ours does not


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' attention-function signature: a decode step the kernel takes (:func:`kernel_takes`)
    → :func:`decode_attention` through its custom op; anything else (the prefill, other masks) →
    transformers' SDPA function, unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if not kernel_takes(query, key, attention_mask, dropout, **kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    mask = None if attention_mask is None else attention_mask[..., : key.shape[2]]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = decode_attention_op()(query, key, value, mask, float(scale))
    return out.transpose(1, 2).contiguous(), None


def use(model) -> None:
    """Run ``model``'s attention through :func:`attention_forward`: registered with transformers as
    ``"course_decode"`` (``AttentionInterface``, with SDPA's mask builder under the same name) and
    switched on by ``model.set_attn_implementation`` — the library's own switch, no patching."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    AttentionInterface.register(NAME, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    decode_attention_op()   # registered now: torch.compile cannot register an op while it traces
    model.set_attn_implementation(NAME)
