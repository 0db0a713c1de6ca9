"""The course's packed int4 weight: what the W4A16 kernels read.

The weight ``W[N, K]`` (``N`` outputs, ``K`` inputs) is quantized 4-bit asymmetric per group of
``g`` inputs (notebook 03): codes ``q ∈ [0, 15]``, an fp16 scale ``s`` and zero ``z`` per group, so
``W[n, k] ≈ (q[n, k] − z[n, j]) · s[n, j]`` for ``k`` in group ``j``.
The codes are packed by :func:`helpers.quant.pack_nibbles` (two per byte, low nibble first) row by row:
byte ``b`` of row ``n`` holds ``q[n, 2b]`` (low nibble) and ``q[n, 2b + 1]`` (high nibble); read as
int32 words, nibble ``j`` of word ``w`` is ``q[n, 8w + j]``.

:func:`reference_matmul` is the readable matmul (dequantize, then ``x @ W.T``) every kernel in
:mod:`helpers.w4_kernel` is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .qspec import QuantSpec
from .quant import check_finite, pack_nibbles, quantize_tensor, unpack_nibbles


@dataclass
class W4Weight:
    """A packed 4-bit weight: int32 words ``[N, K/8]``, fp16 scales and zeros ``[N, K/g]``, all on one
    device. Checked when built: a weight whose words or groups cover fewer rows or columns than its
    shape would make a kernel read past its tensors."""
    words: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    group_size: int
    shape: tuple[int, int]   # (N, K)

    def __post_init__(self):
        for name in ("words", "scale", "zero"):
            if not isinstance(getattr(self, name), torch.Tensor):
                raise TypeError(f"W4Weight.{name} must be a tensor, got {type(getattr(self, name)).__name__}")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 8 \
                or self.group_size % 8:
            raise ValueError(f"W4Weight.group_size must be a positive multiple of 8, got {self.group_size!r}")
        try:
            n, k = (int(v) for v in self.shape)
        except (TypeError, ValueError):
            raise ValueError(f"W4Weight.shape must be (out_features, in_features), got {self.shape!r}") from None
        if n < 1 or k < 1 or k % 8 or k % self.group_size:
            raise ValueError(f"W4Weight.shape {self.shape}: in_features must be a positive multiple of 8 and of "
                             f"group_size={self.group_size}")
        self.shape = (n, k)
        want = {"words": ((n, k // 8), torch.int32), "scale": ((n, k // self.group_size), torch.float16),
                "zero": ((n, k // self.group_size), torch.float16)}
        for name, (shp, dt) in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shp or t.dtype != dt:
                raise ValueError(f"W4Weight.{name} must be {dt} of shape {shp} for a {n}×{k} weight in groups of "
                                 f"{self.group_size}, got {t.dtype} {tuple(t.shape)} (pack with pack_w4)")
            if not t.is_contiguous():
                raise ValueError(f"W4Weight.{name} must be contiguous (call .contiguous())")
        if not (self.words.device == self.scale.device == self.zero.device):
            raise ValueError(f"W4Weight tensors are on different devices: words {self.words.device}, scale "
                             f"{self.scale.device}, zero {self.zero.device} (move them together with .to(device))")

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.words, self.scale, self.zero))

    @classmethod
    def stand_in(cls, n: int, k: int, group_size: int, device="meta") -> W4Weight:
        """An ``[n, k]`` weight in groups of ``group_size`` with no values (on the meta device by default):
        what the shape rules (``w4_kernel.auto_config``, ``candidate_configs``) read, for any model's shapes
        without its memory."""
        return cls(torch.zeros(n, k // 8, dtype=torch.int32, device=device),
                   torch.zeros(n, k // group_size, dtype=torch.float16, device=device),
                   torch.zeros(n, k // group_size, dtype=torch.float16, device=device), group_size, (n, k))

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
    spec = QuantSpec(bits=4, group_size=group_size, symmetric=False)
    if k % 8 or k % spec.group_size:
        raise ValueError(f"in_features={k} must be a multiple of 8 and of group_size={group_size} "
                         "(pick a group size that divides it: helpers.qspec.allowed_group_sizes)")
    q = quantize_tensor(w.float(), bits=4, symmetric=False, granularity="group", group_size=spec.group_size)
    words = pack_nibbles(q.codes).view(torch.int32)   # little-endian bytes: nibble j of word i = code 8i+j
    return W4Weight(words.contiguous(), q.scale.to(torch.float16).contiguous(),
                    q.zero.to(torch.float16).contiguous(), spec.group_size, (n, k))


def unpack_w4(p: W4Weight) -> torch.Tensor:
    """The integer codes ``[N, K]`` back from the words (the kernel's unpacking, in PyTorch)."""
    return unpack_nibbles(p.words.view(torch.uint8)).reshape(p.shape).to(torch.int32)


def dequantize_w4(p: W4Weight, dtype=torch.float16) -> torch.Tensor:
    """``(q − z) · s`` per group, as a dense ``[N, K]`` matrix."""
    n, k = p.shape
    q = unpack_w4(p).reshape(n, k // p.group_size, p.group_size).float()
    return ((q - p.zero.float()[..., None]) * p.scale.float()[..., None]).reshape(n, k).to(dtype)


def reference_matmul(x: torch.Tensor, p: W4Weight) -> torch.Tensor:
    """The readable version: dequantize the whole weight, then ``x @ W.T`` in fp32."""
    return (x.float() @ dequantize_w4(p, torch.float32).T).to(x.dtype)


def max_rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |got − ref| / max |ref|``: a kernel's largest error against :func:`reference_matmul`'s product,
    relative to the product's largest value — the ``rel_err`` every kernel benchmark row reports."""
    if got.shape != ref.shape:
        raise ValueError(f"got {tuple(got.shape)} and ref {tuple(ref.shape)} must have one shape")
    top = ref.float().abs().max()
    if not top > 0:
        raise ValueError("ref is all zeros (or not finite): a relative error against it means nothing")
    return ((got.float() - ref.float()).abs().max() / top).item()
