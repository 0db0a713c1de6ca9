"""Round 12's question, measured: how much of the one-row GEMV's time is its activation side?

    python -m benchmarks.x_side --out results/h100/x_side.json

Every step of :func:`helpers.w4_kernel._w4a16_gemv_kernel` (the narrow rule's tile: 32 rows, 2 warps,
fp16-pair sums kept per group) does the work of ``x`` again in every program: eight scalar loads of
each word's columns, the largest ``|x|`` (a reduction across the program's threads), ``log2``/``exp2``
of the shrink, ``x·shrink`` and its fp16 pairs, ``Σx`` per group — and Triton moves those values between
register layouts through shared memory, with barriers (``scripts/kernel_sass.py`` counts them; README,
round 12).

This benchmark does the activation side **once per call**, in a kernel of its own
(:func:`prepare_x`: one program per :data:`CHUNK_WORDS` word columns; per group a shrink from its largest
``|x|``, ``Σx`` and ``1/shrink``; the fp16 pairs in four planes), and times the GEMV loop that then only
loads them (:func:`gemv_prepared`; ``scripts/kernel_sass.py --kernel prepared``) — alone (the bar: what a
step costs without the activation work) and with its preparation (what a decode step would pay: one more
launch per linear), at four tiles (:data:`TILES`) and a few splits each. Then the control — the rule's
kernel, activation side in every step, at the best prepared tile (:func:`in_kernel_x`) — which tells the
tile's share from the preparation's, and a candidate shape rule for the prepared loop
(:func:`candidate_config`), alone and with its preparation. Beside them, in one process: the narrow rule
as it is (:func:`helpers.w4_kernel.narrow_gemv_config`) and tinygemm. The best loop, the control and the
candidate are checked against :func:`helpers.w4_format.reference_matmul` (``rel_err``, ``exact``).

Not used by the course's layers: a diagnostic. If the loop alone is much faster than the rule, the
activation side is where the time goes and the next round moves it out of the loop for good (fused
into what produces ``x``); if not, the weight side is.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from helpers import timing, w4_format, w4_kernel
from helpers.config import write_json
from helpers.w4_kernel import _add_pairs, _pair_sum_f32, acc16_x_limit

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - benchmarks need Triton; CPU tests skip without it
    triton = None

PLANE_ALIGN = 16     # int32 entries: each plane starts 64-byte aligned (the launcher then knows the stride divides 16)
CHUNK_WORDS = 64     # word columns (512 activations) each preparing program handles
MIN_MB = 16          # the target weights: at least this many MB of int4 codes, scales and zeros


def _device(fn):
    return triton.jit(fn) if triton is not None else fn


@_device
def _pack_pair(a, b):
    """Two fp32 tensors as one int32 of fp16 halves (``a`` low, ``b`` high), in plain Triton."""
    lo = a.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi = b.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return lo | (hi << 16)


@_device
def _unpack_pair(p):
    """An int32 of two fp16 halves as two fp16 tensors (low, high), in plain Triton."""
    lo = (p & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    hi = ((p >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    return lo, hi


def _prepare_x_kernel(x_ptr, planes_ptr, xs_ptr, inv_ptr, K, plane_stride, GROUP: tl.constexpr,
                      LIMIT: tl.constexpr, CW: tl.constexpr):
    """``CW`` word columns (``8·CW`` activations) a program. Per group ``j``: ``shrink_j = 2^e`` putting the
    group's largest ``|x|`` in ``(LIMIT/2, LIMIT]`` (:func:`helpers.w4_kernel.acc16_x_limit`: no fp16 sum of
    the group can overflow), written as ``1/shrink_j``, and ``Σx`` over the group (fp32, unshrunk); per word
    column ``c`` the fp16 pairs ``(x₀, x₄)``, ``(x₁/16, x₅/16)``, ``(x₂, x₆)``, ``(x₃/16, x₇/16)`` of
    ``x[8c + j]·shrink`` (planes 0–3: the second operands of :func:`helpers.w4_kernel._word_pairs_half2`)."""
    WPG: tl.constexpr = GROUP // 8
    G: tl.constexpr = CW // WPG
    K8 = K // 8
    c = tl.program_id(0) * CW + tl.arange(0, CW)
    m = c < K8
    base = x_ptr + c * 8
    x0 = tl.load(base, mask=m, other=0.0).to(tl.float32)
    x1 = tl.load(base + 1, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + 2, mask=m, other=0.0).to(tl.float32)
    x3 = tl.load(base + 3, mask=m, other=0.0).to(tl.float32)
    x4 = tl.load(base + 4, mask=m, other=0.0).to(tl.float32)
    x5 = tl.load(base + 5, mask=m, other=0.0).to(tl.float32)
    x6 = tl.load(base + 6, mask=m, other=0.0).to(tl.float32)
    x7 = tl.load(base + 7, mask=m, other=0.0).to(tl.float32)
    big = tl.maximum(tl.maximum(tl.maximum(tl.abs(x0), tl.abs(x1)), tl.maximum(tl.abs(x2), tl.abs(x3))),
                     tl.maximum(tl.maximum(tl.abs(x4), tl.abs(x5)), tl.maximum(tl.abs(x6), tl.abs(x7))))
    most = tl.max(tl.reshape(big, (G, WPG)), axis=1)                                          # [G]
    e = tl.minimum(tl.maximum(tl.floor(tl.log2(LIMIT / tl.maximum(most, 1e-30))), -126.0), 100.0)
    shrink_g = tl.where(most > 0, tl.exp2(e), 1.0)
    per_word = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
    gi = tl.program_id(0) * G + tl.arange(0, G)
    tl.store(xs_ptr + gi, tl.sum(tl.reshape(per_word, (G, WPG)), axis=1), mask=gi < K8 // WPG)
    tl.store(inv_ptr + gi, 1.0 / shrink_g, mask=gi < K8 // WPG)
    shrink = tl.reshape(tl.broadcast_to(shrink_g[:, None], (G, WPG)), (CW,))                # [CW] its group's
    tl.store(planes_ptr + c, _pack_pair(x0 * shrink, x4 * shrink), mask=m)
    tl.store(planes_ptr + plane_stride + c, _pack_pair(x1 * (shrink * 0.0625), x5 * (shrink * 0.0625)), mask=m)
    tl.store(planes_ptr + 2 * plane_stride + c, _pack_pair(x2 * shrink, x6 * shrink), mask=m)
    tl.store(planes_ptr + 3 * plane_stride + c, _pack_pair(x3 * (shrink * 0.0625), x7 * (shrink * 0.0625)), mask=m)


@_device
def _pairs_dot(w, p04, p15, p26, p37):
    """:func:`helpers.w4_kernel._word_pairs_half2` on prepared pairs (the same PTX)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 h, c0, c1, c2, c3, k0, k1;"
        " mov.b32 k0, 0x64086408; mov.b32 k1, 0x64806480; shr.b32 h, $1, 8;"
        " lop3.b32 c0, $1, 0x000F000F, 0x64006400, 0xEA; lop3.b32 c1, $1, 0x00F000F0, 0x64006400, 0xEA;"
        " lop3.b32 c2, h, 0x000F000F, 0x64006400, 0xEA; lop3.b32 c3, h, 0x00F000F0, 0x64006400, 0xEA;"
        " sub.f16x2 c0, c0, k0; sub.f16x2 c1, c1, k1; sub.f16x2 c2, c2, k0; sub.f16x2 c3, c3, k1;"
        " mul.rn.f16x2 $0, c0, $2; fma.rn.f16x2 $0, c1, $3, $0; fma.rn.f16x2 $0, c2, $4, $0;"
        " fma.rn.f16x2 $0, c3, $5, $0; }",
        "=r,r,r,r,r,r", [w, p04, p15, p26, p37], dtype=tl.int32, is_pure=True, pack=1)


