"""How int4 becomes speed: a W4A16 matmul in Triton that reads the course's packed format.

The weight ``W[N, K]`` (``N`` outputs, ``K`` inputs) is quantized 4-bit asymmetric per group of
``g`` inputs (notebook 03): codes ``q ∈ [0, 15]``, an fp16 scale ``s`` and zero ``z`` per group, and

    y[m, n] = Σ_groups s[n, j] · ( Σ_{k ∈ group j} x[m, k] · q[n, k]  −  z[n, j] · Σ_{k ∈ group j} x[m, k] )

which is ``x @ dequantize(W).T`` rearranged so the scale is applied once per group, not per weight.
The codes are packed by :func:`helpers.quant.pack_codes` (two per byte, low nibble first) row by row
and read as int32 words: nibble ``j`` of word ``w`` in row ``n`` is ``q[n, 8w + j]``.

Every weight byte is read once per call, so at decode (``M`` = 1 … 16 rows) the kernel is
memory-bound and its limit is ``bytes read / copy bandwidth``. The steps that turn the 4× fewer
bytes into time (the lesson of notebook 08, measured one by one in ``benchmarks/kernels.py``):

1. ``BLOCK_K`` spans several groups and the codes arrive as int32 words (wide loads);
2. split-K (``SPLIT_K`` programs along ``K``, fp32 atomics) so every SM streams even when ``N`` is small;
3. nibble → float without an integer-to-float convert (a quarter-rate instruction): ``0x4B000000 | q``
   *is* the float32 number ``2^23 + q``, so one OR and one subtraction give ``q`` exactly — the fp32
   form of the ``0x6400 | q`` = fp16 ``1024 + q`` trick in Marlin and FasterTransformer's ``lop3``
   dequantizers (``MAGIC=True``);
4. the block shape tuned per matrix shape (``triton.autotune``).

The readable reference is :func:`reference_matmul` (dequantize, then matmul); the kernel is tested
against it exactly on small shapes in Triton's interpreter on CPU.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

if not torch.cuda.is_available():  # no GPU: the same kernel source runs in Triton's interpreter (numpy),
    os.environ.setdefault("TRITON_INTERPRET", "1")  # exact and slow; read when triton is first imported

from .qspec import QuantSpec  # noqa: E402
from .quant import check_finite, quantize_tensor  # noqa: E402

try:  # Triton is optional: CPU installs without it still import this module (the kernel then refuses)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None


@dataclass
class W4Weight:
    """A packed 4-bit weight: int32 words ``[N, K/8]``, fp16 scales and zeros ``[N, K/g]``."""
    words: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    group_size: int
    shape: tuple[int, int]   # (N, K)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.words, self.scale, self.zero))

    def to(self, device) -> W4Weight:
        return W4Weight(self.words.to(device), self.scale.to(device), self.zero.to(device), self.group_size,
                        self.shape)


def pack_w4(w: torch.Tensor, group_size: int = 128) -> W4Weight:
    """Quantize ``w[N, K]`` to 4-bit asymmetric groups (integer zeros) and pack it for the kernel."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"w must be a 2-D weight [out_features, in_features], got "
                         f"{getattr(w, 'shape', type(w).__name__)}")
    check_finite(w, "w")
    n, k = w.shape
    if k % 8 or k % group_size:
        raise ValueError(f"in_features={k} must be a multiple of 8 and of group_size={group_size} "
                         "(pick a group size that divides it: helpers.quant.allowed_group_sizes)")
    spec = QuantSpec(bits=4, group_size=group_size, symmetric=False)
    q = quantize_tensor(w.float(), bits=4, symmetric=False, granularity="group", group_size=spec.group_size)
    words = pack_rows(q.codes).view(torch.int32)      # little-endian bytes: nibble j of word i = code 8i+j
    return W4Weight(words.contiguous(), q.scale.to(torch.float16), q.zero.to(torch.float16), group_size, (n, k))


def pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte, low nibble first, row by row: ``[N, K] → [N, K/2]`` uint8.

    Byte for byte what :func:`helpers.quant.pack_codes` writes for each row (tested), but on the
    codes' own device, so an 8B model packs on the GPU in seconds."""
    c = codes.to(torch.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()


def unpack_w4(p: W4Weight) -> torch.Tensor:
    """The integer codes ``[N, K]`` back from the words (the kernel's unpacking, in PyTorch)."""
    shifts = torch.arange(0, 32, 4, device=p.words.device, dtype=torch.int32)
    return ((p.words[:, :, None] >> shifts) & 0xF).reshape(p.shape)


def dequantize_w4(p: W4Weight, dtype=torch.float16) -> torch.Tensor:
    """``(q − z) · s`` per group, as a dense ``[N, K]`` matrix."""
    n, k = p.shape
    q = unpack_w4(p).reshape(n, k // p.group_size, p.group_size).float()
    return ((q - p.zero.float()[..., None]) * p.scale.float()[..., None]).reshape(n, k).to(dtype)


def reference_matmul(x: torch.Tensor, p: W4Weight) -> torch.Tensor:
    """The readable version: dequantize the whole weight, then ``x @ W.T`` in fp32."""
    return (x.float() @ dequantize_w4(p, torch.float32).T).to(x.dtype)


if triton is not None:
    def _w4a16_gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, N, K, stride_wn, stride_sn,
                           GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           SPLIT_K: tl.constexpr, MAGIC: tl.constexpr):
        """One row of x (decode at batch 1): reduce on CUDA cores, scale and zero once per group."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        NG: tl.constexpr = BLOCK_K // GROUP
        NW: tl.constexpr = BLOCK_K // 8                   # int32 words per row and step
        WPG: tl.constexpr = GROUP // 8                    # int32 words per group
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        k_span = K // SPLIT_K
        for k0 in range(pid_k * k_span, (pid_k + 1) * k_span, BLOCK_K):
            words = tl.load(w_ptr + offs_n[:, None] * stride_wn + (k0 // 8 + tl.arange(0, NW))[None, :],
                            mask=mask_n[:, None], other=0)                             # [BN, NW] int32
            part = tl.zeros((BLOCK_N, NW), dtype=tl.float32)
            for j in tl.static_range(8):                  # nibble j of every word: codes 8w + j
                nib = (words >> (4 * j)) & 0xF
                if MAGIC:   # 0x4B000000 | q is the float32 2^23 + q: no (quarter-rate) int→float convert
                    qf = (nib | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
                else:
                    qf = nib.to(tl.float32)
                xj = tl.load(x_ptr + k0 + tl.arange(0, NW) * 8 + j).to(tl.float32)
                part += qf * xj[None, :]
            part = tl.sum(tl.reshape(part, (BLOCK_N, NG, WPG)), axis=2)                 # [BN, NG] Σ x·q per group
            x = tl.load(x_ptr + k0 + tl.arange(0, BLOCK_K)).to(tl.float32)
            xs = tl.sum(tl.reshape(x, (NG, GROUP)), axis=1)                             # [NG]    Σ x per group
            g = k0 // GROUP + tl.arange(0, NG)
            sc = tl.load(s_ptr + offs_n[:, None] * stride_sn + g[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
            z = tl.load(z_ptr + offs_n[:, None] * stride_sn + g[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
            acc += tl.sum(sc * (part - z * xs[None, :]), axis=1)
        if SPLIT_K == 1:
            tl.store(y_ptr + offs_n, acc, mask=mask_n)
        else:
            tl.atomic_add(y_ptr + offs_n, acc, mask=mask_n)

    def _w4a16_gemm_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym,
                           GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           SPLIT_K: tl.constexpr):
        """Several rows: tensor cores on the integer codes, one group per step, then
        ``acc += s · (x @ q − z · Σx)`` — the scale and zero once per group and output."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_n = offs_n < N
        mask_m = offs_m < M
        WPG: tl.constexpr = GROUP // 8
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_span = K // SPLIT_K
        for k0 in range(pid_k * k_span, (pid_k + 1) * k_span, GROUP):
            words = tl.load(w_ptr + offs_n[:, None] * stride_wn + (k0 // 8 + tl.arange(0, WPG))[None, :],
                            mask=mask_n[:, None], other=0)                             # [BN, WPG] int32
            part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in tl.static_range(8):                  # codes 8w + j: a [BN, WPG] tile per nibble
                xj = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + tl.arange(0, WPG) * 8 + j)[None, :],
                             mask=mask_m[:, None], other=0.0)
                qj = ((words >> (4 * j)) & 0xF).to(xj.dtype)
                part += tl.dot(xj, tl.trans(qj))                                         # exact codes
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + tl.arange(0, GROUP))[None, :],
                        mask=mask_m[:, None], other=0.0)
            xs = tl.sum(x.to(tl.float32), axis=1)
            g = k0 // GROUP
            sc = tl.load(s_ptr + offs_n * stride_sn + g, mask=mask_n, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + offs_n * stride_sn + g, mask=mask_n, other=0.0).to(tl.float32)
            acc += sc[None, :] * (part - z[None, :] * xs[:, None])
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        mask = mask_m[:, None] & mask_n[None, :]
        if SPLIT_K == 1:
            tl.store(y_ptrs, acc, mask=mask)
        else:
            tl.atomic_add(y_ptrs, acc, mask=mask)

    _w4a16_gemv_kernel = triton.jit(_w4a16_gemv_kernel)
    _w4a16_gemm_kernel = triton.jit(_w4a16_gemm_kernel)


