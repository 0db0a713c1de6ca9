"""Integer and FP8 quantization, written out: the conventions every later notebook builds on.

Integer (uniform affine) quantization, as in Jacob et al. 2018 and every PTQ paper since:

    x_q = clamp(round(x / scale) + zero, qmin, qmax)        x̂ = (x_q − zero) · scale

* symmetric: ``zero = 0``, codes in ``[−2^(b−1), 2^(b−1) − 1]``, ``scale = max|x| / (2^(b−1) − 1)``;
* asymmetric: codes in ``[0, 2^b − 1]``, ``scale = (max − min) / (2^b − 1)``,
  ``zero = round(−min / scale)`` (an integer, so 0.0 is exactly representable; like GPTQ, the range
  is widened to include 0); ``integer_zero=False`` keeps the exact minimum instead (GGUF Q4_1);
* granularity: one (scale, zero) per tensor, per output channel (row of ``W[out, in]``), or per
  group of ``group_size`` consecutive input channels of each row.

Every function returns codes, scales and zeros, not just the fake-quantized tensor, so the byte
count of a real format can be measured (:func:`pack_codes`, :func:`storage_bytes`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .models import decoder_layers
from .qspec import SUPPORTED_BITS, QuantSpec, allowed_group_sizes, as_int, check_bits, check_group_size

GRANULARITIES = ("tensor", "channel", "group")
__all__ = ["SUPPORTED_BITS", "QuantSpec", "allowed_group_sizes", "check_bits"]  # re-exported for notebooks


@dataclass
class QTensor:
    """Integer codes plus the parameters that turn them back into numbers."""
    codes: torch.Tensor      # int32 codes, same shape as the input
    scale: torch.Tensor      # [rows, n_groups] (broadcast over each group)
    zero: torch.Tensor       # same shape as scale; integer-valued
    bits: int
    symmetric: bool
    group_size: int          # columns per (scale, zero); = in_features for per-channel
    shape: tuple

    def dequantize(self) -> torch.Tensor:
        return dequantize(self)


def qrange(bits: int, symmetric: bool) -> tuple[int, int]:
    """(qmin, qmax) of a b-bit code: symmetric [−2^(b−1), 2^(b−1)−1], asymmetric [0, 2^b−1]."""
    bits = check_bits(bits)
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if symmetric else (0, 2 ** bits - 1)


def check_finite(x: torch.Tensor, name: str = "tensor") -> None:
    """Refuse NaN/inf input: one NaN would make its whole quantization group NaN without a word."""
    if x.is_floating_point() and not torch.isfinite(x).all():
        bad = (~torch.isfinite(x)).nonzero()
        raise ValueError(f"{name} has {len(bad)} non-finite value(s) (NaN or inf), the first at index "
                         f"{tuple(bad[0].tolist())}: quantizing it would turn whole groups into NaN. "
                         "Find where it came from (a diverged run, a bad checkpoint) before quantizing.")


def _groups(x: torch.Tensor, granularity: str, group_size: int | None) -> tuple[torch.Tensor, int]:
    """View ``x`` (2-D, [rows, cols]) as [rows, n_groups, g]; return it and g."""
    if x.dim() != 2:
        raise ValueError(f"expected a 2-D weight [out, in], got shape {tuple(x.shape)}")
    rows, cols = x.shape
    if granularity == "tensor":
        return x.reshape(1, 1, rows * cols), rows * cols
    if granularity == "channel":
        return x.reshape(rows, 1, cols), cols
    if granularity == "group":
        if group_size is None:
            raise ValueError("granularity='group' needs a positive group_size (None means per channel: "
                             "use granularity='channel')")
        group_size = check_group_size(group_size)
        if cols % group_size:
            raise ValueError(f"group_size={group_size} does not divide the {cols} input columns; "
                             f"allowed group sizes: {allowed_group_sizes(cols)}")
        return x.reshape(rows, cols // group_size, group_size), group_size
    raise ValueError(f"unknown granularity {granularity!r}; use one of {GRANULARITIES}")


def compute_qparams(xmin: torch.Tensor, xmax: torch.Tensor, bits: int, symmetric: bool,
                    integer_zero: bool = True):
    """(scale, zero) from per-group min/max, the formulas in the module docstring.

    ``integer_zero=False`` keeps ``zero = −min/scale`` unrounded: the grid then starts exactly at
    the group minimum, as in GGUF Q4_1 / HQQ (a float "min" per group instead of an integer zero).
    """
    qmin, qmax = qrange(bits, symmetric)
    if symmetric:
        amax = torch.maximum(xmin.abs(), xmax.abs())
        scale = amax / qmax
        zero = torch.zeros_like(scale)
    elif integer_zero:  # include 0 in the range (as GPTQ does) so the integer zero is a valid code
        xmin, xmax = torch.clamp(xmin, max=0), torch.clamp(xmax, min=0)
        scale = (xmax - xmin) / (qmax - qmin)
        zero = torch.clamp(torch.round(-xmin / torch.where(scale > 0, scale, torch.ones_like(scale))), qmin, qmax)
    else:               # the grid starts exactly at the group minimum (zero need not be a code)
        scale = (xmax - xmin) / (qmax - qmin)
        zero = -xmin / torch.where(scale > 0, scale, torch.ones_like(scale))
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # constant groups: any scale works
    return scale, zero


def quantize_tensor(x: torch.Tensor, bits: int = 4, symmetric: bool = False, granularity: str = "group",
                    group_size: int | None = 64, integer_zero: bool = True) -> QTensor:
    """Round-to-nearest quantization of a 2-D weight onto the integer grid; see the module docstring
    for the formulas. Returns codes, scales and zeros (:class:`QTensor`)."""
    bits = check_bits(bits)
    if not isinstance(x, torch.Tensor) or not torch.is_floating_point(x):
        raise TypeError(f"quantize_tensor expects a floating torch.Tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    check_finite(x, "the tensor to quantize")
    xg, g = _groups(x.float(), granularity, group_size)
    scale, zero = compute_qparams(xg.amin(-1), xg.amax(-1), bits, symmetric, integer_zero)
    codes = quantize_with(xg, scale[..., None], zero[..., None], bits, symmetric)
    return QTensor(codes.reshape(x.shape).to(torch.int32), scale, zero, bits, symmetric, g, tuple(x.shape))


def quantize_with(x, scale, zero, bits: int, symmetric: bool) -> torch.Tensor:
    """Codes for given (broadcastable) scale and zero: ``clamp(round(x/scale + zero))`` — the same as
    ``round(x/scale) + zero`` for an integer zero; a float zero (Q4_1-style) must go inside."""
    qmin, qmax = qrange(bits, symmetric)
    return torch.clamp(torch.round(x / scale + zero), qmin, qmax)


def dequantize(q: QTensor) -> torch.Tensor:
    """x̂ = (x_q − zero) · scale, in float32, shaped like the original tensor."""
    rows = q.scale.shape[0]
    codes = q.codes.float().reshape(rows, q.scale.shape[1], -1)
    return ((codes - q.zero[..., None]) * q.scale[..., None]).reshape(q.shape)


def fake_quantize(x: torch.Tensor, **kw) -> torch.Tensor:
    """quantize then dequantize, returned in ``x``'s dtype (what "RTN" applies to a weight)."""
    return dequantize(quantize_tensor(x, **kw)).to(x.dtype)


