"""GPTQ's inner loop over one block of columns as one Triton kernel: the speed layer beside
:func:`helpers.gptq.quantize_block` (static grids), which stays the readable algorithm.

On a GPU the column loop of Algorithm 1 is ~10 tiny kernels per column (quantize, error, a rank-1
update of the block), so it waits for launches — even replayed as a CUDA graph each kernel costs a
few microseconds, ×128 columns ×14,000 columns a layer. But the rows are independent: each row's
quantization and its error's spread only read that row and the block's ``Hinv1`` [B, B]. So one
program holds a tile of ``BLOCK_R`` rows × the block's ``B`` columns in registers and runs all ``B``
steps on it, for each column ``i``:

    q = (clamp(rint(w / s + z), qmin, qmax) − z) · s        w = W1[:, i], (s, z) its grid
    err = (w − q) / Hinv1[i, i]                             W1[:, i:] −= err ⊗ Hinv1[i, i:]

— the same operations in the same order as :func:`helpers.gptq.column_step`, with IEEE division
(``div_rn``) and no fused multiply-add (``enable_fp_fusion=False``), so its weights are the eager
loop's, bit for bit (``tests/test_gptq_kernel.py``, in Triton's interpreter on a CPU and compiled on
CUDA). One launch per block instead of ~1,300.
"""
from __future__ import annotations

import torch

from .quant import qrange

try:  # Triton is optional: CPU installs without it still import this module (the kernel then refuses)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None


def _gptq_block_kernel(W_ptr, H_ptr, S_ptr, Z_ptr, Q_ptr, E_ptr, rows, cols, stride_w, stride_h, stride_s,
                       stride_q, QMIN: tl.constexpr, QMAX: tl.constexpr, ROUND: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_C: tl.constexpr):
    """Rows ``pid·BLOCK_R …`` of one block: ``W`` [rows, cols] updated in place, ``Q`` and ``E`` (the
    quantized columns and their errors) written; ``S``, ``Z`` [rows, cols] every column's grid."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    rmask, cmask = r < rows, c < cols
    tile = rmask[:, None] & cmask[None, :]
    W = tl.load(W_ptr + r[:, None] * stride_w + c[None, :], mask=tile, other=0.0)
    for i in range(cols):
        at_i = c[None, :] == i
        w = tl.sum(tl.where(at_i, W, 0.0), axis=1)                       # column i as it is now
        s = tl.load(S_ptr + r * stride_s + i, mask=rmask, other=1.0)
        z = tl.load(Z_ptr + r * stride_s + i, mask=rmask, other=0.0)
        x = tl.math.div_rn(w, s) + z
        code = tl.minimum(tl.maximum((x + ROUND) - ROUND, QMIN), QMAX)    # rint(x), see ROUND
        q = (code - z) * s
        err = tl.math.div_rn(w - q, tl.load(H_ptr + i * stride_h + i))
        h = tl.load(H_ptr + i * stride_h + c, mask=cmask & (c >= i), other=0.0)   # Hinv1[i, i:]
        W = W - err[:, None] * h[None, :]
        tl.store(Q_ptr + r * stride_q + i, q, mask=rmask)
        tl.store(E_ptr + r * stride_q + i, err, mask=rmask)
    tl.store(W_ptr + r[:, None] * stride_w + c[None, :], W, mask=tile)


ROUND = 1.5 * 2 ** 23   # (x + ROUND) − ROUND is rint(x), ties to even, for |x| < 2²²: the sum lies where
#                        float32's spacing is 1. Larger |x| are clamped to qmin/qmax after, as rint's would be.
_KERNEL: dict = {}   # the jitted kernel object, made on first use (Triton's own cache keeps its binaries)


def available() -> bool:
    """Whether this kernel can run here: Triton importable (compiled on CUDA, interpreted on a CPU)."""
    return triton is not None


def quantize_block_static(W1: torch.Tensor, Hinv1: torch.Tensor, S1: torch.Tensor, Z1: torch.Tensor,
                          bits: int, symmetric: bool, block_rows: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`helpers.gptq.static_block` in one launch: ``W1`` [rows, B] float32, updated in place
    (a view into the whole weight is fine), ``Hinv1`` [B, B] its block of the upper Cholesky factor,
    ``S1``, ``Z1`` [rows, B] each column's grid; ``block_rows`` rows per program (8: the fastest of
    8–64 on the H200 for 2,048–16,384 rows, ``results/h200/gptq_block.json``). Returns ``(Q1, Err1)``."""
    if triton is None:
        raise RuntimeError("the GPTQ block kernel needs Triton: pip install triton (Linux), or use "
                           "helpers.gptq.quantize_block")
    rows, cols = W1.shape
    for name, t, shape in (("Hinv1", Hinv1, (cols, cols)), ("S1", S1, (rows, cols)), ("Z1", Z1, (rows, cols))):
        if tuple(t.shape) != shape or t.dtype != torch.float32 or t.device != W1.device:
            raise ValueError(f"{name} must be float32 {shape} on {W1.device}, got {t.dtype} {tuple(t.shape)} "
                             f"on {t.device}")
    if W1.dtype != torch.float32 or W1.stride(1) != 1:
        raise ValueError(f"W1 must be float32 with contiguous rows, got {W1.dtype} strides {W1.stride()}")
    Hinv1, S1, Z1 = Hinv1.contiguous(), S1.contiguous(), Z1.contiguous()
    Q1, E1 = torch.empty_like(S1), torch.empty_like(S1)
    qmin, qmax = qrange(bits, symmetric)
    if "k" not in _KERNEL:
        _KERNEL["k"] = triton.jit(_gptq_block_kernel)
    grid = (triton.cdiv(rows, block_rows),)
    _KERNEL["k"][grid](W1, Hinv1, S1, Z1, Q1, E1, rows, cols, W1.stride(0), Hinv1.stride(0), S1.stride(0),
                       Q1.stride(0), QMIN=qmin, QMAX=qmax, ROUND=ROUND, BLOCK_R=block_rows,
                       BLOCK_C=triton.next_power_of_2(cols), num_warps=4, enable_fp_fusion=False)
    return Q1, E1