def _interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(_w4a16_gemv_kernel, InterpretedFunction)


DEFAULT_CONFIG = dict(BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, MAGIC=False, num_warps=4)


def _check_config(cfg: dict, p: W4Weight, m: int = 1) -> dict:
    n, k = p.shape
    unknown = set(cfg) - {"BLOCK_N", "BLOCK_K", "SPLIT_K", "MAGIC", "num_warps", "num_stages"}
    if unknown:
        raise ValueError(f"config has unknown keys {sorted(unknown)}; allowed: BLOCK_N, BLOCK_K, SPLIT_K, MAGIC, "
                         "num_warps, num_stages")
    step = cfg["BLOCK_K"] if block_rows(m) == 1 else p.group_size   # K consumed per loop step
    if step % p.group_size:
        raise ValueError(f"config BLOCK_K={cfg['BLOCK_K']} must be a multiple of group_size={p.group_size}")
    if k % (step * cfg["SPLIT_K"]):
        raise ValueError(f"in_features={k} must be a multiple of (K per step)·SPLIT_K = {step}·{cfg['SPLIT_K']}")
    return cfg


def w4a16_matmul(x: torch.Tensor, p: W4Weight, config: dict | None = None, out_dtype=None) -> torch.Tensor:
    """``x[M, K] @ dequantize(p).T`` by the Triton kernel (fp32 accumulation; output in ``out_dtype``,
    default ``x.dtype``).

    ``config`` (``BLOCK_N, BLOCK_K, SPLIT_K, MAGIC, num_warps``) defaults to :data:`DEFAULT_CONFIG`;
    :func:`tuned_config` measures the best one per shape on a GPU. Without CUDA the kernel runs in
    Triton's interpreter (exact, slow: small shapes only)."""
    if triton is None:
        raise RuntimeError("w4a16_matmul needs Triton: pip install triton (Linux), or use reference_matmul")
    if x.dim() != 2 or x.shape[1] != p.shape[1]:
        raise ValueError(f"x must be [M, K={p.shape[1]}], got {tuple(x.shape)}")
    if x.device.type != "cuda" and not _interpreted():
        raise RuntimeError("without CUDA the kernel runs only in Triton's interpreter, and triton was imported "
                           "before TRITON_INTERPRET=1 was set: restart and import helpers.w4_kernel first "
                           "(or export TRITON_INTERPRET=1), or call reference_matmul")
    if x.device != p.words.device:
        raise ValueError(f"x is on {x.device} but the packed weight on {p.words.device}: move one (p.to(device))")
    cfg = _check_config({**DEFAULT_CONFIG, **(config or {})}, p, x.shape[0])
    m, (n, k) = x.shape[0], p.shape
    x = x.contiguous()
    y = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    extra = {key: cfg[key] for key in ("num_warps", "num_stages") if key in cfg and x.device.type == "cuda"}
    if block_rows(m) == 1:
        grid = (triton.cdiv(n, cfg["BLOCK_N"]), cfg["SPLIT_K"])
        _w4a16_gemv_kernel[grid](x, p.words, p.scale, p.zero, y, n, k, p.words.stride(0), p.scale.stride(0),
                                 GROUP=p.group_size, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                                 SPLIT_K=cfg["SPLIT_K"], MAGIC=cfg["MAGIC"], **extra)
    else:
        if x.is_cuda and p.group_size < 128:
            raise ValueError(f"the tensor-core path (M > 1) needs group_size ≥ 128 (16 words per dot), got "
                             f"{p.group_size}: pack with group_size=128, or call one row at a time")
        block_m = block_rows(m)
        grid = (triton.cdiv(n, cfg["BLOCK_N"]), cfg["SPLIT_K"], triton.cdiv(m, block_m))
        _w4a16_gemm_kernel[grid](x, p.words, p.scale, p.zero, y, m, n, k, x.stride(0), p.words.stride(0),
                                 p.scale.stride(0), y.stride(0), GROUP=p.group_size, BLOCK_M=block_m,
                                 BLOCK_N=cfg["BLOCK_N"], SPLIT_K=cfg["SPLIT_K"], **extra)
    return y.to(out_dtype or x.dtype)