def rtn(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Round-to-nearest of a weight ``[out, in]`` on ``spec``'s grid, fake-quantized in ``w``'s dtype:
    the quantizer GPTQ and AWQ both end with."""
    return fake_quantize(w, bits=spec.bits, symmetric=spec.symmetric, granularity=spec.granularity,
                         group_size=spec.group_for(w.shape[1]))


def quant_error(x: torch.Tensor, **kw) -> dict:
    """MSE and max absolute error of RTN on ``x``."""
    err = (fake_quantize(x.float(), **kw) - x.float())
    return {"mse": err.pow(2).mean().item(), "max_abs": err.abs().max().item()}


# ----------------------------------------------------------------------------------- bits and bytes
def bits_per_weight(bits: int, group_size: int | None, param_bits: int = 16, symmetric: bool = False,
                    zero_bits: int | None = None) -> float:
    """Effective bits per weight of a grouped format: ``b + (scale_bits + zero_bits) / g``.

    Scales are ``param_bits`` wide (fp16 by default); an asymmetric format adds a zero point per
    group (``zero_bits``, default ``bits`` when packed like GPTQ's qzeros, fp16 for Q4_1-style mins).
    ``group_size=None`` means per-channel, where the overhead per weight is negligible (→ ``b``).
    """
    bits, group_size = check_bits(bits), check_group_size(group_size)
    if group_size is None:
        return float(bits)
    zb = 0 if symmetric else (bits if zero_bits is None else zero_bits)
    return bits + (param_bits + zb) / group_size


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned codes into bytes: 8/b codes per byte for b in (2, 4, 8); 3-bit as 8 codes → 3 bytes.

    Codes must already be unsigned (``[0, 2^b − 1]``: add ``2^(b−1)`` to symmetric codes first).
    Returns a flat uint8 tensor; :func:`unpack_codes` inverts it exactly.
    """
    bits = check_bits(bits)
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes must be a torch.Tensor of integer codes, got {type(codes).__name__}")
    if codes.is_floating_point():
        if not torch.isfinite(codes).all() or not torch.equal(codes, codes.round()):
            raise ValueError("codes must be integers; got non-integer floating values (pack_codes would "
                             "truncate them). Quantize first: quantize_tensor(x).codes")
    c = codes.flatten().to(torch.int64)
    if c.numel() and (c.min() < 0 or c.max() >= 2 ** bits):
        raise ValueError(f"codes must lie in [0, {2 ** bits - 1}] to pack at {bits} bits")
    per = 8 if bits == 3 else 8 // bits
    pad = (-c.numel()) % per
    c = torch.cat([c, c.new_zeros(pad)]).reshape(-1, per)
    shifts = torch.arange(per, dtype=torch.int64) * bits
    word = (c << shifts).sum(-1)                      # bits*per bits per row: 8 (b=2,4,8) or 24 (b=3)
    nbytes = bits * per // 8
    out = torch.stack([(word >> (8 * k)) & 0xFF for k in range(nbytes)], -1)
    return out.flatten().to(torch.uint8)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dimension, low nibble first: ``[…, K] → […, K/2]`` uint8,
    byte ``b`` = ``codes[…, 2b] | codes[…, 2b + 1] << 4`` — row by row what :func:`pack_codes` writes at 4 bits,
    computed on the codes' own device (a GPU packs a whole model in seconds). ``K`` must be even and
    the codes in ``[0, 15]``."""
    if not isinstance(codes, torch.Tensor) or codes.dim() < 1 or codes.shape[-1] % 2:
        raise ValueError(f"codes must be a tensor whose last dimension is even, got {getattr(codes, 'shape', type(codes).__name__)}")
    if codes.numel() and (codes.is_floating_point() or int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("codes must be integers in [0, 15] to pack two per byte (add 8 to symmetric 4-bit codes first)")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: ``[…, K/2]`` uint8 → ``[…, K]`` uint8 codes."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed must be the uint8 tensor pack_nibbles returns, got {getattr(packed, 'dtype', type(packed).__name__)}")
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def unpack_codes(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: the first ``numel`` codes as int64."""
    bits, numel = check_bits(bits), as_int(numel, "numel")
    per = 8 if bits == 3 else 8 // bits
    nbytes = bits * per // 8
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be the uint8 tensor pack_codes returns, got {packed.dtype}")
    if numel < 0 or packed.numel() % nbytes or numel > packed.numel() // nbytes * per:
        raise ValueError(f"numel={numel} does not fit {packed.numel()} packed bytes at {bits} bits "
                         f"(they hold at most {packed.numel() // nbytes * per} codes, in units of {nbytes} bytes)")
    b = packed.to(torch.int64).reshape(-1, nbytes)
    word = sum(b[:, k] << (8 * k) for k in range(nbytes))
    shifts = torch.arange(per, dtype=torch.int64) * bits
    codes = (word[:, None] >> shifts) & (2 ** bits - 1)
    return codes.flatten()[:numel]


def storage_bytes(q: QTensor, param_dtype=torch.float16) -> dict:
    """Real bytes of a quantized tensor stored packed: codes + scales (+ zeros, packed at b bits)."""
    for name, t in (("scale", q.scale), ("zero", q.zero)):
        check_finite(t, f"the QTensor's {name}")
    offset = 2 ** (q.bits - 1) if q.symmetric else 0
    code_bytes = pack_codes(q.codes + offset, q.bits).numel()
    pbytes = torch.empty(0, dtype=param_dtype).element_size()
    scale_bytes = q.scale.numel() * pbytes
    if q.symmetric:
        zero_bytes = 0
    elif torch.equal(q.zero, q.zero.round()):  # integer zero points pack at b bits (GPTQ's qzeros)
        zero_bytes = pack_codes(q.zero.to(torch.int64), q.bits).numel()
    else:                                       # float zero / min (Q4_1 style): one param each
        zero_bytes = q.zero.numel() * pbytes
    total = code_bytes + scale_bytes + zero_bytes
    return {"codes": code_bytes, "scales": scale_bytes, "zeros": zero_bytes, "total": total,
            "bits_per_weight": 8 * total / q.codes.numel()}


# ------------------------------------------------------------------------------------------ FP8
FP8_FORMATS = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
if hasattr(torch, "float8_e4m3fnuz"):
    FP8_FORMATS["e4m3fnuz"] = torch.float8_e4m3fnuz


def fp8_range(fmt: str = "e4m3fn") -> dict:
    """max, smallest normal and eps of an FP8 format, straight from ``torch.finfo``.

    OCP ``e4m3fn`` reaches ±448; the ``e4m3fnuz`` variant (AMD MI300, used by the ±240 figure in
    some docs) reaches ±240; ``e5m2`` trades precision for range (±57344).
    """
    dt = _fp8(fmt)
    fi = torch.finfo(dt)
    return {"format": fmt, "max": float(fi.max), "min_normal": float(fi.tiny), "eps": float(fi.eps)}


def _fp8(fmt: str) -> torch.dtype:
    if fmt not in FP8_FORMATS:
        raise ValueError(f"unknown FP8 format {fmt!r}; use one of {sorted(FP8_FORMATS)}")
    return FP8_FORMATS[fmt]


def to_fp8(x: torch.Tensor, fmt: str = "e4m3fn", dim: int | tuple | None = None):
    """Scaled cast: ``scale = amax / fp8_max`` (per tensor, or per slice along ``dim``), returns (q, scale).

    ``x ≈ q.float() * scale``. The scale maps the largest magnitude onto the format's max.
    """
    dt = _fp8(fmt)
    fmax = torch.finfo(dt).max
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = (amax.float() / fmax).clamp(min=1e-12)
    q = (x.float() / scale).clamp(-fmax, fmax).to(dt)
    return q, scale


def from_fp8(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Inverse of :func:`to_fp8`."""
    return (q.float() * scale).to(dtype)


# ----------------------------------------------------------------------------- whole-model RTN
def quantizable_linears(model) -> dict[str, torch.nn.Linear]:
    """``nn.Linear`` modules inside the decoder blocks (embeddings and lm_head are kept)."""
    layers = decoder_layers(model)
    out = {}
    for i, layer in enumerate(layers):
        for name, mod in layer.named_modules():
            if isinstance(mod, torch.nn.Linear):
                out[f"model.layers.{i}.{name}"] = mod
    return out


@torch.no_grad()
def rtn_model(model, spec: QuantSpec | None = None, **spec_kw) -> dict:
    """Round-to-nearest every decoder linear in place; returns {name: (shape, mse)} of what changed.
    ``spec`` (or ``bits=``, ``group_size=``, ``symmetric=``) is the grid, see :class:`QuantSpec`."""
    spec = QuantSpec.of(spec, **spec_kw)
    changed = {}
    for name, lin in quantizable_linears(model).items():
        w = lin.weight.data
        check_finite(w, f"{name}.weight")
        wq = rtn(w.float(), spec)
        changed[name] = (tuple(w.shape), (wq - w.float()).pow(2).mean().item())
        lin.weight.data.copy_(wq.to(w.dtype))
    return changed


# ------------------------------------------------------------------- activations and SmoothQuant
def quantize_activations_int8(x: torch.Tensor, per_token: bool = True) -> torch.Tensor:
    """Dynamic symmetric INT8 fake-quantization of activations [tokens, channels]: one scale per
    token (row) or one for the whole tensor, ``scale = max|x| / 127``."""
    amax = x.abs().amax(-1, keepdim=True) if per_token else x.abs().max()
    scale = torch.clamp(amax, min=1e-8) / 127
    return torch.clamp(torch.round(x / scale), -127, 127) * scale


def smoothquant_scales(act_absmax: torch.Tensor, w_absmax: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """SmoothQuant (Xiao et al. 2023, eq. 4): ``s_j = max|X_j|^α / max|W_j|^(1−α)`` per input channel.
    ``Y = (X·diag(s)⁻¹)·(diag(s)·W)`` is unchanged; α moves the quantization difficulty from the
    activations (α → 1) to the weights."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return (act_absmax.clamp(min=1e-5).pow(alpha) / w_absmax.clamp(min=1e-5).pow(1 - alpha)).clamp(min=1e-5)


def w8a8_error(x: torch.Tensor, W: torch.Tensor, s: torch.Tensor | None = None, per_token: bool = False) -> float:
    """Relative output error ``‖Ŷ − Y‖ / ‖Y‖`` of a W8A8 linear (weights INT8 per output channel,
    activations dynamic INT8 per tensor or per token), optionally smoothed by ``s``."""
    x, W = x.float(), W.float()
    ref = x @ W.t()
    if s is not None:
        x, W = x / s, W * s
    y = quantize_activations_int8(x, per_token) @ fake_quantize(W, bits=8, symmetric=True, granularity="channel").t()
    return ((y - ref).norm() / ref.norm()).item()


def quantized_model_bytes(model, bits: int | None, group_size: int | None = 64, param_bytes: int = 2) -> dict:
    """Real bytes of a model stored with its decoder linears quantized (packed codes + fp16 scales +
    packed integer zeros, as GPTQ/AWQ checkpoints store them) and everything else in 16-bit.
    ``bits=None`` gives the all-16-bit size. Computed from shapes (no tensors are quantized)."""
    lins = quantizable_linears(model)
    lin_ids = {id(m.weight) for m in lins.values()}
    rest = sum(p.numel() for p in model.parameters() if id(p) not in lin_ids) * param_bytes
    if bits is None:
        return {"linears": sum(m.weight.numel() for m in lins.values()) * param_bytes, "rest": rest,
                "total": rest + sum(m.weight.numel() for m in lins.values()) * param_bytes}
    spec = QuantSpec(bits, group_size)
    lin_bytes = 0
    for m in lins.values():
        rows, cols = m.weight.shape
        g = spec.group_for(cols)
        n_groups = rows * cols // g
        lin_bytes += -(-rows * cols * bits // 8) + n_groups * param_bytes + -(-n_groups * bits // 8)
    return {"linears": lin_bytes, "rest": rest, "total": lin_bytes + rest}