@_device
def _pairs_dot_plain(w, p04, p15, p26, p37, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, WPG: tl.constexpr):
    """The same sums in plain Triton (the interpreter runs no PTX): per row and group, the low and high
    halves' ``Σ (q − 8)·x`` in fp16, added in fp32."""
    a0, b0 = _unpack_pair(p04)
    a1, b1 = _unpack_pair(p15)
    a2, b2 = _unpack_pair(p26)
    a3, b3 = _unpack_pair(p37)
    h = w >> 16
    lo = ((w & 0xF) - 8).to(tl.float16) * a0[None, :]
    lo += ((((w >> 4) & 0xF) - 8) * 16).to(tl.float16) * a1[None, :]
    lo += (((w >> 8) & 0xF) - 8).to(tl.float16) * a2[None, :]
    lo += ((((w >> 12) & 0xF) - 8) * 16).to(tl.float16) * a3[None, :]
    hi = ((h & 0xF) - 8).to(tl.float16) * b0[None, :]
    hi += ((((h >> 4) & 0xF) - 8) * 16).to(tl.float16) * b1[None, :]
    hi += (((h >> 8) & 0xF) - 8).to(tl.float16) * b2[None, :]
    hi += ((((h >> 12) & 0xF) - 8) * 16).to(tl.float16) * b3[None, :]
    lo = tl.sum(tl.reshape(lo.to(tl.float32), (BLOCK_N, GROUPS, WPG)), axis=2)
    hi = tl.sum(tl.reshape(hi.to(tl.float32), (BLOCK_N, GROUPS, WPG)), axis=2)
    return lo + hi