def block_rows(m: int) -> int:
    """Rows per program: 1 (a GEMV, reduced on CUDA cores) for one row, else tiles of 16 or 64 rows
    multiplied on tensor cores (``tl.dot`` needs at least 16)."""
    return 1 if m == 1 else 16 if m <= 16 else 64


def candidate_configs(p: W4Weight, m: int) -> list[dict]:
    """Block shapes worth timing for one weight and row count (all valid for its K and group)."""
    if block_rows(m) == 1:
        grid = [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, MAGIC=True, num_warps=4)
                for bn in (16, 32, 64, 128) for bk in (256, 512, 1024) for sk in (1, 4, 8)]
    else:
        grid = [dict(BLOCK_N=bn, BLOCK_K=p.group_size, SPLIT_K=sk, MAGIC=False, num_warps=w)
                for bn in (32, 64, 128) for sk in (1, 2, 4) for w in (4, 8)]
    out = []
    for cfg in grid:
        try:
            out.append(_check_config(cfg, p, m))
        except ValueError:
            pass
    return out


def tuned_config(x: torch.Tensor, p: W4Weight, time_fn, configs: list[dict] | None = None) -> tuple[dict, float]:
    """The fastest of ``configs`` (default :func:`candidate_configs`) for this shape: ``time_fn(fn) → ms``."""
    best = None
    for cfg in configs or candidate_configs(p, x.shape[0]):
        try:
            ms = time_fn(lambda cfg=cfg: w4a16_matmul(x, p, cfg))
        except Exception:  # noqa: BLE001 - a config Triton cannot compile (e.g. out of shared memory)
            continue
        if best is None or ms < best[1]:
            best = (cfg, ms)
    if best is None:
        raise RuntimeError("no kernel configuration ran for this shape")
    return best


class W4Linear(torch.nn.Module):
    """A ``Linear`` whose weight lives packed (0.5 byte per weight + 4 bytes per group, registered as
    buffers so ``state_dict`` and byte counts see them) and runs through :func:`w4a16_matmul` with one
    configuration per row tile (``configs``: :func:`block_rows` value → config).

    Above ``dense_above`` rows (prefill, large batches) the int4 kernels lose to a 16-bit GEMM (the
    crossover measured in notebook 08), so the layer dequantizes its weight for that call and uses
    cuBLAS — what engines do too (vLLM's AWQ path dequantizes from 256 tokens); the cost is one
    transient dense copy of this layer's weight."""

    def __init__(self, linear: torch.nn.Linear, group_size: int = 128, configs: dict | None = None,
                 dense_above: int = 16):
        super().__init__()
        p = pack_w4(linear.weight.data, group_size)
        self.register_buffer("words", p.words)
        self.register_buffer("scale", p.scale)
        self.register_buffer("zero", p.zero)
        self.group_size, self.shape = group_size, p.shape
        self.bias = linear.bias
        self.configs = configs or {}
        self.dense_above = dense_above

    @property
    def p(self) -> W4Weight:
        return W4Weight(self.words, self.scale, self.zero, self.group_size, self.shape)

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.shape[0] > self.dense_above:
            y = x2 @ dequantize_w4(self.p, x2.dtype).T
        else:
            y = w4a16_matmul(x2, self.p, self.configs.get(block_rows(x2.shape[0])))
        y = y.reshape(*shape[:-1], self.shape[0])
        return y + self.bias if self.bias is not None else y


def swap_linears(model, group_size: int = 128, configs: dict | None = None, skip=("lm_head",)) -> int:
    """Replace every ``nn.Linear`` of ``model`` (except names containing one of ``skip``) by a
    :class:`W4Linear`; ``configs[(N, K)]`` gives each shape's per-tile configs. Returns how many."""
    n = 0
    for name, mod in list(model.named_modules()):
        for child, lin in list(mod.named_children()):
            full = f"{name}.{child}" if name else child
            if isinstance(lin, torch.nn.Linear) and not any(s in full for s in skip):
                shape = (lin.out_features, lin.in_features)
                setattr(mod, child, W4Linear(lin, group_size, (configs or {}).get(shape)))
                n += 1
    return n
