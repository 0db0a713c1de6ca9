"""Round 12's question, measured: how much of the one-row GEMV's time is its activation side?

    python -m benchmarks.x_side --out results/h100/x_side.json

Every step of :func:`helpers.w4_kernel._w4a16_gemv_kernel` (the narrow rule's tile: 32 rows, 2 warps,
fp16-pair sums kept per group) does the work of ``x`` again in every program: eight scalar loads of
each word's columns, the largest ``|x|`` (a reduction across the program's threads), ``log2``/``exp2``
of the shrink, ``x·shrink`` and its fp16 pairs, ``Σx`` per group — and Triton moves those values between
layouts through shared memory, so a step holds 14 barriers (``scripts/kernel_sass.py``: 22.8
instructions per word of 8 codes, 126 registers). The weight side is 13 (one ``shr``, four ``lop3``,
four ``sub.f16x2``, four ``fma.f16x2``).

This benchmark does the activation side **once per call**, in a kernel of its own
(:func:`prepare_x`: one program; the shrink from the largest ``|x|`` of the whole row, the fp16 pairs in
four planes, ``Σ x·shrink`` per group), and times the GEMV loop that then only loads them
(:func:`gemv_prepared`: 19.3 instructions per word, 94 registers, 10 barriers per step at g128) — alone
(the bar: what a step costs without the activation work) and with its preparation (what a decode step
would pay: one more launch per linear). Beside them, in one process: the narrow rule as it is
(:func:`helpers.w4_kernel.narrow_gemv_config`, same split) and tinygemm. Every prepared result is
checked against :func:`helpers.w4_format.reference_matmul` (``rel_err``).

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
CHUNK_WORDS = 512    # word columns (4096 activations) the preparing program handles per loop step
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
    """One program: ``shrink = 2^e`` putting ``max|x|`` in ``(LIMIT/2, LIMIT]``; then per word column ``c``
    the fp16 pairs ``(x₀, x₄)``, ``(x₁/16, x₅/16)``, ``(x₂, x₆)``, ``(x₃/16, x₇/16)`` of ``x[8c + j]·shrink``
    (planes 0–3, the second operands of :func:`helpers.w4_kernel._word_pairs_half2`), ``Σ x·shrink`` per
    group, and ``1/shrink``."""
    K8 = K // 8
    WPG: tl.constexpr = GROUP // 8
    offs = tl.arange(0, CW)
    big = tl.zeros((CW,), dtype=tl.float32)
    for c0 in range(0, K8 * 8, CW):
        big = tl.maximum(big, tl.abs(tl.load(x_ptr + c0 + offs, mask=c0 + offs < K, other=0.0).to(tl.float32)))
    most = tl.max(big)
    e = tl.minimum(tl.maximum(tl.floor(tl.log2(LIMIT / tl.maximum(most, 1e-30))), -126.0), 100.0)
    shrink = tl.where(most > 0, tl.exp2(e), 1.0)
    tl.store(inv_ptr, 1.0 / shrink)
    for c0 in range(0, K8, CW):
        c = c0 + offs
        m = c < K8
        base = x_ptr + c * 8
        x0 = tl.load(base, mask=m, other=0.0).to(tl.float32) * shrink
        x1 = tl.load(base + 1, mask=m, other=0.0).to(tl.float32) * shrink
        x2 = tl.load(base + 2, mask=m, other=0.0).to(tl.float32) * shrink
        x3 = tl.load(base + 3, mask=m, other=0.0).to(tl.float32) * shrink
        x4 = tl.load(base + 4, mask=m, other=0.0).to(tl.float32) * shrink
        x5 = tl.load(base + 5, mask=m, other=0.0).to(tl.float32) * shrink
        x6 = tl.load(base + 6, mask=m, other=0.0).to(tl.float32) * shrink
        x7 = tl.load(base + 7, mask=m, other=0.0).to(tl.float32) * shrink
        tl.store(planes_ptr + c, _pack_pair(x0, x4), mask=m)
        tl.store(planes_ptr + plane_stride + c, _pack_pair(x1 * 0.0625, x5 * 0.0625), mask=m)
        tl.store(planes_ptr + 2 * plane_stride + c, _pack_pair(x2, x6), mask=m)
        tl.store(planes_ptr + 3 * plane_stride + c, _pack_pair(x3 * 0.0625, x7 * 0.0625), mask=m)
        per_word = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
        per_group = tl.sum(tl.reshape(per_word, (CW // WPG, WPG)), axis=1)
        gi = c0 // WPG + tl.arange(0, CW // WPG)
        tl.store(xs_ptr + gi, per_group, mask=gi < K8 // WPG)


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
                          BLOCK_N: tl.constexpr, PLAIN: tl.constexpr):
    """The narrow GEMV's loop with the activation side prepared (:func:`prepare_x`): per step, the words
    [BN, WPS] and four planes of fp16 pairs [WPS]; per group ``acc += s·(Σ (q−8)·x − (z−8)·Σx)`` in the
    shrunk units, the total multiplied by ``1/shrink`` once. ``K`` split ``SPLIT_K`` ways (``⌈steps/SPLIT_K⌉``
    steps a program, the last fewer), the partials summed by the last program to finish, as the GEMV's."""
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
    end = tl.minimum((pid_k + 1) * span, steps)
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_w[None, :]
    for step in tl.range(pid_k * span, end):
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
        sc = tl.load(s_ptr + offs_n[:, None] * stride_sn + g[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        z = tl.load(z_ptr + offs_n[:, None] * stride_sn + g[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        acc += tl.sum(sc * (dot - (z - 8.0) * xs[None, :]), axis=1)
    acc = acc * tl.load(inv_ptr)
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
    """The activation side of one row ``x[1, K]`` for one group size: the planes, ``Σx`` per group, ``1/shrink``."""

    def __init__(self, k: int, group: int, device):
        if k % 8 or k % group:
            raise ValueError(f"K = {k} must be a multiple of 8 and of the group size {group}")
        self.k, self.group = k, group
        self.plane_stride = math.ceil(k // 8 / PLANE_ALIGN) * PLANE_ALIGN
        self.planes = torch.empty(4 * self.plane_stride, dtype=torch.int32, device=device)
        self.xs = torch.empty(k // group, dtype=torch.float32, device=device)
        self.inv = torch.empty(1, dtype=torch.float32, device=device)


def prepare_x(x: torch.Tensor, group: int, out: Prepared | None = None) -> Prepared:
    """Run :func:`_prepare_x_kernel` on one row ``x[1, K]`` (into ``out`` when given: no allocation)."""
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"x must be one row [1, K], got shape {tuple(x.shape)}")
    k = x.shape[1]
    out = out or Prepared(k, group, x.device)
    if (out.k, out.group) != (k, group):
        raise ValueError(f"out was made for K = {out.k}, group {out.group}; x has K = {k}, group {group}")
    _kernel("prepare")[(1,)](x.contiguous(), out.planes, out.xs, out.inv, k, out.plane_stride, GROUP=group,
                             LIMIT=acc16_x_limit(group), CW=CHUNK_WORDS, **({} if _interpreted() else {"num_warps": 8}))
    return out


def gemv_prepared(prep: Prepared, p: w4_format.W4Weight, cfg: dict, locks: torch.Tensor | None = None,
                  out_dtype=torch.bfloat16) -> torch.Tensor:
    """``x @ dequantize(p).T`` for the row ``prep`` was made from, with ``cfg``'s ``BLOCK_N``, ``GROUPS``,
    ``SPLIT_K`` and ``num_warps`` (:func:`helpers.w4_kernel.narrow_gemv_config`'s)."""
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
                          GROUPS=cfg["GROUPS"], BLOCK_N=cfg["BLOCK_N"], PLAIN=_interpreted(), **extra)
    return y


def big_shapes(min_mb: float = MIN_MB) -> dict:
    """The (K, N) weights of ``benchmarks.kernels``' three shape sets with at least ``min_mb`` MB at g128."""
    from benchmarks.kernels import FRESH, HELD_OUT, SHAPES
    out = {}
    for label, (k, n) in {**SHAPES, **HELD_OUT, **FRESH}.items():
        if n * k // 2 + 2 * 2 * n * (k // 128) >= min_mb * 1e6:
            out[label] = (k, n)
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
            "copy_GBps": copy, "sms": sms}
    rows, out = [], Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"copy bandwidth {copy:.0f} GB/s on {meta['device']}", flush=True)

    def add(kernel, label, k, n, g, ms, nbytes, **extra):
        row = {"kernel": kernel, "format": f"W4A16 g{g}", "shape": label, "K": k, "N": n, "M": 1, "group": g,
               "ms": ms, "GBps": nbytes / (ms * 1e-3) / 1e9, "copy_GBps": copy, "timing": "cudagraph",
               "held_out": label in HELD_OUT or label in FRESH, **extra}
        rows.append(row)
        write_json(out, {"meta": meta, "rows": rows}, indent=1, default=str)
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
            cfg = w4_kernel.narrow_gemv_config(ps[0], sms=sms)
            locks = torch.zeros(4096, dtype=torch.int32, device="cuda")
            prep = prepare_x(x, g)
            ref = w4_format.reference_matmul(x.float(), ps[0]).float()
            got = gemv_prepared(prep, ps[0], cfg, out_dtype=torch.float32)
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            add("ours (the rule)", label, k, n, g, ours_ms(sh, g, x, cfg)["cudagraph"], nbytes, config=cfg)
            add("prepared x: loop alone", label, k, n, g,
                timing.graph_ms([lambda p=p: gemv_prepared(prep, p, cfg, locks) for p in ps]), nbytes, config=cfg,
                rel_err=err, exact=err <= 2e-3)
            add("prepared x: preparation + loop", label, k, n, g,
                timing.graph_ms([lambda p=p: gemv_prepared(prepare_x(x, g, prep), p, cfg, locks) for p in ps]),
                nbytes, config=cfg, rel_err=err, exact=err <= 2e-3)
            prep_ms = timing.graph_ms([lambda: prepare_x(x, g, prep)] * 8)
            rows.append({"kernel": "prepared x: preparation alone", "shape": label, "K": k, "group": g,
                         "ms": prep_ms, "timing": "cudagraph"})
            print(f"{'  preparation alone':40s} {prep_ms * 1e3:8.1f} µs", flush=True)
            tinygemm_row(sh, label, g, x, "X", label in HELD_OUT or label in FRESH,
                         lambda kernel, fmt, lab, k_, n_, m, g_, ms, nb, tk, **e: add(kernel, lab, k_, n_, g_, ms, nb))
        sh.free()
    write_json(out, {"meta": meta, "rows": rows}, indent=1, default=str)
    print(f"wrote {out} ({len(rows)} rows, {time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
