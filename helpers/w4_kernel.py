"""How int4 becomes speed: W4A16 matmuls in Triton that read the course's packed format.

The weight ``W[N, K]`` (``N`` outputs, ``K`` inputs) is quantized 4-bit asymmetric per group of
``g`` inputs (notebook 03): codes ``q ∈ [0, 15]``, an fp16 scale ``s`` and zero ``z`` per group, and

    y[m, n] = Σ_groups s[n, j] · ( Σ_{k ∈ group j} x[m, k] · q[n, k]  −  z[n, j] · Σ_{k ∈ group j} x[m, k] )

which is ``x @ dequantize(W).T`` rearranged so the scale is applied once per group, not per weight.
The packed format (:class:`helpers.w4_format.W4Weight`): read as int32 words, nibble ``j`` of word
``w`` of row ``n`` is ``q[n, 8w + j]``.

Every weight byte is read once per call, so at decode (``M`` = 1 … 64 rows) the matmul is
memory-bound: its limit is ``bytes read / copy bandwidth``. Two kernels (notebook 08 measures each
step of each, ``benchmarks/kernels.py``):

* ``KERNEL="gemv"`` — one row on CUDA cores, one group per step: each thread holds whole words of
  a few rows (128-bit loads) and sums their codes in registers, so the only work per code is its
  conversion and one FFMA; split-K (:func:`gemv_split`) so every SM streams. The nibble stays where
  it is in the word: ``(w & 0xF << 4j) | 0x4B000000`` *is* the float32 ``2^23 + q·16^j`` (``MAGIC``:
  one ``lop3`` and one subtraction per code, no int→float instruction), and ``x`` is scaled by
  ``16^-j`` once per column instead. ``HALF2`` sums two codes per instruction in fp16 pairs
  (:func:`_word_dot_half2`; a step whose ``|x|`` could overflow them is scaled by a power of two
  first), and ``ACC16`` keeps those sums in fp16 for a whole group (:func:`_group_dot_acc16`: one
  conversion per group, ``x`` scaled next to :func:`acc16_x_limit`); the GEMV rule (:func:`auto_config` with
  ``{"PREPARED": False}``) uses both on narrow tiles (:data:`NARROW_GEMV`, 32 rows per program).
* ``KERNEL="tc"`` — any ``M`` up to 64 on tensor cores (``tl.dot``; one row is padded to a 16-row
  tile, whose wasted products cost less than the unpacking they replace): per group, the even and
  the odd codes of each byte become two 16-bit tiles multiplied by the even and odd columns of
  ``x``. ``DEQUANT="lop3"`` builds two fp16 (or bf16) codes per 32-bit instruction —
  ``(b & 0x000F000F) | 0x64006400`` *is* the fp16 pair ``1024 + q`` (FasterTransformer's and
  Marlin's ``lop3`` dequantizer; ``0x4300`` is bf16's ``128``), the magic number then subtracted two
  codes at a time (exact);
  ``"shift"`` is the same in plain Triton (and runs in the interpreter). ``SWAP`` multiplies
  ``W · xᵀ`` instead (the weight tile is the 64-row operand of the MMA); ``REDUCE`` sums the split-K
  partials with fp32 atomics, or ``"serial"``: each split writes its partial, and the last to
  arrive adds them and writes the output once, in its dtype (one launch, no zero-fill).

* ``KERNEL="prepared"`` — one row, the activation side done **once per call** (round 12): :func:`prepare_x`
  writes, per group, a power-of-two shrink and ``Σx``, and ``x``'s fp16 pairs in four planes (five for
  ``SUBNORMAL``, below); then
  :func:`gemv_prepared`'s loop only loads them beside the words (:func:`_word_pairs_half2` on each word), on
  narrow tiles (:func:`prepared_config`: 8 rows per program, up to 2048 codes per step). Two launches;
  ``auto_config``'s one-row default since round 14 (:data:`GEMV_RULE` asks for the GEMV). Where the tile's step does
  not divide ``K`` and holds few codes, :func:`pack_width` gives the ``K'`` a layer pads its weight to at pack time (round 13;
  ``W4Linear(..., family={"PREPARED": True, "PAD": True})``): one row of ``x`` with ``K`` columns then meets
  a weight of ``K'``, and :func:`prepare_x` writes zeros past ``K``. Config ``SUBNORMAL`` (round 17, off by
  default, not yet timed): the codes read as fp16 subnormals, ``w & 0x000F000F`` = ``(q₀, q₄)·2⁻²⁴``
  (:func:`_word_pairs_subnormal`: no magic number to subtract; each word's chain starts from a fifth, centring
  plane), for a row prepared with ``subnormal=True``.

The readable reference is :func:`helpers.w4_format.reference_matmul` (dequantize, then matmul); both kernels are
tested against it on small shapes in Triton's interpreter on CPU (``TRITON_INTERPRET=1``, read when
triton is imported: :func:`helpers.device.use_triton_interpreter_without_gpu` sets it, before that).
"""
from __future__ import annotations

import itertools
import math
import os

import torch

from . import validate as v
from .w4_format import W4Weight

try:  # Triton is optional: CPU installs without it still import this module (the kernels then refuse)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None


HALF2_X_LIMIT = 2047.0   # |x| up to which the fp16 pair sums cannot overflow: 4 products of |q − 8| ≤ 8 per half
# the same number as the kernels read it (a jit'ed function reads module globals only as constexprs)
_X_LIMIT = tl.constexpr(HALF2_X_LIMIT) if triton is not None else HALF2_X_LIMIT


SUBNORMAL_X_LIMIT = 32768.0   # round 17: the largest |x·shrink| of a group on the subnormal path (a power of two)


def prepared_x_limit(group: int, subnormal: bool = False) -> float:
    """The ``LIMIT`` a row is prepared at (:func:`_prepare_x_kernel`): :func:`acc16_x_limit` for the centred
    codes' fp16 sums, :data:`SUBNORMAL_X_LIMIT` for the subnormal codes (``SUBNORMAL``, round 17: their products
    are ``q·x·2⁻²⁴``, so ``x`` is brought as high as fp16 allows, each product and group sum far from overflow)."""
    return SUBNORMAL_X_LIMIT if subnormal else acc16_x_limit(group)


def acc16_x_limit(group: int) -> float:
    """The largest ``|x|`` (a power of two) for which a whole group's fp16 pair sums cannot overflow
    (``ACC16``): each half sums ``group/2`` products of ``|q − 8| ≤ 8``, so ``4·group·|x| ≤ 65504``
    (fp16's largest finite value), rounded down to a power of two (64 at group 128, 128 at group 64)."""
    return float(2 ** math.floor(math.log2(65504 / (4 * group))))


def _device(fn):
    """Triton's jit of a device function the kernels call (the plain function where Triton is absent)."""
    return triton.jit(fn) if triton is not None else fn


@_device
def _load_x(x_ptr, step, offs_w, WPS: tl.constexpr):
    """``x_j`` for ``j`` = 0 … 7: the input column of nibble ``j`` of each of a step's words, in fp32,
    loaded where the words' columns already are (no layout conversion)."""
    col = x_ptr + step * WPS * 8 + offs_w * 8
    return (tl.load(col).to(tl.float32), tl.load(col + 1).to(tl.float32), tl.load(col + 2).to(tl.float32),
            tl.load(col + 3).to(tl.float32), tl.load(col + 4).to(tl.float32), tl.load(col + 5).to(tl.float32),
            tl.load(col + 6).to(tl.float32), tl.load(col + 7).to(tl.float32))