def _gemv_prepared_kernel(planes_ptr, xs_ptr, inv_ptr, w_ptr, s_ptr, z_ptr, y_ptr, ws_ptr, lock_ptr, N, K, SPLIT_K,
                          plane_stride, stride_wn, stride_sn, GROUP: tl.constexpr, GROUPS: tl.constexpr,
                          BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, PLAIN: tl.constexpr):
    """The narrow GEMV's loop with the activation side prepared (:func:`prepare_x`): per step, the words
    [BN, WPS] and four planes of fp16 pairs [WPS]; per group ``acc += s·(Σ (q−8)·x·shrink / shrink − (z−8)·Σx)``.
    ``K`` split ``SPLIT_K`` ways (``⌈steps/SPLIT_K⌉`` steps a program, the last fewer), the partials summed by
    the last program to finish, as the GEMV's. ``PREFETCH``: the next step's words are loaded before this
    step's are summed (two steps of words in registers: loads in flight while the codes are summed)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    WPG: tl.constexpr = GROUP // 8
    WPS: tl.constexpr = WPG * GROUPS
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_w = tl.arange(0, WPS)
    offs_g = tl.arange(0, GROUPS)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    steps = K // (GROUP * GROUPS)
    span = tl.cdiv(steps, SPLIT_K)
    start = pid_k * span
    end = tl.minimum(start + span, steps)
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_w[None, :]
    if PREFETCH:
        w_next = tl.load(w_ptrs + tl.minimum(start, steps - 1) * WPS, mask=mask_n[:, None], other=0,
                         eviction_policy="evict_first")
    for step in tl.range(start, end):
        if PREFETCH:
            w = w_next
            # the last step loads its own words again (no mask on a scalar: a line just read, never out of bounds)
            w_next = tl.load(w_ptrs + tl.minimum(step + 1, end - 1) * WPS, mask=mask_n[:, None], other=0,
                             eviction_policy="evict_first")
        else:
            w = tl.load(w_ptrs + step * WPS, mask=mask_n[:, None], other=0, eviction_policy="evict_first")
        xo = step * WPS + offs_w
        p04 = tl.load(planes_ptr + xo)
        p15 = tl.load(planes_ptr + plane_stride + xo)
        p26 = tl.load(planes_ptr + 2 * plane_stride + xo)
        p37 = tl.load(planes_ptr + 3 * plane_stride + xo)
        if PLAIN:
            dot = _pairs_dot_plain(w, p04, p15, p26, p37, BLOCK_N, GROUPS, WPG)
        else:
            pairs = _pairs_dot(w, tl.broadcast_to(p04[None, :], w.shape), tl.broadcast_to(p15[None, :], w.shape),
                               tl.broadcast_to(p26[None, :], w.shape), tl.broadcast_to(p37[None, :], w.shape))
            dot = _pair_sum_f32(tl.reduce(tl.reshape(pairs, (BLOCK_N, GROUPS, WPG)), 2, _add_pairs))
        g = step * GROUPS + offs_g
        xs = tl.load(xs_ptr + g)
        inv = tl.load(inv_ptr + g)
        sc = tl.load(s_ptr + offs_n[:, None] * stride_sn + g[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        z = tl.load(z_ptr + offs_n[:, None] * stride_sn + g[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        acc += tl.sum(sc * (dot * inv[None, :] - (z - 8.0) * xs[None, :]), axis=1)
    if SPLIT_K == 1:
        tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=mask_n)
    else:
        tl.store(ws_ptr + pid_k * N + offs_n, acc, mask=mask_n)
        tl.debug_barrier()
        ticket = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            total = tl.zeros_like(acc)
            for part_k in range(0, SPLIT_K):
                total += tl.load(ws_ptr + part_k * N + offs_n, mask=mask_n, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + offs_n, total.to(y_ptr.dtype.element_ty), mask=mask_n)
            tl.atomic_xchg(lock_ptr + pid_n, 0)


_KERNELS = {}


def _kernel(name: str):
    if triton is None:
        raise RuntimeError("benchmarks.x_side needs Triton")
    if name not in _KERNELS:
        _KERNELS[name] = triton.jit({"prepare": _prepare_x_kernel, "gemv": _gemv_prepared_kernel}[name])
    return _KERNELS[name]


def _interpreted() -> bool:
    return w4_kernel._interpreted()


class Prepared:
    """The activation side of one row ``x[1, K]`` for one group size: the planes, and per group ``Σx`` and
    ``1/shrink``."""

    def __init__(self, k: int, group: int, device):
        if k % 8 or k % group:
            raise ValueError(f"K = {k} must be a multiple of 8 and of the group size {group}")
        self.k, self.group = k, group
        self.plane_stride = math.ceil(k // 8 / PLANE_ALIGN) * PLANE_ALIGN
        self.planes = torch.empty(4 * self.plane_stride, dtype=torch.int32, device=device)
        self.xs = torch.empty(k // group, dtype=torch.float32, device=device)
        self.inv = torch.empty(k // group, dtype=torch.float32, device=device)


def prepare_x(x: torch.Tensor, group: int, out: Prepared | None = None) -> Prepared:
    """Run :func:`_prepare_x_kernel` on one row ``x[1, K]``, one program per :data:`CHUNK_WORDS` word columns
    (into ``out`` when given: no allocation)."""
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"x must be one row [1, K], got shape {tuple(x.shape)}")
    k = x.shape[1]
    out = out or Prepared(k, group, x.device)
    if (out.k, out.group) != (k, group):
        raise ValueError(f"out was made for K = {out.k}, group {out.group}; x has K = {k}, group {group}")
    cw = max(CHUNK_WORDS, group // 8)
    _kernel("prepare")[(triton.cdiv(k // 8, cw),)](x.contiguous(), out.planes, out.xs, out.inv, k, out.plane_stride,
                                                   GROUP=group, LIMIT=acc16_x_limit(group), CW=cw,
                                                   **({} if _interpreted() else {"num_warps": 2}))
    return out


def gemv_prepared(prep: Prepared, p: w4_format.W4Weight, cfg: dict, locks: torch.Tensor | None = None,
                  out_dtype=torch.bfloat16) -> torch.Tensor:
    """``x @ dequantize(p).T`` for the row ``prep`` was made from, with ``cfg``'s ``BLOCK_N``, ``GROUPS``,
    ``SPLIT_K`` and ``num_warps`` (:func:`helpers.w4_kernel.narrow_gemv_config`'s) and ``PREFETCH`` (default off)."""
    n, k = p.shape
    if (prep.k, prep.group) != (k, p.group_size):
        raise ValueError(f"prep is for K = {prep.k}, group {prep.group}; the weight has K = {k}, group {p.group_size}")
    split = cfg["SPLIT_K"]
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), split)
    y = torch.empty(1, n, dtype=out_dtype, device=p.words.device)
    ws = torch.empty(split, n, dtype=torch.float32, device=y.device) if split > 1 else y
    locks = (w4_kernel._locks(locks, grid[0], y.device) if split > 1 else y)
    extra = {} if _interpreted() else {"num_warps": cfg["num_warps"]}
    _kernel("gemv")[grid](prep.planes, prep.xs, prep.inv, p.words, p.scale, p.zero, y, ws, locks, n, k, split,
                          prep.plane_stride, p.words.stride(0), p.scale.stride(0), GROUP=p.group_size,
                          GROUPS=cfg["GROUPS"], BLOCK_N=cfg["BLOCK_N"], PREFETCH=bool(cfg.get("PREFETCH")),
                          PLAIN=_interpreted(), **extra)
    return y


