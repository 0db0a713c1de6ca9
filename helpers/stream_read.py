"""How fast any kernel can read a weight of a given size: a Triton kernel that only loads.

A W4A16 matmul at one row is memory-bound, so the time it cannot beat is the time to read its bytes.
The copy bandwidth of a large buffer (:func:`helpers.timing.copy_bandwidth_gbps`) is that limit for
large weights; a 30 MB weight is read in a few microseconds, where a kernel's ramp-up (the first loads
in flight) and tail (the last programs finishing on a few multiprocessors) are a large part of the
time. :func:`read_words` reads an ``[N, W]`` int32 tensor in tiles of ``block_n`` rows and ``wps``
words per step, ``split`` programs along each row — the grid of the GEMV in
:mod:`helpers.w4_kernel` — and does nothing with the words but XOR them (so the loads are not
removed) and write one int32 per program. Timed on the weight's own words, it is the bar at that size:
how long the loads alone take, with the same kernel boundaries a decode step has.
"""
from __future__ import annotations

import torch

try:  # Triton is optional (helpers.w4_kernel's convention)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None


def _read_kernel(w_ptr, out_ptr, N, stride_n, span, BLOCK_N: tl.constexpr, WPS: tl.constexpr):
    """Program (i, j) reads rows ``i·BLOCK_N …`` from word ``j·span·WPS`` on, ``WPS`` words per step for
    ``span`` steps (``evict_first``, like the GEMV's weight loads), and writes the XOR of all of them."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = tl.arange(0, WPS)
    mask = (offs_n < N)[:, None] & (offs_w < WPS)[None, :]
    ptrs = w_ptr + offs_n[:, None] * stride_n + offs_w[None, :]
    acc = tl.zeros((BLOCK_N, WPS), dtype=tl.int32)
    for step in range(pid_k * span, (pid_k + 1) * span):
        acc ^= tl.load(ptrs + step * WPS, mask=mask, other=0, eviction_policy="evict_first")
    tl.store(out_ptr + pid_k * tl.num_programs(0) + pid_n, tl.xor_sum(tl.xor_sum(acc, axis=1), axis=0))


_KERNEL: dict = {}


def read_words(words: torch.Tensor, block_n: int = 64, wps: int = 64, split: int = 1,
               out: torch.Tensor | None = None, num_warps: int = 4) -> torch.Tensor:
    """Reads every word of ``words`` [N, W] (int32, rows contiguous) once; returns the XOR of each
    program's words (``split`` values per tile of ``block_n`` rows, int32), whose XOR over all is the
    XOR of all the words. ``wps`` (words per step, a power of 2) and ``split`` must divide ``W`` into
    whole steps per program. ``out``: a buffer of at least that many int32 to reuse (graph replay)."""
    if triton is None:
        raise RuntimeError("read_words needs Triton: pip install triton (Linux)")
    if not isinstance(words, torch.Tensor) or words.dim() != 2 or words.dtype != torch.int32:
        raise ValueError(f"words must be a 2-D int32 tensor [N, W], got "
                         f"{getattr(words, 'dtype', type(words).__name__)} {tuple(getattr(words, 'shape', ()))}")
    if words.stride(1) != 1:
        raise ValueError("words must have contiguous rows (stride 1 along W): pass words.contiguous()")
    for name, val in (("block_n", block_n), ("wps", wps), ("num_warps", num_warps)):
        if not isinstance(val, int) or val < 1 or val & (val - 1):
            raise ValueError(f"{name} must be a power of 2, got {val!r}")
    n, w = words.shape
    if not isinstance(split, int) or split < 1 or w % (wps * split):
        raise ValueError(f"split must be a positive int with words per row W={w} a multiple of wps·split "
                         f"= {wps}·{split}")
    tiles = triton.cdiv(n, block_n)
    if out is None:
        out = torch.empty(tiles * split, dtype=torch.int32, device=words.device)
    elif out.dtype != torch.int32 or out.numel() < tiles * split or out.device != words.device:
        raise ValueError(f"out must be an int32 buffer of at least {tiles * split} on {words.device}")
    if "read" not in _KERNEL:
        _KERNEL["read"] = triton.jit(_read_kernel)
    extra = {"num_warps": num_warps} if words.is_cuda else {}
    _KERNEL["read"][(tiles, split)](words, out, n, words.stride(0), w // (wps * split), BLOCK_N=block_n, WPS=wps,
                                    **extra)
    return out[:tiles * split]


def xor_all(t: torch.Tensor) -> int:
    """The XOR of every element of an int32 tensor (what :func:`read_words`' results XOR to)."""
    flat = t.reshape(-1).to(torch.int64) & 0xFFFFFFFF
    acc = 0
    for v in flat.tolist():
        acc ^= v
    return acc