@_device
def _word_dot_f32(w, x0, x1, x2, x3, x4, x5, x6, x7, MAGIC: tl.constexpr):
    """``Σ_j q_j · x_j`` over the 8 codes of each int32 word ``w`` [BN, W], in fp32: nibble j left in
    place, ``q·16^(j mod 4)`` (the high half after one shift by 16), so ``x_j`` is scaled by
    ``16^-(j mod 4)`` once per column instead of every code shifted down; one FFMA per code, chained."""
    if MAGIC:   # (w & 0xF<<4j) | 0x4B000000 is the float 2^23 + q·16^j: one lop3 and one subtraction
        q0, q1, q2, q3, q4, q5, q6, q7 = tl.inline_asm_elementwise(
            "{ .reg .b32 h; shr.b32 h, $8, 16;"
            " lop3.b32 $0, $8, 0xF, 0x4B000000, 0xEA; lop3.b32 $1, $8, 0xF0, 0x4B000000, 0xEA;"
            " lop3.b32 $2, $8, 0xF00, 0x4B000000, 0xEA; lop3.b32 $3, $8, 0xF000, 0x4B000000, 0xEA;"
            " lop3.b32 $4, h, 0xF, 0x4B000000, 0xEA; lop3.b32 $5, h, 0xF0, 0x4B000000, 0xEA;"
            " lop3.b32 $6, h, 0xF00, 0x4B000000, 0xEA; lop3.b32 $7, h, 0xF000, 0x4B000000, 0xEA;"
            " sub.f32 $0, $0, 0f4B000000; sub.f32 $1, $1, 0f4B000000; sub.f32 $2, $2, 0f4B000000;"
            " sub.f32 $3, $3, 0f4B000000; sub.f32 $4, $4, 0f4B000000; sub.f32 $5, $5, 0f4B000000;"
            " sub.f32 $6, $6, 0f4B000000; sub.f32 $7, $7, 0f4B000000; }",
            "=r,=r,=r,=r,=r,=r,=r,=r,r", [w], dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    else:       # the same values by an int→float conversion each
        h = w >> 16
        q0, q1, q2, q3 = (w & 0xF).to(tl.float32), (w & 0xF0).to(tl.float32), \
            (w & 0xF00).to(tl.float32), (w & 0xF000).to(tl.float32)
        q4, q5, q6, q7 = (h & 0xF).to(tl.float32), (h & 0xF0).to(tl.float32), \
            (h & 0xF00).to(tl.float32), (h & 0xF000).to(tl.float32)
    part = q0 * x0[None, :]
    part += q1 * (x1 * 0.0625)[None, :]
    part += q2 * (x2 * 0.00390625)[None, :]
    part += q3 * (x3 * 0.000244140625)[None, :]
    part += q4 * x4[None, :]
    part += q5 * (x5 * 0.0625)[None, :]
    part += q6 * (x6 * 0.00390625)[None, :]
    part += q7 * (x7 * 0.000244140625)[None, :]
    return part


@_device
def _x_pairs_half2(x0, x1, x2, x3, x4, x5, x6, x7):
    """The columns of a word's nibbles (j, j + 4) as fp16 pairs, the high nibbles' ``x`` divided by 16:
    the second operands of :func:`_word_pairs_half2`."""
    return tl.inline_asm_elementwise(
        "{ .reg .f16 a, b; cvt.rn.f16.f32 a, $4; cvt.rn.f16.f32 b, $5; mov.b32 $0, {a, b};"
        " cvt.rn.f16.f32 a, $6; cvt.rn.f16.f32 b, $7; mov.b32 $1, {a, b};"
        " cvt.rn.f16.f32 a, $8; cvt.rn.f16.f32 b, $9; mov.b32 $2, {a, b};"
        " cvt.rn.f16.f32 a, $10; cvt.rn.f16.f32 b, $11; mov.b32 $3, {a, b}; }",
        "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [x0, x4, x1 * 0.0625, x5 * 0.0625, x2, x6, x3 * 0.0625, x7 * 0.0625],
        dtype=(tl.int32,) * 4, is_pure=True, pack=1)


@_device
def _word_pairs_half2(w, p04, p15, p26, p37):
    """``(Σ_{j<4} (q_j − 8)·x_j, Σ_{j≥4} (q_j − 8)·x_j)`` of each int32 word ``w`` [BN, W] as one fp16
    pair (an int32), two codes per instruction: ``(w & 0x000F000F) | 0x64006400`` *is* the fp16 pair
    ``(1024 + q_0, 1024 + q_4)`` and ``(w & 0x00F000F0) | 0x64006400`` is ``(1024 + 16q_1, 1024 + 16q_5)``
    (FasterTransformer's and Marlin's ``lop3`` dequantizer); subtracting ``1024 + 8`` (or ``1024 + 128``)
    leaves ``q − 8`` (or ``16(q − 8)``, met by ``x/16``) exactly; four ``HFMA2`` sum the products."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 h, c0, c1, c2, c3, k0, k1;"
        " mov.b32 k0, 0x64086408; mov.b32 k1, 0x64806480; shr.b32 h, $1, 8;"
        " lop3.b32 c0, $1, 0x000F000F, 0x64006400, 0xEA; lop3.b32 c1, $1, 0x00F000F0, 0x64006400, 0xEA;"
        " lop3.b32 c2, h, 0x000F000F, 0x64006400, 0xEA; lop3.b32 c3, h, 0x00F000F0, 0x64006400, 0xEA;"
        " sub.f16x2 c0, c0, k0; sub.f16x2 c1, c1, k1; sub.f16x2 c2, c2, k0; sub.f16x2 c3, c3, k1;"
        " mul.rn.f16x2 $0, c0, $2; fma.rn.f16x2 $0, c1, $3, $0; fma.rn.f16x2 $0, c2, $4, $0;"
        " fma.rn.f16x2 $0, c3, $5, $0; }",
        "=r,r,r,r,r,r", [w, tl.broadcast_to(p04[None, :], w.shape), tl.broadcast_to(p15[None, :], w.shape),
                         tl.broadcast_to(p26[None, :], w.shape), tl.broadcast_to(p37[None, :], w.shape)],
        dtype=tl.int32, is_pure=True, pack=1)


@_device
def _pair_sum_f32(a):
    """An fp16 pair (an int32) as the fp32 sum of its halves."""
    return tl.inline_asm_elementwise(
        "{ .reg .f16 lo, hi; .reg .f32 f0, f1; mov.b32 {lo, hi}, $1; cvt.f32.f16 f0, lo; cvt.f32.f16 f1, hi;"
        " add.f32 $0, f0, f1; }", "=r,r", [a], dtype=tl.float32, is_pure=True, pack=1)


@_device
def _word_pairs_subnormal(w, p04, p15, p26, p37, pc):
    """``(Σ_{j<4} (q_j − 8)·X_j, Σ_{j≥4} (q_j − 8)·X_j)·2⁻²⁴`` of each int32 word ``w`` [BN, W] as one fp16 pair (an
    int32), ``X`` the prepared planes (:func:`prepare_x` with ``subnormal=True``). Round 17: ``w & 0x000F000F``
    *is* the fp16 pair ``(q_0·2⁻²⁴, q_4·2⁻²⁴)`` — fp16's subnormals, exponent field 0, value = mantissa·2⁻²⁴ — and
    ``w & 0x00F000F0`` is ``(16q_1·2⁻²⁴, 16q_5·2⁻²⁴)``, met by ``X/16``: the codes need no subtraction of the magic
    number (:func:`_word_pairs_half2`'s four ``sub.f16x2``), only an ``AND``; fp16 arithmetic keeps subnormals
    (PTX ISA: ``mul``/``fma`` ``.f16x2`` without ``.ftz``). The chain starts from the centring plane ``pc`` =
    ``(−8·Σ_{j<4} X_j, −8·Σ_{j≥4} X_j)·2⁻²⁴`` instead of zero (one ``fma`` where there was a ``mul``), so each
    word's sum is the centred codes' whatever the mean of ``x`` — though its first partial sums, and the centring
    value's own fp16 rounding, are as large as ``8·|ΣX|``: less exact than :func:`_word_pairs_half2`'s."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 h, c0, c1, c2, c3; shr.b32 h, $1, 8;"
        " and.b32 c0, $1, 0x000F000F; and.b32 c1, $1, 0x00F000F0; and.b32 c2, h, 0x000F000F; and.b32 c3, h, 0x00F000F0;"
        " fma.rn.f16x2 $0, c0, $2, $6; fma.rn.f16x2 $0, c1, $3, $0; fma.rn.f16x2 $0, c2, $4, $0;"
        " fma.rn.f16x2 $0, c3, $5, $0; }",
        "=r,r,r,r,r,r,r", [w, tl.broadcast_to(p04[None, :], w.shape), tl.broadcast_to(p15[None, :], w.shape),
                           tl.broadcast_to(p26[None, :], w.shape), tl.broadcast_to(p37[None, :], w.shape),
                           tl.broadcast_to(pc[None, :], w.shape)],
        dtype=tl.int32, is_pure=True, pack=1)


@_device
def _subnormal_fma(c, p, lo, hi):
    """One step of :func:`_word_pairs_subnormal`'s ``fma.rn.f16x2`` chain in plain Triton: the masked code pairs
    ``c`` [BN, W] (int32 of two fp16 subnormals) times one plane ``p`` [W] of the prepared row, plus ``lo``/``hi``
    (fp16), each rounded once to fp16 — the product of two fp16 is exact in fp32, so fp32 then fp16 is ``fma``'s
    single rounding (but for the rare double-rounding tie)."""
    c_lo, c_hi = _unpack_pair(c)
    x_lo, x_hi = _unpack_pair(p)
    return ((c_lo.to(tl.float32) * x_lo.to(tl.float32)[None, :] + lo.to(tl.float32)).to(tl.float16),
            (c_hi.to(tl.float32) * x_hi.to(tl.float32)[None, :] + hi.to(tl.float32)).to(tl.float16))


@_device
def _group_dot_subnormal_plain(w, p04, p15, p26, p37, pc, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                               WPG: tl.constexpr):
    """:func:`_word_pairs_subnormal`'s group sums in plain Triton (the interpreter runs no PTX): the same masked
    bits viewed as fp16 subnormals, the four products of each half chained from the centring plane ``pc`` as its
    ``fma`` chain rounds them (:func:`_subnormal_fma`), then the words of a group summed in fp16 and the two
    halves added in fp32 — ``Σ_{k ∈ group} (q_k − 8)·X_k·2⁻²⁴`` per row and group."""
    h = w >> 8
    c_lo, c_hi = _unpack_pair(pc)
    lo = tl.broadcast_to(c_lo[None, :], w.shape)
    hi = tl.broadcast_to(c_hi[None, :], w.shape)
    lo, hi = _subnormal_fma(w & 0x000F000F, p04, lo, hi)
    lo, hi = _subnormal_fma(w & 0x00F000F0, p15, lo, hi)
    lo, hi = _subnormal_fma(h & 0x000F000F, p26, lo, hi)
    lo, hi = _subnormal_fma(h & 0x00F000F0, p37, lo, hi)
    lo = tl.reduce(tl.reshape(lo, (BLOCK_N, GROUPS, WPG)), 2, _add)
    hi = tl.reduce(tl.reshape(hi, (BLOCK_N, GROUPS, WPG)), 2, _add)
    return lo.to(tl.float32) + hi.to(tl.float32)


@_device
def _add_pairs(a, b):
    """Two fp16 pairs (int32 each) added half by half: one ``HADD2`` (a reduction's combine)."""
    return tl.inline_asm_elementwise("add.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                     pack=1)


@_device
def _add(a, b):
    return a + b


@_device
def _prefetch_l2(ptrs):
    """Asks the L2 cache for the 128-byte line of each address (``prefetch.global.L2``; nothing is
    waited for): a later ``tl.load`` of those bytes then finds them there."""
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                     is_pure=False, pack=1)


@_device
def _word_halves_f16(w, x0, x1, x2, x3, x4, x5, x6, x7):
    """:func:`_word_pairs_half2`'s two sums as two fp16 tensors, in plain Triton (the interpreter runs
    no inline PTX): codes shifted down and centred, each product and sum rounded to fp16."""
    h = w >> 16
    lo = ((w & 0xF) - 8).to(tl.float16) * x0.to(tl.float16)[None, :]
    lo += (((w >> 4) & 0xF) - 8).to(tl.float16) * x1.to(tl.float16)[None, :]
    lo += (((w >> 8) & 0xF) - 8).to(tl.float16) * x2.to(tl.float16)[None, :]
    lo += (((w >> 12) & 0xF) - 8).to(tl.float16) * x3.to(tl.float16)[None, :]
    hi = ((h & 0xF) - 8).to(tl.float16) * x4.to(tl.float16)[None, :]
    hi += (((h >> 4) & 0xF) - 8).to(tl.float16) * x5.to(tl.float16)[None, :]
    hi += (((h >> 8) & 0xF) - 8).to(tl.float16) * x6.to(tl.float16)[None, :]
    hi += (((h >> 12) & 0xF) - 8).to(tl.float16) * x7.to(tl.float16)[None, :]
    return lo, hi


@_device
def _word_dot_half2(w, x0, x1, x2, x3, x4, x5, x6, x7, MAGIC: tl.constexpr):
    """``Σ_j (q_j − 8) · x_j`` over the 8 codes of each int32 word ``w`` [BN, W] in fp32, two codes per
    instruction: nibbles (j, j + 4) as one fp16 pair, the four pairs' products summed in fp16
    (:func:`_word_pairs_half2`), the two halves added in fp32. Centred codes keep the fp16 sums small:
    they cannot overflow while ``|x| ≤`` :data:`HALF2_X_LIMIT`."""
    if MAGIC:
        p04, p15, p26, p37 = _x_pairs_half2(x0, x1, x2, x3, x4, x5, x6, x7)
        return _pair_sum_f32(_word_pairs_half2(w, p04, p15, p26, p37))
    lo, hi = _word_halves_f16(w, x0, x1, x2, x3, x4, x5, x6, x7)
    return lo.to(tl.float32) + hi.to(tl.float32)


@_device
def _group_dot_acc16(w, x0, x1, x2, x3, x4, x5, x6, x7, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                     WPG: tl.constexpr, MAGIC: tl.constexpr):
    """``Σ_{k ∈ group} (q_k − 8) · x_k`` per row and group [BN, GROUPS], every product *and* every sum
    of the group in fp16 pairs (:func:`_word_pairs_half2`, then a reduction whose combine is one
    ``HADD2``), converted to fp32 once per group instead of once per word."""
    if MAGIC:
        p04, p15, p26, p37 = _x_pairs_half2(x0, x1, x2, x3, x4, x5, x6, x7)
        pairs = _word_pairs_half2(w, p04, p15, p26, p37)
        return _pair_sum_f32(tl.reduce(tl.reshape(pairs, (BLOCK_N, GROUPS, WPG)), 2, _add_pairs))
    lo, hi = _word_halves_f16(w, x0, x1, x2, x3, x4, x5, x6, x7)
    lo = tl.reduce(tl.reshape(lo, (BLOCK_N, GROUPS, WPG)), 2, _add)
    hi = tl.reduce(tl.reshape(hi, (BLOCK_N, GROUPS, WPG)), 2, _add)
    return lo.to(tl.float32) + hi.to(tl.float32)


@_device
def _pdl_prologue(row_ptrs, ROW_BYTES: tl.constexpr, ELEM: tl.constexpr):
    """The start of a kernel launched with programmatic dependent launch (``launch_pdl``, sm_90+;
    CUTLASS's example 63 does the same for a GEMM's weights): the weight does not depend on the
    previous kernel, so its first bytes — ``ROW_BYTES`` from each of ``row_ptrs`` (elements of
    ``ELEM`` bytes), one step's — are asked of L2 (:func:`_prefetch_l2`, one 128-byte line at a time)
    while that kernel is still finishing; then the next kernel may launch
    (``griddepcontrol.launch_dependents``), and this one waits for the previous kernel's writes
    (``griddepcontrol.wait``) before it reads anything they produce. (Asking for a program's whole
    span instead was slower on large weights: results/h100/kernels.json, phase R of 773d89d.)"""
    for line in tl.static_range(0, ROW_BYTES, 128):
        _prefetch_l2(row_ptrs + line // ELEM)
    tl.extra.cuda.gdc_launch_dependents()
    tl.extra.cuda.gdc_wait()


@_device
def _serial_reduce(acc, ws_ptr, ws_off, part_stride, y_ptr, y_off, mask, lock_ptr, pid_k, SPLIT_K):
    """Split-K without atomics on the output: this program writes its partial ``acc`` to the workspace (split
    ``pid_k`` at ``ws_ptr + pid_k·part_stride + ws_off``), takes a ticket from its tile's counter ``lock_ptr``,
    and the last of the ``SPLIT_K`` to arrive adds the partials and writes ``y`` once, in its dtype (one
    launch, no zero-fill), then leaves the counter at zero for the next call."""
    tl.store(ws_ptr + pid_k * part_stride + ws_off, acc, mask=mask)
    tl.debug_barrier()
    ticket = tl.atomic_add(lock_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == SPLIT_K - 1:
        total = tl.zeros_like(acc)
        for part_k in range(0, SPLIT_K):
            total += tl.load(ws_ptr + part_k * part_stride + ws_off, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(y_ptr + y_off, total.to(y_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(lock_ptr, 0)


def _w4a16_gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, ws_ptr, lock_ptr, N, K, SPLIT_K, stride_wn, stride_sn,
                       GROUP: tl.constexpr, GROUPS: tl.constexpr, BLOCK_N: tl.constexpr, SERIAL: tl.constexpr,
                       MAGIC: tl.constexpr, HALF2: tl.constexpr, ACC16: tl.constexpr, ACC_LIMIT: tl.constexpr,
                       STAGES: tl.constexpr, PDL: tl.constexpr, EVEN: tl.constexpr):
    """One row of x (decode at batch 1) on CUDA cores, ``GROUPS`` groups per step: every thread sums its
    rows' codes in registers (no reduction across threads per word), then ``acc += s·(Σ x·q − z·Σ x)``
    per group. ``STAGES`` > 1: the next steps' words are already on their way (asynchronous copies)
    while this one is summed. ``HALF2``: the codes centred, ``acc += s·(Σ x·(q−8) − (z−8)·Σ x)``, two
    per instruction in fp16 (:func:`_word_dot_half2`); a step whose ``|x|`` exceeds
    :data:`HALF2_X_LIMIT` is summed with ``x`` scaled by a power of two ``2^-e`` (exact: only the
    exponent changes) and its sums scaled back by ``2^e``, so a large activation never overflows.
    ``ACC16`` (with ``HALF2``): each group's sums stay in fp16 pairs until the group is done
    (:func:`_group_dot_acc16`), and every step's ``x`` is scaled by the power of two that puts its largest
    magnitude in ``(ACC_LIMIT/2, ACC_LIMIT]`` (:func:`acc16_x_limit`: no group sum can overflow, and
    small activations keep fp16's precision). ``PDL`` (programmatic dependent launch, sm_90+): the
    program asks L2 for its span of the weight, lets the next kernel launch, and only then waits for
    the previous kernel's output (:func:`_pdl_prologue`). ``EVEN``: ``SPLIT_K`` divides the steps; else
    each program takes ``⌈steps / SPLIT_K⌉`` of them and the last fewer (:func:`uneven_split`)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    WPG: tl.constexpr = GROUP // 8                    # int32 words per row and group
    WPS: tl.constexpr = WPG * GROUPS                  # ... and per step
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_w = tl.arange(0, WPS)
    offs_g = tl.arange(0, GROUPS)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    steps = K // (GROUP * GROUPS)
    if EVEN:
        span = steps // SPLIT_K
        end = (pid_k + 1) * span
    else:   # ⌈steps / SPLIT_K⌉ steps a program, the last one fewer
        span = tl.cdiv(steps, SPLIT_K)
        end = tl.minimum((pid_k + 1) * span, steps)
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_w[None, :]
    w_mask = mask_n[:, None] & (offs_w[None, :] < WPS)
    if PDL:   # the weight words of this program's first step (4 bytes each) asked of L2 before x can be read
        _pdl_prologue(w_ptr + tl.where(mask_n, offs_n, 0) * stride_wn + pid_k * span * WPS, WPS * 4, 4)
    for step in tl.range(pid_k * span, end, num_stages=STAGES):
        w = tl.load(w_ptrs + step * WPS, mask=w_mask, other=0, eviction_policy="evict_first")   # [BN, WPS]
        x0, x1, x2, x3, x4, x5, x6, x7 = _load_x(x_ptr, step, offs_w, WPS)
        xw = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))                    # [WPS] Σ x per word
        xs = tl.sum(tl.reshape(xw, (GROUPS, WPG)), axis=1)                            # [G] ... per group
        if HALF2:   # x scaled by a power of two (exact) so that no fp16 sum can overflow; unscaled after
            big = tl.max(tl.maximum(tl.maximum(tl.maximum(tl.abs(x0), tl.abs(x1)), tl.maximum(tl.abs(x2), tl.abs(x3))),
                                    tl.maximum(tl.maximum(tl.abs(x4), tl.abs(x5)), tl.maximum(tl.abs(x6), tl.abs(x7)))))
            if ACC16:   # largest |x| brought into (ACC_LIMIT/2, ACC_LIMIT], up or down
                e = tl.minimum(tl.maximum(tl.floor(tl.log2(ACC_LIMIT / tl.maximum(big, 1e-30))), -126.0), 100.0)
                shrink = tl.where(big > 0, tl.exp2(e), 1.0)
                dot = _group_dot_acc16(w, x0 * shrink, x1 * shrink, x2 * shrink, x3 * shrink, x4 * shrink,
                                       x5 * shrink, x6 * shrink, x7 * shrink, BLOCK_N, GROUPS, WPG, MAGIC)
            else:
                shrink = tl.where(big > _X_LIMIT, tl.exp2(-tl.ceil(tl.log2(big / _X_LIMIT))), 1.0)
                part = _word_dot_half2(w, x0 * shrink, x1 * shrink, x2 * shrink, x3 * shrink, x4 * shrink,
                                       x5 * shrink, x6 * shrink, x7 * shrink, MAGIC)
                dot = tl.sum(tl.reshape(part, (BLOCK_N, GROUPS, WPG)), axis=2)        # [BN, G] Σ x·q per group
            dot = dot * (1.0 / shrink)
        else:
            part = _word_dot_f32(w, x0, x1, x2, x3, x4, x5, x6, x7, MAGIC)
            dot = tl.sum(tl.reshape(part, (BLOCK_N, GROUPS, WPG)), axis=2)            # [BN, G] Σ x·q per group
        g = step * GROUPS + offs_g
        sc = tl.load(s_ptr + offs_n[:, None] * stride_sn + g[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        z = tl.load(z_ptr + offs_n[:, None] * stride_sn + g[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        if HALF2:
            z = z - 8.0
        acc += tl.sum(sc * (dot - z * xs[None, :]), axis=1)
    if not SERIAL:
        tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=mask_n)
    else:   # each split writes its partial; the last to arrive adds them and writes y once, in its dtype
        _serial_reduce(acc, ws_ptr, offs_n, N, y_ptr, offs_n, mask_n, lock_ptr + pid_n, pid_k, SPLIT_K)


@_device
def _pack_pair(a, b):
    """Two fp32 tensors as one int32 of fp16 halves (``a`` low, ``b`` high), in plain Triton."""
    lo = a.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi = b.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return lo | (hi << 16)


@_device
def _f16(a):
    """fp32 values rounded to fp16 and back (what a plane holds)."""
    return a.to(tl.float16).to(tl.float32)


@_device
def _unpack_pair(p):
    """An int32 of two fp16 halves as two fp16 tensors (low, high), in plain Triton."""
    lo = (p & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    hi = ((p >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    return lo, hi


def _prepare_x_kernel(x_ptr, planes_ptr, xs_ptr, inv_ptr, K, K_OUT, plane_stride, GROUP: tl.constexpr,
                      LIMIT: tl.constexpr, CW: tl.constexpr, PDL: tl.constexpr, CENTRE: tl.constexpr):
    """``CW`` word columns (``8·CW`` activations) a program. Per group ``j``: ``shrink_j = 2^e`` putting the
    group's largest ``|x|`` in ``(LIMIT/2, LIMIT]`` (:func:`prepared_x_limit`: for the centred codes no fp16 sum
    of the group can overflow; for the subnormal ones ``x`` as high as fp16 allows), written as ``1/shrink_j``,
    and ``Σx`` over the group (fp32, unshrunk); per word column ``c`` the fp16 pairs ``(x₀, x₄)``,
    ``(x₁/16, x₅/16)``, ``(x₂, x₆)``, ``(x₃/16, x₇/16)`` of ``X = x[8c + j]·shrink`` (planes 0–3: the second
    operands of :func:`_word_pairs_half2` and :func:`_word_pairs_subnormal`); ``CENTRE`` (round 17, the subnormal
    loop's): a fifth plane, ``(−8·(X₀+X₁+X₂+X₃), −8·(X₄+X₅+X₆+X₇))·2⁻²⁴``, where its chains start. ``x`` has ``K``
    columns, the planes ``K_OUT ≥ K``: the columns past ``K`` are written as zeros (a weight padded at pack time).
    ``PDL`` (launched with programmatic dependent launch, round 16): the loop after it may launch at once — it
    waits for these writes itself — and this kernel waits for the previous one's ``x``."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    WPG: tl.constexpr = GROUP // 8
    G: tl.constexpr = CW // WPG
    K8 = K_OUT // 8
    c = tl.program_id(0) * CW + tl.arange(0, CW)
    m = c < K8
    mx = c < K // 8                     # x's own columns; zeros past them
    base = x_ptr + c * 8
    x0 = tl.load(base, mask=mx, other=0.0).to(tl.float32)
    x1 = tl.load(base + 1, mask=mx, other=0.0).to(tl.float32)
    x2 = tl.load(base + 2, mask=mx, other=0.0).to(tl.float32)
    x3 = tl.load(base + 3, mask=mx, other=0.0).to(tl.float32)
    x4 = tl.load(base + 4, mask=mx, other=0.0).to(tl.float32)
    x5 = tl.load(base + 5, mask=mx, other=0.0).to(tl.float32)
    x6 = tl.load(base + 6, mask=mx, other=0.0).to(tl.float32)
    x7 = tl.load(base + 7, mask=mx, other=0.0).to(tl.float32)
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
    if CENTRE:   # −8·2⁻²⁴ = −2⁻²¹ times each half's sum of the X the products read (the planes' fp16 values)
        lo = (_f16(x0 * shrink) + _f16(x1 * (shrink * 0.0625)) * 16.0) + (_f16(x2 * shrink) + _f16(x3 * (shrink * 0.0625)) * 16.0)
        hi = (_f16(x4 * shrink) + _f16(x5 * (shrink * 0.0625)) * 16.0) + (_f16(x6 * shrink) + _f16(x7 * (shrink * 0.0625)) * 16.0)
        tl.store(planes_ptr + 4 * plane_stride + c, _pack_pair(lo * -4.76837158203125e-07, hi * -4.76837158203125e-07),
                 mask=m)


def _gemv_prepared_kernel(planes_ptr, xs_ptr, inv_ptr, w_ptr, s_ptr, z_ptr, y_ptr, ws_ptr, lock_ptr, N, K, SPLIT_K,
                          plane_stride, stride_wn, stride_sn, GROUP: tl.constexpr, GROUPS: tl.constexpr,
                          BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, PLAIN: tl.constexpr, PDL: tl.constexpr,
                          SUBNORMAL: tl.constexpr):
    """The narrow GEMV's loop with the activation side prepared (:func:`prepare_x`): per step, the words
    [BN, WPS] and four planes of fp16 pairs [WPS] (five with ``SUBNORMAL``); per group ``acc += s·(Σ (q−8)·x·shrink / shrink − (z−8)·Σx)``.
    ``K`` split ``SPLIT_K`` ways (``⌈steps/SPLIT_K⌉`` steps a program, the last fewer), the partials summed by
    the last program to finish, as the GEMV's. ``PREFETCH``: the next step's words are loaded before this
    step's are summed (two steps of words in registers: loads in flight while the codes are summed). ``PDL``
    (round 16): launched while its preparation runs, the program asks L2 for its first step of the weight, then
    waits for the planes (:func:`_pdl_prologue`) — the launch and the first loads off the critical path.
    ``SUBNORMAL`` (round 17): the codes as fp16 subnormals (:func:`_word_pairs_subnormal`, four instructions a word
    fewer), their chains started from the fifth, centring plane; per group ``acc += s·(Σ (q−8)·X·2⁻²⁴ · 2²⁴/shrink −
    (z−8)·Σx)``, for planes prepared at :data:`SUBNORMAL_X_LIMIT`."""
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
    if PDL:   # the weight does not depend on the preparation: its first step asked of L2 before waiting for it
        _pdl_prologue(w_ptr + tl.where(mask_n, offs_n, 0) * stride_wn + tl.minimum(start, steps - 1) * WPS, WPS * 4, 4)
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
        if SUBNORMAL:
            pc = tl.load(planes_ptr + 4 * plane_stride + xo)
            if PLAIN:
                dot = _group_dot_subnormal_plain(w, p04, p15, p26, p37, pc, BLOCK_N, GROUPS, WPG)
            else:
                pairs = _word_pairs_subnormal(w, p04, p15, p26, p37, pc)
                dot = _pair_sum_f32(tl.reduce(tl.reshape(pairs, (BLOCK_N, GROUPS, WPG)), 2, _add_pairs))
        elif PLAIN:   # the interpreter runs no PTX: the planes back to x·shrink, summed as the GEMV's ACC16 sums them
            a0, b0 = _unpack_pair(p04)
            a1, b1 = _unpack_pair(p15)
            a2, b2 = _unpack_pair(p26)
            a3, b3 = _unpack_pair(p37)
            dot = _group_dot_acc16(w, a0, a1 * 16.0, a2, a3 * 16.0, b0, b1 * 16.0, b2, b3 * 16.0, BLOCK_N, GROUPS, WPG,
                                   False)
        else:
            pairs = _word_pairs_half2(w, p04, p15, p26, p37)
            dot = _pair_sum_f32(tl.reduce(tl.reshape(pairs, (BLOCK_N, GROUPS, WPG)), 2, _add_pairs))
        g = step * GROUPS + offs_g
        xs = tl.load(xs_ptr + g)
        inv = tl.load(inv_ptr + g)
        sc = tl.load(s_ptr + offs_n[:, None] * stride_sn + g[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        z = tl.load(z_ptr + offs_n[:, None] * stride_sn + g[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        if SUBNORMAL:   # the products were q·X·2⁻²⁴: the 2²⁴ back in fp32, before 1/shrink (no overflow)
            dot = dot * 16777216.0
        acc += tl.sum(sc * (dot * inv[None, :] - (z - 8.0) * xs[None, :]), axis=1)
    if SPLIT_K == 1:
        tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=mask_n)
    else:   # as the GEMV's
        _serial_reduce(acc, ws_ptr, offs_n, N, y_ptr, offs_n, mask_n, lock_ptr + pid_n, pid_k, SPLIT_K)


def _w4a16_tc_kernel(x_ptr, b_ptr, s_ptr, z_ptr, y_ptr, ws_ptr, lock_ptr, M, N, K, SPLIT_K,
                     stride_xm, stride_bn, stride_sn, stride_ym,
                     GROUP: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, DEQUANT: tl.constexpr, SWAP: tl.constexpr,
                     REDUCE: tl.constexpr, CODE_DT: tl.constexpr, OFFSET: tl.constexpr, PDL: tl.constexpr):
    """Up to 64 rows on tensor cores. Per group: the bytes [BN, g/2] become the even and the odd codes
    (two 16-bit tiles), multiplied by x's even and odd columns; then acc += s·(x·q − z·Σx). OFFSET
    names the magic number of the lop3 variant (1024: fp16 codes, 128: bf16 codes). ``PDL``: as the
    GEMV's (:func:`_pdl_prologue`)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    HALF: tl.constexpr = GROUP // 2
    offs_b = tl.arange(0, HALF)
    offs_g = tl.arange(0, GROUP)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # offsets built from the step index times constexprs (not a running k): the compiler then knows each
    # group's bytes and columns start on a multiple of the group, and copies them several bytes at a time,
    # asynchronously (scripts/kernel_sass.py --kernel tc: 8 bytes per weight copy, 16 per activation copy)
    STEP: tl.constexpr = GROUP * GROUPS
    span = K // STEP // SPLIT_K
    if PDL:   # the bytes of this program's first step asked of L2 before x can be read
        _pdl_prologue(b_ptr + tl.where(mask_n, offs_n, 0) * stride_bn + pid_k * span * (STEP // 2), STEP // 2, 1)
    for step in range(pid_k * span, (pid_k + 1) * span):
        for j in tl.static_range(GROUPS):
            kg = step * STEP + j * GROUP                                             # first column of the group
            b = tl.load(b_ptr + offs_n[:, None] * stride_bn + (step * (STEP // 2) + j * HALF + offs_b)[None, :],
                        mask=mask_n[:, None], other=0, eviction_policy="evict_first")  # [BN, g/2] bytes
            if DEQUANT == "lop3":      # two 16-bit codes per lop3 (magic + q), then the magic subtracted, exactly
                if OFFSET == 128.0:    # bf16: 0x4300 is 128; the high nibble is shifted down first
                    lo, hi = tl.inline_asm_elementwise(
                        "{ .reg .b32 t0, t1, u0, u1, zz, one, off; mov.b32 zz, 0;"
                        " mov.b32 one, 0x3F803F80; mov.b32 off, 0xC300C300;"
                        " prmt.b32 t0, $4, zz, 0x4140; prmt.b32 t1, $4, zz, 0x4342;"
                        " shr.b32 u0, t0, 4; shr.b32 u1, t1, 4;"
                        " lop3.b32 $0, t0, 0x000F000F, 0x43004300, 0xEA; lop3.b32 $1, t1, 0x000F000F, 0x43004300, 0xEA;"
                        " lop3.b32 $2, u0, 0x000F000F, 0x43004300, 0xEA; lop3.b32 $3, u1, 0x000F000F, 0x43004300, 0xEA;"
                        " fma.rn.bf16x2 $0, $0, one, off; fma.rn.bf16x2 $1, $1, one, off;"
                        " fma.rn.bf16x2 $2, $2, one, off; fma.rn.bf16x2 $3, $3, one, off; }",
                        "=r,=r,=r,=r,r", [b], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
                else:                  # fp16: 0x6400 is 1024
                    lo, hi = tl.inline_asm_elementwise(
                        "{ .reg .b32 t0, t1, u0, u1, zz, off; mov.b32 zz, 0; mov.b32 off, 0x64006400;"
                        " prmt.b32 t0, $4, zz, 0x4140; prmt.b32 t1, $4, zz, 0x4342;"
                        " shr.b32 u0, t0, 4; shr.b32 u1, t1, 4;"
                        " lop3.b32 $0, t0, 0x000F000F, 0x64006400, 0xEA; lop3.b32 $1, t1, 0x000F000F, 0x64006400, 0xEA;"
                        " lop3.b32 $2, u0, 0x000F000F, 0x64006400, 0xEA; lop3.b32 $3, u1, 0x000F000F, 0x64006400, 0xEA;"
                        " sub.f16x2 $0, $0, off; sub.f16x2 $1, $1, off; sub.f16x2 $2, $2, off; sub.f16x2 $3, $3, off; }",
                        "=r,=r,=r,=r,r", [b], dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
            else:
                lo = (b & 0xF).to(CODE_DT)
                hi = (b >> 4).to(CODE_DT)
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (kg + offs_g)[None, :], mask=mask_m[:, None],
                        other=0.0)                                                   # [BM, g]
            x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_M, HALF, 2)))
            x_even, x_odd = x_even.to(CODE_DT), x_odd.to(CODE_DT)   # no-op on a GPU (CODE_DT is x's dtype)
            xs = tl.sum(x.to(tl.float32), axis=1)
            sc = tl.load(s_ptr + offs_n * stride_sn + step * GROUPS + j, mask=mask_n, other=0.0).to(tl.float32)
            zo = tl.load(z_ptr + offs_n * stride_sn + step * GROUPS + j, mask=mask_n, other=0.0).to(tl.float32)
            if SWAP:                   # W·xᵀ: the weight tile is the MMA's first operand
                part = tl.dot(lo, tl.trans(x_even))
                part = tl.dot(hi, tl.trans(x_odd), part)
                acc += sc[:, None] * (part - zo[:, None] * xs[None, :])
            else:
                part = tl.dot(x_even, tl.trans(lo))
                part = tl.dot(x_odd, tl.trans(hi), part)
                acc += sc[None, :] * (part - zo[None, :] * xs[:, None])
    if SWAP:
        y_off = offs_m[None, :] * stride_ym + offs_n[:, None]
        w_off = offs_m[None, :] * N + offs_n[:, None]
        mask = mask_n[:, None] & mask_m[None, :]
    else:
        y_off = offs_m[:, None] * stride_ym + offs_n[None, :]
        w_off = offs_m[:, None] * N + offs_n[None, :]
        mask = mask_m[:, None] & mask_n[None, :]
    if REDUCE == "none":
        tl.store(y_ptr + y_off, acc.to(y_ptr.dtype.element_ty), mask=mask)
    elif REDUCE == "atomic":   # y is an fp32 buffer the host zeroed
        tl.atomic_add(y_ptr + y_off, acc, mask=mask)
    else:                      # serial: the last split to arrive adds the partials and writes y once
        _serial_reduce(acc, ws_ptr, w_off, M * N, y_ptr, y_off, mask, lock_ptr + pid_m * tl.num_programs(0) + pid_n,
                       pid_k, SPLIT_K)


_KERNELS: dict = {}   # a memo of the jitted kernel objects (Triton's own cache keeps their compiled binaries)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _kernel(name: str):
    """The Triton kernel ``name`` ("gemv", "tc", "prepare" or "prepared"): ``triton.jit`` of it, which is Triton's interpreter
    when ``TRITON_INTERPRET=1`` was set before triton was imported."""
    if triton is None:
        raise RuntimeError("the W4A16 kernels need Triton: pip install triton (Linux), or use reference_matmul")
    if name not in _KERNELS:
        _KERNELS[name] = triton.jit({"gemv": _w4a16_gemv_kernel, "tc": _w4a16_tc_kernel, "prepare": _prepare_x_kernel,
                                     "prepared": _gemv_prepared_kernel}[name])
    return _KERNELS[name]


GEMV_KEYS = {"KERNEL", "BLOCK_N", "GROUPS", "SPLIT_K", "MAGIC", "HALF2", "ACC16", "num_warps", "num_stages",
             "maxnreg", "PDL"}
TC_KEYS = {"KERNEL", "BLOCK_N", "GROUPS", "SPLIT_K", "DEQUANT", "SWAP", "REDUCE", "num_warps", "num_stages", "PDL"}
DEFAULT_CONFIG = dict(KERNEL="gemv", BLOCK_N=128, GROUPS=1, SPLIT_K=1, MAGIC=True, HALF2=False, ACC16=False,
                      num_warps=4, num_stages=1)
# the GEMV's shapes worth timing, (rows per program, warps, sums): the registers per thread set how many
# programs share a multiprocessor (scripts/kernel_sass.py, sm_90, 2 groups of 128 per step: 128 rows on 4
# warps 126 in fp32, 99 with fp16 pairs; 64 rows on 2 warps 94, 256 on 8 warps 106 with fp16 pairs);
# sums: "fp32" (one FFMA per code), "half2" (fp16 pairs per word, HALF2), "acc16" (fp16 pairs per group,
# HALF2 + ACC16: 21.1 instructions per word instead of 23.2 for 64 rows on 2 warps, 4 groups of 128)
# — and, since phase R of results/h100/kernels.json (run "2026-12-05 R2"), 16-64 rows on 2 or 4 warps with
# fp16-pair sums kept per group and 64-128 words of each row per step: the best of that run's sweep on 15
# of its 16 weight × group cases (notebook 08), and since phase N the rule (NARROW_GEMV)
GEMV_SHAPES = ((128, 4, "fp32"), (64, 4, "fp32"), (128, 4, "half2"), (64, 2, "half2"), (256, 8, "half2"),
               (128, 4, "acc16"), (64, 2, "acc16"), (64, 4, "acc16"), (32, 4, "acc16"), (32, 2, "acc16"),
               (16, 2, "acc16"))
GEMV_GROUPS = (1, 2, 4, 8, 16)   # groups per step a GEMV candidate takes ...
GEMV_MAX_WORDS = 128             # ... up to this many int32 words of each row per step (16 groups of 64)
SUMS = {"fp32": dict(HALF2=False, ACC16=False), "half2": dict(HALF2=True, ACC16=False),
        "acc16": dict(HALF2=True, ACC16=True)}
# the one-row rule at group ≥ 128: fp16 pairs (HALF2), 64 rows on 2 warps — faster than the fp32 rule on
# 7 of the 9 g128 weight shapes in the H200's first run of 2026-12-04 — with each group's sums kept in
# fp16 (ACC16): the fastest of every GEMV candidate on all 12 g128 shapes of run 2026-12-04b
# (results/h200/kernels.json); at g64 the fp32 rule stayed faster on most shapes
HALF2_GEMV = dict(HALF2=True, ACC16=True, BLOCK_N=64, num_warps=2, GROUPS=4)
GEMV_WARPS_PER_SM = 32   # split-K bound of the GEMV (gemv_split): resident warps per multiprocessor
# auto_config's one-row rule from phase N of results/h100/kernels.json until round 14, the GEMV rule since (run
# "2026-12-05 N", every split of three narrow tiles × two step lengths on 12 shapes, fitted there and checked on its 6 held-out shapes): 32 rows
# per program on 2 warps, fp16-pair sums kept per group, 512 codes (64 words) of each row per step, K split
# to about NARROW_WARPS_PER_SM warps per multiprocessor (narrow_split) — at either group size; since phase V
# (runs "2026-12-06 V" and "V2": every span of steps on 20 weights, then 9 fresh ones) K splits into one wave of
# programs that need not divide the steps (uneven_split), scaled to the codes per step
NARROW_GEMV = dict(HALF2=True, ACC16=True, BLOCK_N=32, num_warps=2)
NARROW_CODES = 512
NARROW_WARPS_PER_SM = 16
TC_DEFAULTS = dict(KERNEL="tc", BLOCK_N=64, GROUPS=1, SPLIT_K=1, DEQUANT="lop3", SWAP=True, REDUCE="serial",
                   num_warps=4, num_stages=3)   # the family benchmarks/kernels.py chose on the H200
# the tensor-core kernel's shape rule (auto_config, tc_split), from phase B of results/h100/kernels.json
# (2026-12-05, the mended loads; 12 shapes × g64/g128 × M = 2, 8, 16, every power-of-2 split): two groups
# per step at either group size (phase A2's choice), K split until the programs fill the multiprocessors
# and no program spans more than TC_MAX_GROUPS groups
TC_GROUPS = 2
TC_FEW_TILES = 1.5     # output tiles per multiprocessor below which K is split to fill them ...
TC_FILL = 2.5          # ... to at least this many programs per multiprocessor
TC_MAX_GROUPS = 40     # groups of K one program reads at most


def block_rows(m: int) -> int:
    """Rows per program of the tensor-core kernel: tiles of 16, 32 or 64 rows (``tl.dot`` needs ≥ 16)."""
    return 16 if m <= 16 else 32 if m <= 32 else 64


def _pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def _check_config(cfg: dict, p: W4Weight, m: int = 1) -> dict:
    """The config, completed and checked against this weight and row count (a bad one is refused
    before launch: a kernel that indexes past its tensors returns garbage or kills the process)."""
    kind = cfg.get("KERNEL", "tc" if m > 1 else "gemv")
    if kind not in ("gemv", "tc", "prepared"):
        raise ValueError(f"config KERNEL must be 'gemv', 'tc' or 'prepared', got {kind!r}")
    if kind == "prepared":
        return _check_prepared(cfg, p, m)
    cfg = {**(DEFAULT_CONFIG if kind == "gemv" else TC_DEFAULTS), **cfg, "KERNEL": kind}
    allowed = GEMV_KEYS if kind == "gemv" else TC_KEYS
    unknown = set(cfg) - allowed
    if unknown:
        raise ValueError(f"config has unknown keys {sorted(unknown)} for KERNEL={kind!r}; allowed: {sorted(allowed)}")
    n, k = p.shape
    if not _pow2(cfg["BLOCK_N"]) or cfg["BLOCK_N"] < 16:
        raise ValueError(f"config BLOCK_N must be a power of 2 ≥ 16, got {cfg['BLOCK_N']!r}")
    cfg["SPLIT_K"] = v.positive_int(cfg["SPLIT_K"], "config SPLIT_K", "programs along K")
    if "num_stages" in cfg:
        cfg["num_stages"] = v.positive_int(cfg["num_stages"], "config num_stages")
    if cfg.get("maxnreg") is not None:   # a register cap per thread (ptxas spills what does not fit)
        cfg["maxnreg"] = v.positive_int(cfg["maxnreg"], "config maxnreg", "registers per thread")
    if "PDL" in cfg:   # optional: programmatic dependent launch (sm_90+; a no-op in the interpreter)
        cfg["PDL"] = v.flag(cfg["PDL"], "config PDL")
    if "num_warps" in cfg and not _pow2(cfg["num_warps"]):
        raise ValueError(f"config num_warps must be a power of 2, got {cfg['num_warps']!r}")
    if kind == "gemv":
        if m != 1:
            raise ValueError(f"KERNEL='gemv' computes one row; x has {m} rows (use KERNEL='tc')")
        if not _pow2(p.group_size):
            raise ValueError(f"KERNEL='gemv' needs a power-of-2 group_size (one group per step), got {p.group_size}")
        cfg["MAGIC"] = v.flag(cfg["MAGIC"], "config MAGIC")
        cfg["HALF2"] = v.flag(cfg["HALF2"], "config HALF2")
        cfg["ACC16"] = v.flag(cfg["ACC16"], "config ACC16")
        if cfg["ACC16"] and not cfg["HALF2"]:
            raise ValueError("config ACC16 keeps the fp16 pair sums of HALF2 for a whole group: set HALF2=True too")
        if not _pow2(cfg["GROUPS"]):
            raise ValueError(f"config GROUPS must be a power of 2, got {cfg['GROUPS']!r}")
        step = p.group_size * cfg["GROUPS"]
    else:
        if p.group_size < 32 or not _pow2(p.group_size):
            raise ValueError(f"KERNEL='tc' needs a power-of-2 group_size ≥ 32 (16 codes per dot), got {p.group_size}")
        if not _pow2(cfg.get("GROUPS", 1)):
            raise ValueError(f"config GROUPS must be a power of 2, got {cfg.get('GROUPS')!r}")
        cfg.setdefault("GROUPS", 1)
        for key, allowed_v in (("DEQUANT", ("lop3", "shift")), ("REDUCE", ("atomic", "serial"))):
            v.one_of(cfg[key], f"config {key}", allowed_v)
        cfg["SWAP"] = v.flag(cfg["SWAP"], "config SWAP")
        step = p.group_size * cfg["GROUPS"]
    if kind == "gemv":   # the GEMV's programs may take unequal numbers of steps (uneven_split)
        if k % step:
            raise ValueError(f"in_features={k} must be a multiple of K per step = {p.group_size}·GROUPS = {step}")
        if cfg["SPLIT_K"] > k // step:
            raise ValueError(f"config SPLIT_K={cfg['SPLIT_K']} must be at most the {k // step} steps of each row "
                             f"(in_features={k} / {step} per step)")
    elif k % (step * cfg["SPLIT_K"]):
        raise ValueError(f"in_features={k} must be a multiple of (K per step)·SPLIT_K = {step}·{cfg['SPLIT_K']}")
    return cfg


def _check_prepared(cfg: dict, p: W4Weight, m: int) -> dict:
    """:func:`_check_config` for ``KERNEL="prepared"`` (:func:`prepared_config`'s keys)."""
    unknown = set(cfg) - PREPARED_KEYS
    if unknown:
        raise ValueError(f"config has unknown keys {sorted(unknown)} for KERNEL='prepared'; allowed: "
                         f"{sorted(PREPARED_KEYS)}")
    missing = {"BLOCK_N", "GROUPS", "SPLIT_K", "num_warps"} - set(cfg)
    if missing:
        raise ValueError(f"config KERNEL='prepared' needs {sorted(missing)} (prepared_config gives them)")
    v.flag(cfg.get("SUBNORMAL", False), "config SUBNORMAL")
    if m != 1:
        raise ValueError(f"KERNEL='prepared' computes one row; x has {m} rows (use KERNEL='tc')")
    if not _pow2(p.group_size) or p.group_size < 8:
        raise ValueError(f"KERNEL='prepared' needs a power-of-2 group_size ≥ 8, got {p.group_size}")
    cfg = dict(cfg, PREFETCH=v.flag(cfg.get("PREFETCH", False), "config PREFETCH"))
    if "PDL" in cfg:   # optional: both launches with programmatic dependent launch (round 16; sm_90+)
        cfg["PDL"] = v.flag(cfg["PDL"], "config PDL")
    for key in ("BLOCK_N", "GROUPS", "num_warps"):
        if not _pow2(cfg[key]):
            raise ValueError(f"config {key} must be a power of 2, got {cfg[key]!r}")
    cfg["SPLIT_K"] = v.positive_int(cfg["SPLIT_K"], "config SPLIT_K", "programs along K")
    step = p.group_size * cfg["GROUPS"]
    if p.shape[1] % step:
        raise ValueError(f"in_features={p.shape[1]} must be a multiple of K per step = {p.group_size}·GROUPS = {step}")
    if cfg["SPLIT_K"] > p.shape[1] // step:
        raise ValueError(f"config SPLIT_K={cfg['SPLIT_K']} must be at most the {p.shape[1] // step} steps of each row")
    return cfg


def gemv_split(tiles: int, steps: int, sms: int, warps: int = 4, per_sm: int = GEMV_WARPS_PER_SM) -> int:
    """Programs along K for the GEMV: the largest divisor ``d`` of the ``steps`` per row with
    ``tiles · d · warps ≤ per_sm · sms`` (default :data:`GEMV_WARPS_PER_SM`; 1 if none) — as many programs as keep every
    multiprocessor's warps streaming, no more: beyond that they only add partial sums to add up.
    Counted in warps, not programs (``results/h200/kernels.json``, run 2026-12-04b: the best split of the
    2-warp programs sat at 13.6–16.4 programs, 27–33 warps, per SM on the large g128 weights; the narrow
    tiles of :data:`NARROW_GEMV` want fewer, and the nearest divisor rather than the largest below:
    :func:`narrow_split`)."""
    bound = per_sm * sms / (max(tiles, 1) * warps)
    return max([d for d in _divisors(steps) if d <= bound] or [1])


def tc_split(n: int, k: int, group_size: int, m: int, sms: int, groups: int = TC_GROUPS,
             block_n: int = TC_DEFAULTS["BLOCK_N"]) -> int:
    """Programs along ``K`` for the tensor-core kernel on an ``[n, k]`` weight, ``m`` rows, ``sms``
    multiprocessors, ``groups`` groups of ``group_size`` per step: with ``tiles = ⌈n / block_n⌉ ·
    ⌈m / block_rows(m)⌉``, ``k_groups = k / group_size`` and ``steps = k_groups / groups``, the smallest
    power-of-2 divisor ``d`` of ``steps`` (leaving each program ≥ 2 steps) with

        tiles ≥ TC_FEW_TILES · sms  or  tiles · d ≥ TC_FILL · sms     (the programs fill the SMs)
        k_groups / d ≤ TC_MAX_GROUPS                                     (no program reads K too long)

    — the largest such divisor if none meets both. Fitted on phase B of ``results/h100/kernels.json``
    (how close it comes: the README, "Quantized inference for real"; phase T times it on held-out shapes)."""
    tiles = math.ceil(n / block_n) * math.ceil(m / block_rows(m))
    k_groups = k // group_size
    steps = max(k_groups // max(groups, 1), 1)
    cands = [d for d in _divisors(steps) if _pow2(d) and (d == 1 or steps // d >= 2)]
    for d in cands:
        if (tiles >= TC_FEW_TILES * sms or tiles * d >= TC_FILL * sms) and k_groups / d <= TC_MAX_GROUPS:
            return d
    return cands[-1]


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending: the splits of ``K`` that give every program whole steps."""
    return [d for d in range(1, n + 1) if n % d == 0]


def _fitting(row_groups: int, groups: int) -> int:
    """``groups`` groups per step, halved until they divide a row's ``row_groups``."""
    while groups > 1 and row_groups % groups:
        groups //= 2
    return groups


def _fitting_groups(p: W4Weight, groups: int) -> int:
    """``groups`` groups per step, halved until they divide each row's groups (``K / group_size``):
    SmolLM2's 576 columns are 9 groups of 64, one per step."""
    return _fitting(p.shape[1] // p.group_size, groups)


def _sms(p: W4Weight) -> int:
    """Multiprocessors of the weight's device (8 stands in for a CPU running the interpreter)."""
    return torch.cuda.get_device_properties(p.words.device).multi_processor_count if p.words.is_cuda else 8


def gemv_config(p: W4Weight, sms: int | None = None, **fixed) -> dict:
    """A GEMV config for weight ``p``: :data:`DEFAULT_CONFIG` with ``fixed`` keys set, the rest from the
    shape — ``GROUPS`` (256 codes of each row per step, halved until it divides the groups per row) and
    ``SPLIT_K`` (:func:`gemv_split` over ``sms`` multiprocessors, default the weight's device's)."""
    n, k = p.shape
    cfg = {**DEFAULT_CONFIG, "MAGIC": not _interpreted(), **fixed}
    if "GROUPS" not in fixed:
        cfg["GROUPS"] = _fitting_groups(p, max(1, 256 // p.group_size))
    if "SPLIT_K" not in fixed:
        cfg["SPLIT_K"] = gemv_split(math.ceil(n / cfg["BLOCK_N"]), k // (p.group_size * cfg["GROUPS"]),
                                    _sms(p) if sms is None else sms, cfg["num_warps"])
    return cfg


def narrow_gemv_config(p: W4Weight, sms: int | None = None, uneven: bool = True, **fixed) -> dict:
    """The one-row rule: :data:`NARROW_GEMV` (32 rows per program on 2 warps, fp16-pair sums kept per
    group) with :data:`NARROW_CODES` codes of each row per step (``GROUPS`` halved until it divides the
    groups per row) and ``K`` split by :func:`uneven_split`: one wave of :data:`NARROW_WARPS_PER_SM` warps
    per multiprocessor at 512 codes per step, programs that need not divide the steps (``uneven=False``:
    by :func:`narrow_split`, the nearest divisor — the rule until round 11); ``fixed`` keys (``ACC16``,
    ``PDL``) set on top."""
    n, k = p.shape
    cfg = {**NARROW_GEMV, **fixed}
    cfg["GROUPS"] = _fitting_groups(p, max(1, NARROW_CODES // p.group_size))
    tiles, steps = math.ceil(n / cfg["BLOCK_N"]), k // (p.group_size * cfg["GROUPS"])
    sms = _sms(p) if sms is None else sms
    if uneven:
        cfg["SPLIT_K"] = uneven_split(tiles, steps, sms, cfg["num_warps"], codes=p.group_size * cfg["GROUPS"])
    else:
        cfg["SPLIT_K"] = narrow_split(tiles, steps, sms, cfg["num_warps"])
    return gemv_config(p, sms=sms, **cfg)


def narrow_split(tiles: int, steps: int, sms: int, warps: int) -> int:
    """Programs along K for the narrow-tile GEMV: the divisor ``d`` of the ``steps`` per row nearest (in
    ratio, ``|log(d / target)|``; the smaller on a tie) to ``target = NARROW_WARPS_PER_SM · sms / (tiles ·
    warps)`` — nearest, not the largest below it: on 132 SMs a row of 43 steps (Llama-2-7B's down projection,
    86 groups of 128, 2 per step; target 8.25) splits 43 ways, not once, since a split of 1 leaves 128
    programs each walking all 43 steps one after another."""
    if steps < 1 or sms < 1 or warps < 1:
        raise ValueError(f"narrow_split needs steps, sms and warps ≥ 1, got steps={steps}, sms={sms}, warps={warps}")
    target = NARROW_WARPS_PER_SM * sms / (max(tiles, 1) * warps)
    return min(_divisors(steps), key=lambda d: abs(math.log(d / target)))


def uneven_split(tiles: int, steps: int, sms: int, warps: int, per_sm: int = NARROW_WARPS_PER_SM,
                 codes: int = NARROW_CODES) -> int:
    """Programs along K when they need not divide the ``steps`` of a row (each takes ``⌈steps / split⌉``,
    the last fewer): the most whose warps fit one wave of

        per_sm · (NARROW_CODES / codes) · sms      warps      (at least 1 program, at most ``steps``)

    — ``per_sm`` warps per SM at steps of :data:`NARROW_CODES` codes of each row, more where a step holds
    fewer ``codes`` (the same codes in flight per SM: 16 warps at 512, 32 at 256) — then the fewest
    programs that keep the same steps per program (``⌈steps / ⌈steps / split⌉⌉``, so none is left empty).
    Llama-2-7B's down projection on 132 SMs (43 steps of 256 codes): 16 programs' worth, 15 programs of
    3 steps, the last of 1 (a divisor gives 1 or 43). Fitted on phase V of ``results/h100/kernels.json``
    (run "2026-12-06 V": every span on the twelve weights and the eight held out; the ``codes`` scaling
    seen on Llama-2-7B's down projection alone; checked on run "2026-12-06 V2", nine weights chosen after
    the fit)."""
    if tiles < 1 or steps < 1 or sms < 1 or warps < 1 or per_sm < 1 or codes < 1:
        raise ValueError(f"uneven_split needs tiles, steps, sms, warps, per_sm and codes ≥ 1, got tiles={tiles}, "
                         f"steps={steps}, sms={sms}, warps={warps}, per_sm={per_sm}, codes={codes}")
    return same_span_split(steps, max(1, min(steps, per_sm * NARROW_CODES * sms // (codes * tiles * warps))))


def same_span_split(steps: int, split: int) -> int:
    """The fewest programs along ``K`` that keep ``split``'s span, ``⌈steps / split⌉`` steps each
    (``⌈steps / span⌉``): none is left without steps."""
    return math.ceil(steps / math.ceil(steps / split))


PLANE_ALIGN = 16     # int32 entries: each plane of the prepared activations starts 64-byte aligned
CHUNK_WORDS = 64     # word columns (512 activations) each preparing program handles


def plane_stride(k: int) -> int:
    """int32 entries from one plane of a prepared row of ``K = k`` to the next: its ``K/8`` word columns rounded up
    to :data:`PLANE_ALIGN` (each plane starts 64-byte aligned)."""
    return math.ceil(k // 8 / PLANE_ALIGN) * PLANE_ALIGN


def pow2_shrink(most: torch.Tensor, group: int, limit: float | None = None) -> torch.Tensor:
    """``2^⌊log2(LIMIT / most)⌋`` (exponent clamped to [−126, 100]; 1 where ``most`` is 0): the power of two
    that puts the largest ``|x|`` ``most`` of a span in ``(LIMIT/2, LIMIT]``, ``LIMIT`` = :func:`acc16_x_limit`
    — as :func:`_prepare_x_kernel` computes it per group (``limit``: another ``LIMIT``, :func:`prepared_x_limit`)."""
    limit = acc16_x_limit(group) if limit is None else limit
    e = torch.floor(torch.log2(limit / most.clamp_min(1e-30))).clamp(-126.0, 100.0)
    return torch.where(most > 0, torch.exp2(e), torch.ones_like(most))


def shrunk_planes(shrunk: torch.Tensor, centre: bool = False) -> torch.Tensor:
    """The four int32 planes of one row already multiplied by its shrinks (``shrunk``, fp32, ``K`` values), as
    :func:`_prepare_x_kernel` writes them: per word column ``c`` the fp16 pairs ``(x₀, x₄)``, ``(x₁/16, x₅/16)``,
    ``(x₂, x₆)``, ``(x₃/16, x₇/16)`` of ``shrunk[8c + i]`` (low half first), :func:`plane_stride` apart; ``centre``:
    and the fifth, ``(−8·(X₀+X₁+X₂+X₃), −8·(X₄+X₅+X₆+X₇))·2⁻²⁴`` of the planes' own fp16 values (round 17)."""
    k = shrunk.numel()
    if k % 8 or not shrunk.is_floating_point():
        raise ValueError(f"shrunk must be one row of floats whose K is a multiple of 8 (whole words), got "
                         f"{k} values of {shrunk.dtype}")
    cols = shrunk.reshape(k // 8, 8) * torch.tensor([1, 1 / 16, 1, 1 / 16] * 2, device=shrunk.device)
    if centre:   # in the kernel's order: (X₀ + X₁) + (X₂ + X₃), each X as its plane holds it
        held = cols.to(torch.float16).float() * torch.tensor([1, 16, 1, 16] * 2, device=shrunk.device)
        sums = [(h[:, 0] + h[:, 1]) + (h[:, 2] + h[:, 3]) for h in (held[:, :4], held[:, 4:])]
        cols = torch.cat([cols[:, :4], sums[0][:, None] * -2.0 ** -21, cols[:, 4:], sums[1][:, None] * -2.0 ** -21], 1)
    # the fp16 halves' bits put together in int32 arithmetic (same-width bitcasts: one fusable pointwise kernel)
    half = cols.shape[1] // 2
    lo, hi = (c.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF for c in (cols[:, :half], cols[:, half:]))
    return torch.nn.functional.pad((lo | (hi << 16)).T, (0, plane_stride(k) - k // 8)).reshape(-1)


class PreparedX:
    """The activation side of one row ``x[1, K]`` for one group size, as :func:`prepare_x` writes it: four planes
    of fp16 pairs (``plane_stride`` int32 apart), and per group ``Σx`` (``xs``) and ``1/shrink`` (``inv``);
    ``subnormal`` (round 17): for the loop with config ``SUBNORMAL`` — shrinks chosen at its ``limit``
    (:func:`prepared_x_limit`) and a fifth, centring plane."""

    def __init__(self, k: int, group: int, device, subnormal: bool = False):
        if k % 8 or k % group:
            raise ValueError(f"K = {k} must be a multiple of 8 and of the group size {group}")
        self.k, self.group = k, group
        self.subnormal = v.flag(subnormal, "subnormal")
        self.limit = prepared_x_limit(group, self.subnormal)
        self.plane_stride = plane_stride(k)
        self.planes = torch.empty((4 + self.subnormal) * self.plane_stride, dtype=torch.int32, device=device)
        self.xs = torch.empty(k // group, dtype=torch.float32, device=device)
        self.inv = torch.empty(k // group, dtype=torch.float32, device=device)

    @classmethod
    def of(cls, planes: torch.Tensor, xs: torch.Tensor, inv: torch.Tensor, group: int,
           subnormal: bool = False) -> PreparedX:
        """The activation side from tensors written elsewhere (:func:`prepare_x_torch` with the same
        ``subnormal``), checked for size — the subnormal loop's five planes, the centred loop's four."""
        k = xs.numel() * group
        prep = cls.__new__(cls)
        prep.k, prep.group = k, group
        prep.subnormal = v.flag(subnormal, "subnormal")
        prep.limit = prepared_x_limit(group, prep.subnormal)
        prep.plane_stride = plane_stride(k)
        n = (4 + prep.subnormal) * prep.plane_stride
        if planes.dtype != torch.int32 or planes.numel() != n or inv.numel() != xs.numel():
            raise ValueError(f"planes must be int32 [{n}] ({4 + prep.subnormal} planes: subnormal={prep.subnormal}) "
                             f"and inv [{xs.numel()}] for K = {k}, group {group}; got {planes.dtype} "
                             f"[{planes.numel()}], inv [{inv.numel()}]")
        if xs.dtype != torch.float32 or inv.dtype != torch.float32 or not (planes.device == xs.device == inv.device):
            raise ValueError(f"xs and inv must be float32 on the planes' device ({planes.device}); got {xs.dtype} on "
                             f"{xs.device}, {inv.dtype} on {inv.device}")
        prep.planes, prep.xs, prep.inv = planes, xs, inv
        return prep


def _one_row(x: torch.Tensor, group: int, k: int | None) -> tuple[int, int]:
    """``(K, k)``: the columns of one row ``x[1, K]`` and the planes' width ``k`` (default ``K``) of its
    preparation at ``group``, each argument checked by name."""
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"x must be one row [1, K], got shape {tuple(x.shape)}")
    if isinstance(group, bool) or not isinstance(group, int) or group < 8 or group % 8:
        raise ValueError(f"group must be a positive multiple of 8 (the words' 8 codes), got {group!r}")
    kx = x.shape[1]
    k = kx if k is None else k
    if isinstance(k, bool) or not isinstance(k, int):
        raise ValueError(f"k must be an int (the planes' width), got {k!r}")
    if kx % 8 or k < kx:
        raise ValueError(f"x has K = {kx} columns: a multiple of 8, at most k = {k} (the planes' width)")
    if k % group:
        raise ValueError(f"k = {k} (the planes' width) must be a multiple of the group {group}")
    return kx, k


def prepare_x(x: torch.Tensor, group: int, out: PreparedX | None = None, k: int | None = None,
              pdl: bool = False, subnormal: bool = False) -> PreparedX:
    """Run :func:`_prepare_x_kernel` on one row ``x[1, K]``, one program per :data:`CHUNK_WORDS` word columns
    (into ``out`` when given: no allocation). ``k``: the width of the planes, default ``K``; a wider ``k`` (a
    weight padded at pack time, :func:`padded_groups`) gets zeros past ``x``'s columns. ``pdl``: launched with
    programmatic dependent launch (a CUDA device of compute capability ≥ 9.0; ignored in the interpreter), so a
    loop launched the same way (config ``PDL``) starts while this runs. ``subnormal``: for the loop with config
    ``SUBNORMAL`` (round 17): prepared at :data:`SUBNORMAL_X_LIMIT` (:func:`prepared_x_limit`), with the fifth,
    centring plane."""
    kx, k = _one_row(x, group, k)
    pdl = _pdl_launch(v.flag(pdl, "pdl"), x.device, "pdl")
    subnormal = v.flag(subnormal, "subnormal")
    _runs_here(x.device, "x")
    out = out or PreparedX(k, group, x.device, subnormal)
    if (out.k, out.group, out.subnormal) != (k, group, subnormal):
        raise ValueError(f"out was made for K = {out.k}, group {out.group}, subnormal={out.subnormal}; asked for "
                         f"K = {k}, group {group}, subnormal={subnormal}")
    if out.planes.device != x.device:
        raise ValueError(f"out is on {out.planes.device} but x on {x.device}: make out on x's device")
    cw = max(CHUNK_WORDS, group // 8)
    _kernel("prepare")[(triton.cdiv(k // 8, cw),)](x.contiguous(), out.planes, out.xs, out.inv, kx, k,
                                                   out.plane_stride, GROUP=group, LIMIT=out.limit, CW=cw,
                                                   PDL=pdl, CENTRE=subnormal,
                                                   **({} if _interpreted() else {"num_warps": 2}),
                                                   **({"launch_pdl": True} if pdl else {}))
    return out


def prepare_x_torch(x: torch.Tensor, group: int, k: int | None = None,
                    subnormal: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`prepare_x`'s activation side in torch operations — ``(planes, xs, inv)``, the tensors of a
    :class:`PreparedX` (:meth:`PreparedX.of`) — the readable statement of :func:`_prepare_x_kernel`, and what
    ``torch.compile`` sees when the preparation is written in its ops (round 15, ``benchmarks/prep_fusion.py``).
    Per group ``j``: ``shrink_j = 2^⌊log2(LIMIT / max|x_j|)⌋`` (1 for a group of zeros; :func:`acc16_x_limit`),
    ``inv_j = 1/shrink_j``, ``xs_j = Σ x_j`` (fp32, summed in another order than the kernel's); per word column
    ``c`` the fp16 pairs ``(x₀, x₄)``, ``(x₁/16, x₅/16)``, ``(x₂, x₆)``, ``(x₃/16, x₇/16)`` of ``x[8c + i]·shrink``
    as int32 planes, zeros past ``x``'s columns up to ``k``. ``subnormal`` (round 17): ``LIMIT`` =
    :data:`SUBNORMAL_X_LIMIT` and the fifth, centring plane (:func:`shrunk_planes`)."""
    kx, k = _one_row(x, group, k)
    subnormal = v.flag(subnormal, "subnormal")
    xf = torch.nn.functional.pad(x.float(), (0, k - kx)).view(k // group, group)
    shrink = pow2_shrink(xf.abs().amax(1, keepdim=True), group, prepared_x_limit(group, subnormal))
    return shrunk_planes(xf * shrink, centre=subnormal), xf.sum(1), (1 / shrink).view(-1)


def gemv_prepared(prep: PreparedX, p: W4Weight, cfg: dict, locks: torch.Tensor | None = None,
                  out_dtype=torch.bfloat16) -> torch.Tensor:
    """``x @ dequantize(p).T`` for the row ``prep`` was made from (:func:`prepare_x`), by
    :func:`_gemv_prepared_kernel` with ``cfg``'s ``BLOCK_N``, ``GROUPS``, ``SPLIT_K``, ``num_warps``,
    ``PREFETCH`` and ``PDL`` (both default off; :func:`prepared_config` chooses the others; ``PDL``: launched with
    programmatic dependent launch, for a ``prep`` made with ``prepare_x(..., pdl=True)`` just before).
    :func:`w4a16_matmul` runs both for a ``KERNEL="prepared"`` config."""
    n, k = p.shape
    if (prep.k, prep.group) != (k, p.group_size):
        raise ValueError(f"prep is for K = {prep.k}, group {prep.group}; the weight has K = {k}, group {p.group_size}")
    if prep.planes.device != p.words.device:
        raise ValueError(f"prep is on {prep.planes.device} but the packed weight on {p.words.device}: move one "
                         "(p.to(device), or prepare_x of x on the weight's device)")
    _runs_here(p.words.device, "p")
    subnormal = v.flag(cfg.get("SUBNORMAL", False), "config SUBNORMAL")
    if prep.subnormal != subnormal:
        raise ValueError(f"prep was prepared with subnormal={prep.subnormal}, the loop with config "
                         f"SUBNORMAL={subnormal} reads planes prepared with subnormal={subnormal}: call "
                         f"prepare_x(..., subnormal={subnormal}) (or PreparedX.of(..., subnormal={subnormal}))")
    split = cfg["SPLIT_K"]
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), split)
    y = torch.empty(1, n, dtype=out_dtype, device=p.words.device)
    ws = torch.empty(split, n, dtype=torch.float32, device=y.device) if split > 1 else y
    locks = (_locks(locks, grid[0], y.device) if split > 1 else y)
    extra = {} if _interpreted() else {"num_warps": cfg["num_warps"]}
    pdl = _pdl_launch(v.flag(cfg.get("PDL", False), "config PDL"), y.device)
    if pdl:
        extra["launch_pdl"] = True
    _kernel("prepared")[grid](prep.planes, prep.xs, prep.inv, p.words, p.scale, p.zero, y, ws, locks, n, k, split,
                              prep.plane_stride, p.words.stride(0), p.scale.stride(0), GROUP=p.group_size,
                              GROUPS=cfg["GROUPS"], BLOCK_N=cfg["BLOCK_N"], PREFETCH=bool(cfg.get("PREFETCH")),
                              PLAIN=_interpreted(), PDL=pdl, SUBNORMAL=subnormal, **extra)
    return y


PREPARED_TILE = (8, 2048, 2)   # rows per program, codes of a row per step (at most), warps
PREPARED_FLIGHT = 16384        # codes of each row in flight per SM (warps × codes per step) below which K is split
PREPARED_KEYS = {"KERNEL", "BLOCK_N", "GROUPS", "SPLIT_K", "num_warps", "PREFETCH", "PDL", "SUBNORMAL"}


PREPARED_MAX_PAD = 0.05       # the most extra bytes padded_groups adds to a weight (round 13, run X4)


def padded_groups(k: int, group: int, codes: int = PREPARED_TILE[1], max_pad: float = PREPARED_MAX_PAD) -> tuple[int, int]:
    """``(groups per step, padded K)`` for the prepared tile when ``K`` is padded with zero columns instead of
    the step shrunk (:func:`_fitting_groups` halves ``GROUPS`` until it divides ``K / group``: Llama-2-7B's down
    projection, 86 groups of 128, gets 2 per step, Qwen2.5-72B's, 231, gets 1). Of the tile's ``codes // group``
    groups per step, halved, the most whose padding

        K' = ⌈K / (group · groups)⌉ · group · groups

    adds at most ``max_pad`` of the weight's bytes (``K' / K − 1``); ``K' = K`` where no step that wide fits.
    Zero activations in the padded columns (:func:`prepare_x` with ``k = K'``) make their codes contribute
    nothing. Measured in round 13 (README; ``results/h100/x_side.json`` run "2026-12-06 X4")."""
    for name, value in (("k", k), ("group", group), ("codes", codes)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if k % group or codes % group:
        raise ValueError(f"k ({k}) and codes ({codes}) must be multiples of group ({group})")
    if not 0 <= max_pad < 1:
        raise ValueError(f"max_pad must be a share in [0, 1), got {max_pad!r}")
    groups = max(1, codes // group)
    while True:
        kp = -(-k // (group * groups)) * group * groups
        if kp / k - 1 <= max_pad or groups == 1:
            return groups, kp
        groups //= 2


PAD_BELOW_CODES = 1024     # a layer pads K only where the step that divides K holds fewer codes than this


def pack_width(k: int, group: int) -> int:
    """The ``K`` a layer packs its weight to for the prepared path (``W4Linear``'s family ``PAD``):
    :func:`padded_groups`' ``K'`` where the widest prepared step that divides ``K`` holds fewer than
    :data:`PAD_BELOW_CODES` codes, else ``K``. Run X4 (round 13): padding paid 1.05–1.74× where that step held
    128–512 codes (Llama-2-7B's, Qwen2.5-72B's, Phi-3-medium's downs, the 14B-class projection) and
    0.97–1.01× on Qwen2.5-32B's down, whose step held 1024. ``K`` too where the prepared tile cannot step over
    it in whole groups (``K`` or the tile's codes not a multiple of ``group``): nothing to pad to."""
    if isinstance(k, int) and isinstance(group, int) and group > 0 and (k % group or PREPARED_TILE[1] % group):
        return k
    kp = padded_groups(k, group)[1]                                   # (its checks name a bad k or group)
    return kp if _fitting(k // group, max(1, PREPARED_TILE[1] // group)) * group < PAD_BELOW_CODES else k


def _padding_of(kx: int, k: int, group: int) -> bool:
    """Whether a weight of ``k`` columns is one of ``kx`` padded by :func:`pack_width`."""
    return kx < k and pack_width(kx, group) == k


def prepared_config(p: W4Weight, sms: int | None = None) -> dict:
    """The shape rule of the one-row GEMV with its activation side prepared (``KERNEL="prepared"``): the tile
    :data:`PREPARED_TILE` (``GROUPS`` halved until it divides the row), ``K`` split only where the programs of
    one split hold fewer than :data:`PREPARED_FLIGHT` codes in flight per SM —

        split = round(PREPARED_FLIGHT / (⌈N / rows⌉ · warps / sms · codes per step)),  at least 1

    (then the fewest programs with the same steps each). Fitted on run "2026-12-06 X2" of
    ``results/h100/x_side.json`` (the twelve weights of ``benchmarks.kernels.SHAPES``) and checked in run "X3" on
    the held-out and fresh ones (README, round 12); ``auto_config``'s one-row default since round 14
    (:func:`one_row_prepared`)."""
    n, k = p.shape
    rows, codes, warps = PREPARED_TILE
    groups = _fitting_groups(p, max(1, codes // p.group_size))
    steps = k // (p.group_size * groups)
    sms = _sms(p) if sms is None else sms
    flight = math.ceil(n / rows) * warps / sms * p.group_size * groups
    split = same_span_split(steps, max(1, min(steps, round(PREPARED_FLIGHT / flight))))
    return dict(KERNEL="prepared", BLOCK_N=rows, GROUPS=groups, SPLIT_K=split, num_warps=warps, PREFETCH=False)


# family keys that, without PREPARED, ask for the CUDA-core GEMV: its loop's own switches, and PDL (which since
# round 16 the prepared path also takes, when the family says PREPARED=True)
GEMV_SWITCHES = ("UNEVEN", "ACC16", "HALF2", "PDL")
GEMV_RULE = {"PREPARED": False}   # the family that asks auto_config for the GEMV's rule at one row (not to be changed)
PREPARED_ONLY = {"PAD": "pads the weight for", "SUBNORMAL": "is a switch of"}   # family keys of the prepared path alone


def one_row_prepared(family: dict | None) -> bool:
    """Whether one row runs the prepared path (:func:`prepared_config`, two launches) under the kernel
    ``family``: its ``PREPARED`` where given (else its ``KERNEL``), else yes — unless the family names the GEMV
    by one of :data:`GEMV_SWITCHES` (``PDL`` alone included, as before round 16). With ``PREPARED`` true,
    ``PDL`` is kept, for both launches of the prepared path (round 16) and the tensor-core kernel's rows; the
    GEMV's other switches, which the prepared loop does not have, are refused, and the prepared path's own
    (:data:`PREPARED_ONLY`: ``PAD``, ``SUBNORMAL``) where the family turns that path off. The default since round
    14 (README, "Quantized inference for real", its round-14 bullet: the measurements)."""
    family = family or {}
    if not isinstance(family, dict):
        raise TypeError(f"family must be a dict of kernel switches (or None), got {type(family).__name__}")
    if "PREPARED" in family:
        gemv_only = [key for key in GEMV_SWITCHES if key != "PDL" and key in family]
        if family["PREPARED"] and gemv_only:
            raise ValueError(f"family {family}: {gemv_only[0]} is a switch of the CUDA-core GEMV, which "
                             "PREPARED=True does not run — drop it, or set PREPARED to False")
        prepared = bool(family["PREPARED"])
    elif "KERNEL" in family:
        prepared = family["KERNEL"] == "prepared"
    else:
        prepared = not any(key in family for key in GEMV_SWITCHES)
    own = [key for key in PREPARED_ONLY if family.get(key)]
    if own and not prepared:
        raise ValueError(f"family {own[0]} {PREPARED_ONLY[own[0]]} the prepared path, which family {family} turns "
                         "off: leave out PREPARED=False, KERNEL='gemv' and the GEMV's switches (UNEVEN, ACC16, HALF2; "
                         "PDL alone — or keep PDL and add PREPARED=True)")
    return prepared


def auto_config(p: W4Weight, m: int, family: dict | None = None) -> dict:
    """A config chosen from the shape alone: one row runs the prepared path — the activation side prepared
    once per call, then the loop that reads it (:func:`prepared_config`; a power-of-two group of at least 8) —
    unless the ``family`` asks for the CUDA-core GEMV (:func:`one_row_prepared`: :data:`GEMV_RULE`, or one of
    the GEMV's switches), whose rule is :func:`narrow_gemv_config` (phases N and V of
    ``results/h100/kernels.json``; ``family`` may set ``UNEVEN=False`` — the nearest divisor,
    :func:`narrow_split` — ``ACC16=False`` — fp16-pair sums per word — or ``HALF2=False``: the fp32 GEMV of
    :func:`gemv_config`, 128 rows per program; ``PDL`` passes to every kernel — with ``PREPARED`` true, to both
    launches of the prepared path; ``SUBNORMAL`` to the prepared path only (round 17); ``PAD`` is the layer's,
    read at pack time); more rows run the tensor-core kernel with
    :data:`TC_GROUPS` groups per step (fewer where they do not divide ``K``), ``K`` split by
    :func:`tc_split`. ``family`` overrides :data:`TC_DEFAULTS` for the tensor-core kernel (its ``GROUPS`` is
    lowered until it divides ``K``)."""
    n, k = p.shape
    sms = _sms(p)
    prepared = one_row_prepared(family) and _pow2(p.group_size) and p.group_size >= 8
    if m == 1 and family and family.get("SUBNORMAL") and not prepared:   # (a family turning the path off: refused above)
        raise ValueError(f"family {family}: SUBNORMAL is a switch of the prepared path, which one row of this weight "
                         f"does not run: group_size {p.group_size} (it needs a power of 2 ≥ 8)")
    if m == 1 and prepared:
        cfg = prepared_config(p, sms=sms)
        return {**cfg, **{key: family[key] for key in ("PDL", "SUBNORMAL") if family and key in family}}
    if m == 1 and _pow2(p.group_size) and (family is None or family.get("KERNEL", "gemv") == "gemv"):
        family = family or {}
        pdl = {"PDL": family["PDL"]} if "PDL" in family else {}
        if family.get("HALF2", True) is False:
            return gemv_config(p, sms=sms, HALF2=False, **pdl)
        return narrow_gemv_config(p, sms=sms, uneven=bool(family.get("UNEVEN", True)),
                                  ACC16=bool(family.get("ACC16", True)), **pdl)
    family = {key: v for key, v in (family or {}).items()
              if key not in ("SPLIT_K", "KERNEL", "HALF2", "ACC16", "UNEVEN", "PREPARED", "PAD", "SUBNORMAL")}
    groups = _fitting_groups(p, family.pop("GROUPS", TC_GROUPS))
    cfg = dict(TC_DEFAULTS, **family, GROUPS=groups)
    if _interpreted():
        cfg["DEQUANT"] = "shift"
    cfg["SPLIT_K"] = tc_split(n, k, p.group_size, m, sms, groups, cfg["BLOCK_N"])
    return cfg


def _runs_here(device: torch.device, name: str) -> None:
    """Refuse a tensor the kernels cannot read: compiled Triton reads CUDA memory only, its interpreter (chosen
    before triton is imported) CPU memory; the error names the argument ``name`` and what to do."""
    if device.type != "cuda" and not _interpreted():
        raise RuntimeError(f"{name} is on {device}: compiled, the kernels read CUDA tensors only — move it to the "
                           "GPU; without CUDA they run only in Triton's interpreter, chosen before triton is "
                           "imported: restart, and call helpers.device.use_triton_interpreter_without_gpu() first "
                           "(or export TRITON_INTERPRET=1); or call reference_matmul")


def _pdl_launch(pdl: bool, device, name: str = "config PDL") -> bool:
    """Whether a kernel asked for programmatic dependent launch gets it: on a CUDA device, compiled (Triton's
    interpreter has none: the same kernel runs without), refused below compute capability 9.0 (Hopper's
    ``griddepcontrol``), the error naming the argument ``name`` that asked for it."""
    if not pdl or device.type != "cuda" or _interpreted():
        return False
    if torch.cuda.get_device_capability(device) < (9, 0):
        raise ValueError(f"{name} (programmatic dependent launch) needs compute capability ≥ 9.0; "
                         f"{torch.cuda.get_device_name(device)} has {torch.cuda.get_device_capability(device)}:"
                         f" leave {name.split()[-1]} out")
    return True


def _locks(locks: torch.Tensor | None, tiles: int, device) -> torch.Tensor:
    """The serial reduction's int32 counters, one per output tile: the caller's (checked), or new zeros."""
    if locks is None:
        return torch.zeros(tiles, dtype=torch.int32, device=device)
    if locks.dtype != torch.int32 or locks.numel() < tiles or locks.device != device:
        raise ValueError(f"locks must be int32 zeros with at least {tiles} entries on {device}")
    return locks


def w4a16_matmul(x: torch.Tensor, p: W4Weight, config: dict | None = None, out_dtype=None,
                 locks: torch.Tensor | None = None) -> torch.Tensor:
    """``x[M, K] @ dequantize(p).T`` by a Triton kernel (fp32 accumulation; output in ``out_dtype``,
    default ``x.dtype``).

    ``config`` picks the kernel and its blocks (module docstring; :data:`DEFAULT_CONFIG` for the
    one-row ``gemv``, :data:`TC_DEFAULTS` for ``tc``); None: :func:`auto_config`, chosen from the shape (one
    16-bit row: the prepared path; more rows: tensor cores) — one float32 row takes :data:`DEFAULT_CONFIG`.
    :func:`tuned_config` measures the best one per shape on a GPU. ``locks``: the
    int32 counters ``REDUCE="serial"`` needs (zeros; they are left at zero), allocated per call when
    not given. Without CUDA the kernels run in Triton's interpreter (exact, slow: small shapes only)."""
    if triton is None:
        raise RuntimeError("w4a16_matmul needs Triton: pip install triton (Linux), or use reference_matmul")
    if not isinstance(p, W4Weight):
        raise TypeError(f"p must be a W4Weight (from pack_w4), got {type(p).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] > p.shape[1]:
        raise ValueError(f"x must be a 2-D tensor [M, K={p.shape[1]}], got {getattr(x, 'shape', type(x).__name__)}")
    if not x.is_floating_point() or x.dtype == torch.float64:
        raise ValueError(f"x must be float16, bfloat16 or float32 activations, got {x.dtype}")
    if x.shape[0] < 1:
        raise ValueError("x has no rows")
    m, (n, k) = x.shape[0], p.shape
    if config is None:   # fp32 activations take the CUDA-core GEMV (tensor cores multiply 16-bit tiles)
        config = DEFAULT_CONFIG if x.dtype == torch.float32 and m == 1 else auto_config(p, m)
    cfg = _check_config(dict(config), p, m)
    if x.shape[1] < k and not (cfg["KERNEL"] == "prepared" and m == 1 and _padding_of(x.shape[1], k, p.group_size)):
        raise ValueError(f"x must be a 2-D tensor [M, K={k}], got {tuple(x.shape)}: only one row on KERNEL='prepared' "
                         f"reads x narrower than its weight, and only a weight padded at pack time from x's width "
                         f"(pack_width({x.shape[1]}, {p.group_size}) = K; the missing columns read as zeros) — "
                         "otherwise pass x with the weight's K columns")
    if cfg["KERNEL"] == "tc" and x.dtype == torch.float32:
        raise ValueError("KERNEL='tc' multiplies 16-bit activations on tensor cores: pass x in bfloat16 or float16 "
                         "(or one row of float32 with KERNEL='gemv')")
    if x.device != p.words.device:
        raise ValueError(f"x is on {x.device} but the packed weight on {p.words.device}: move one (p.to(device))")
    _runs_here(x.device, "x")
    out_dtype = out_dtype or x.dtype
    x = x.contiguous()
    extra = {key: cfg[key] for key in ("num_warps", "num_stages", "maxnreg")
             if cfg.get(key) is not None and x.device.type == "cuda"}
    pdl = _pdl_launch(bool(cfg.get("PDL")), x.device)
    if pdl:
        extra["launch_pdl"] = True
    if cfg["KERNEL"] == "prepared":   # two launches: the activation side once, then the loop that reads it
        return gemv_prepared(prepare_x(x, p.group_size, k=k, pdl=pdl, subnormal=bool(cfg.get("SUBNORMAL"))), p, cfg,
                             locks=locks, out_dtype=out_dtype)
    if cfg["KERNEL"] == "gemv":
        split = cfg["SPLIT_K"]
        grid = (triton.cdiv(n, cfg["BLOCK_N"]), split)
        y = torch.empty(m, n, dtype=out_dtype, device=x.device)
        ws = torch.empty(split, n, dtype=torch.float32, device=x.device) if split > 1 else y
        locks = _locks(locks, grid[0], x.device) if split > 1 else y
        _kernel("gemv")[grid](x, p.words, p.scale, p.zero, y, ws, locks, n, k, split, p.words.stride(0),
                              p.scale.stride(0), GROUP=p.group_size, GROUPS=cfg["GROUPS"], BLOCK_N=cfg["BLOCK_N"],
                              SERIAL=split > 1,
                              MAGIC=cfg["MAGIC"] and not _interpreted(), HALF2=cfg["HALF2"], ACC16=cfg["ACC16"],
                              ACC_LIMIT=acc16_x_limit(p.group_size), STAGES=cfg["num_stages"], PDL=pdl,
                              EVEN=(k // (p.group_size * cfg["GROUPS"])) % split == 0, **extra)
        return y
    bm, split = block_rows(m), cfg["SPLIT_K"]
    reduce = "none" if split == 1 else cfg["REDUCE"]
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), split, triton.cdiv(m, bm))
    ws = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if reduce == "serial" else x
    if reduce == "serial":
        locks = _locks(locks, grid[0] * grid[2], x.device)
    y = (torch.zeros(m, n, dtype=torch.float32, device=x.device) if reduce == "atomic"
         else torch.empty(m, n, dtype=out_dtype, device=x.device))
    bf16 = x.dtype == torch.bfloat16
    dequant = "shift" if _interpreted() else cfg["DEQUANT"]
    # Triton's interpreter multiplies bf16 tiles wrongly (NumPy has no bf16): there the bf16 case
    # multiplies fp32 tiles of the same (exactly representable) values
    code_dt = tl.float32 if bf16 and _interpreted() else tl.bfloat16 if bf16 else tl.float16
    _kernel("tc")[grid](x, p.words.view(torch.uint8), p.scale, p.zero, y, ws, locks if locks is not None else x,
                        m, n, k, split, x.stride(0), k // 2, p.scale.stride(0), y.stride(0),
                        GROUP=p.group_size, GROUPS=cfg["GROUPS"], BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N"],
                        DEQUANT=dequant, SWAP=bool(cfg["SWAP"]), REDUCE=reduce,
                        CODE_DT=code_dt,
                        OFFSET=(128.0 if bf16 else 1024.0) if dequant == "lop3" else 0.0, PDL=pdl, **extra)
    return y if reduce != "atomic" else y.to(out_dtype)


def candidate_configs(p: W4Weight, m: int, sms: int | None = None) -> list[dict]:
    """Configs worth timing for one weight and row count (all valid for its K and group): the
    tensor-core kernel's block widths, groups per step, splits and both orientations; for one row
    also the CUDA-core GEMV — :data:`GEMV_SHAPES` (rows per program, warps, fp32 or fp16-pair sums)
    with :data:`GEMV_GROUPS` groups per step (at most :data:`GEMV_MAX_WORDS` words of each row), each at
    the split :func:`gemv_split` picks for ``sms`` multiprocessors (default the weight's device's) and its
    two neighbouring divisors of the steps (the H200 sweep of every split: the best sat next to it)."""
    grid = [dict(KERNEL="tc", BLOCK_N=bn, GROUPS=gs, SPLIT_K=sk, SWAP=sw, REDUCE="atomic", DEQUANT="lop3",
                 num_warps=4, num_stages=3)
            for bn in (64, 128) for gs in (1, 2) for sk in (1, 2, 4, 8, 16) for sw in (False, True)]
    n, k = p.shape
    if m == 1:
        for (bn, nw, sums), gs in itertools.product(GEMV_SHAPES, GEMV_GROUPS):
            if k % (p.group_size * gs) or p.group_size // 8 * gs > GEMV_MAX_WORDS:
                continue
            steps = k // (p.group_size * gs)
            divisors = _divisors(steps)
            i = divisors.index(gemv_split(math.ceil(n / bn), steps, _sms(p) if sms is None else sms, nw))
            grid += [dict(KERNEL="gemv", BLOCK_N=bn, GROUPS=gs, SPLIT_K=sk, MAGIC=True, **SUMS[sums], num_warps=nw,
                          num_stages=1) for sk in divisors[max(0, i - 1):i + 2]]
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