TILES = ((32, 512, 2), (16, 1024, 2), (8, 2048, 2), (16, 1024, 1))   # (rows per program, codes of a row per step, warps)
SPLIT_SCALES = (0.5, 1, 2, 4)   # around uneven_split's choice for the tile (its wave rule was fitted on the first tile)


CANDIDATE_TILE = (8, 2048, 2)   # rows per program, codes of a row per step (at most), warps
CANDIDATE_FLIGHT = 16384        # codes of each row in flight per SM (warps × codes per step) below which K is split


def candidate_config(p: w4_format.W4Weight, sms: int) -> dict:
    """A shape rule for the prepared loop, fitted on run X2's twelve weights (``benchmarks.kernels.SHAPES``)
    and nothing else: :data:`CANDIDATE_TILE` (``GROUPS`` halved until it divides the row), and ``K`` split
    only where the programs of one split hold fewer than :data:`CANDIDATE_FLIGHT` codes in flight per SM —

        split = round(CANDIDATE_FLIGHT / (⌈N / rows⌉ · warps / sms · codes per step)),  at least 1

    (then the fewest programs with the same steps each). On the twelve, this tile at one split was within
    1.10× of the fastest of all 28 configs wherever that product was ≥ 15,888 (8B down), and wanted 2–4
    splits at 4,965 (the 14B-class down: 512 codes a step)."""
    n, k = p.shape
    rows, codes, warps = CANDIDATE_TILE
    groups = w4_kernel._fitting_groups(p, max(1, codes // p.group_size))
    steps = k // (p.group_size * groups)
    flight = math.ceil(n / rows) * warps / sms * p.group_size * groups
    split = max(1, min(steps, round(CANDIDATE_FLIGHT / flight)))
    split = math.ceil(steps / math.ceil(steps / split))
    return dict(BLOCK_N=rows, GROUPS=groups, SPLIT_K=split, num_warps=warps, PREFETCH=False)


def big_shapes(min_mb: float = MIN_MB) -> dict:
    """The (K, N) weights of ``benchmarks.kernels``' three shape sets with at least ``min_mb`` MB at g128."""
    from benchmarks.kernels import FRESH, HELD_OUT, SHAPES
    out = {}
    for label, (k, n) in {**SHAPES, **HELD_OUT, **FRESH}.items():
        if n * k // 2 + 2 * 2 * n * (k // 128) >= min_mb * 1e6:
            out[label] = (k, n)
    return out


def in_kernel_x(x: torch.Tensor, p: w4_format.W4Weight, cfg: dict, locks: torch.Tensor) -> torch.Tensor:
    """The control: :func:`helpers.w4_kernel._w4a16_gemv_kernel` (the activation side in every step, as the
    rule's) at a prepared loop's tile — launched here as :func:`helpers.w4_kernel.w4a16_matmul` launches it
    (``HALF2``, ``ACC16``, ``MAGIC`` where compiled), since that refuses tiles under 16 rows."""
    n, k = p.shape
    split = cfg["SPLIT_K"]
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), split)
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    ws = torch.empty(split, n, dtype=torch.float32, device=x.device) if split > 1 else y
    w4_kernel._kernel("gemv")[grid](x, p.words, p.scale, p.zero, y, ws, locks if split > 1 else y, n, k, split,
                                    p.words.stride(0), p.scale.stride(0), GROUP=p.group_size, GROUPS=cfg["GROUPS"],
                                    BLOCK_N=cfg["BLOCK_N"], SERIAL=split > 1, MAGIC=not _interpreted(), HALF2=True, ACC16=True,
                                    ACC_LIMIT=acc16_x_limit(p.group_size), STAGES=1, PDL=False,
                                    EVEN=(k // (p.group_size * cfg["GROUPS"])) % split == 0,
                                    num_warps=cfg["num_warps"], num_stages=1)
    return y


def tile_configs(p: w4_format.W4Weight, sms: int) -> list[dict]:
    """The prepared loop's configs for weight ``p``: each of :data:`TILES`, with and without ``PREFETCH``, at
    :func:`helpers.w4_kernel.uneven_split`'s split for the tile times each of :data:`SPLIT_SCALES` (distinct,
    1 … steps)."""
    n, k = p.shape
    out = []
    for rows, codes, warps in TILES:
        groups = w4_kernel._fitting_groups(p, max(1, codes // p.group_size))
        tiles, steps = math.ceil(n / rows), k // (p.group_size * groups)
        base = w4_kernel.uneven_split(tiles, steps, sms, warps, codes=p.group_size * groups)
        splits = sorted({max(1, min(steps, round(base * f))) for f in SPLIT_SCALES})
        for split in splits:
            split = math.ceil(steps / math.ceil(steps / split))   # no program left empty
            for prefetch in (False, True):
                cfg = dict(BLOCK_N=rows, GROUPS=groups, SPLIT_K=split, num_warps=warps, PREFETCH=prefetch)
                if cfg not in out:
                    out.append(cfg)
    return out


def main():
    ap = argparse.ArgumentParser(prog="python -m benchmarks.x_side")
    ap.add_argument("--out", required=True)
    ap.add_argument("--groups", default="128,64")
    ap.add_argument("--budget-s", type=float, default=420, help="stop after this many seconds (rows kept)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("x_side.py times CUDA kernels; there is no CUDA device here")
    from benchmarks.kernels import FRESH, HELD_OUT, Shape, ours_ms, tinygemm_row
    t0 = time.perf_counter()
    copy = timing.copy_bandwidth_gbps()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "copy_GBps": copy, "sms": sms, "tiles": TILES, "split_scales": SPLIT_SCALES}
    rows, out = [], Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"copy bandwidth {copy:.0f} GB/s on {meta['device']}", flush=True)

    def save():
        write_json(out, {"meta": meta, "rows": rows}, indent=1, default=str)

    def add(kernel, label, k, n, g, ms, nbytes, echo=True, **extra):
        row = {"kernel": kernel, "format": f"W4A16 g{g}", "shape": label, "K": k, "N": n, "M": 1, "group": g,
               "ms": ms, "GBps": nbytes / (ms * 1e-3) / 1e9, "copy_GBps": copy, "timing": "cudagraph",
               "held_out": label in HELD_OUT or label in FRESH, **extra}
        rows.append(row)
        if echo:
            print(f"{kernel[:40]:40s} {label[:30]:30s} g{g:<4} {ms * 1e3:8.1f} µs {row['GBps']:6.0f} GB/s "
                  f"({100 * row['GBps'] / copy:.0f} % of copy)", flush=True)

    groups = [int(g) for g in args.groups.split(",")]
    for label, (k, n) in big_shapes().items():
        if time.perf_counter() - t0 > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: stopping before {label}", flush=True)
            break
        sh = Shape(k, n, groups=groups)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        for g in groups:
            ps, nbytes = sh.packed[g], sh.packed[g][0].nbytes
            rule = w4_kernel.narrow_gemv_config(ps[0], sms=sms)
            locks = torch.zeros(math.ceil(n / min(t[0] for t in TILES)), dtype=torch.int32, device="cuda")
            prep = prepare_x(x, g)
            ref = w4_format.reference_matmul(x.float(), ps[0]).float()
            add("ours (the rule)", label, k, n, g, ours_ms(sh, g, x, rule)["cudagraph"], nbytes, config=rule)
            best = None
            for cfg in tile_configs(ps[0], sms):
                ms = timing.graph_ms([lambda p=p, cfg=cfg: gemv_prepared(prep, p, cfg, locks) for p in ps])
                add("prepared x: loop alone", label, k, n, g, ms, nbytes, echo=False, config=cfg)
                if best is None or ms < best[1]:
                    best = (cfg, ms)
            cfg = best[0]
            got = gemv_prepared(prep, ps[0], cfg, out_dtype=torch.float32)
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            add("prepared x: loop alone, the best", label, k, n, g, best[1], nbytes, config=cfg, rel_err=err,
                exact=err <= 2e-3)
            ctrl = dict(cfg, PREFETCH=False)
            got = in_kernel_x(x, ps[0], ctrl, locks).float()
            cerr = ((got - ref).abs().max() / ref.abs().max()).item()
            add("in-kernel x (the rule's kernel) at the best tile", label, k, n, g,
                timing.graph_ms([lambda p=p: in_kernel_x(x, p, ctrl, locks) for p in ps]), nbytes, config=ctrl,
                rel_err=cerr, exact=cerr <= 2e-3)
            cand = candidate_config(ps[0], sms)
            got = gemv_prepared(prep, ps[0], cand, out_dtype=torch.float32)
            aerr = ((got - ref).abs().max() / ref.abs().max()).item()
            add("prepared x: the candidate rule, loop alone", label, k, n, g,
                timing.graph_ms([lambda p=p: gemv_prepared(prep, p, cand, locks) for p in ps]), nbytes, config=cand,
                rel_err=aerr, exact=aerr <= 2e-3)
            add("prepared x: the candidate rule with its preparation", label, k, n, g,
                timing.graph_ms([lambda p=p: gemv_prepared(prepare_x(x, g, prep), p, cand, locks) for p in ps]),
                nbytes, config=cand)
            add("prepared x: preparation + the best", label, k, n, g,
                timing.graph_ms([lambda p=p: gemv_prepared(prepare_x(x, g, prep), p, cfg, locks) for p in ps]),
                nbytes, config=cfg)
            prep_ms = timing.graph_ms([lambda: prepare_x(x, g, prep)] * 8)
            rows.append({"kernel": "prepared x: preparation alone", "shape": label, "K": k, "group": g,
                         "ms": prep_ms, "timing": "cudagraph"})
            print(f"{'  preparation alone':40s} {prep_ms * 1e3:8.1f} µs; the best loop {cfg}", flush=True)
            add("ours (the rule), again last", label, k, n, g, ours_ms(sh, g, x, rule)["cudagraph"], nbytes, config=rule)
            tinygemm_row(sh, label, g, x, "X", label in HELD_OUT or label in FRESH,
                         lambda kernel, fmt, lab, k_, n_, m, g_, ms, nb, tk, **e: add(kernel, lab, k_, n_, g_, ms, nb))
            save()
        sh.free()
    save()
    print(f"wrote {out} ({len(rows)} rows, {time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
