"""Quantized KV caches on top of transformers' cache API, and their exact byte counts.

* :class:`FP8Layer` — keys and values stored as FP8 (``float8_e4m3fn`` or ``float8_e5m2``) with one
  fp32 scale per KV head, fixed at the prefill from the prompt's ``amax × margin`` (a *static*
  scale, as vLLM's ``k_scale``/``v_scale``; later values beyond the range saturate). transformers
  ships no FP8 KV cache; this is a ``DynamicLayer`` subclass, so ``generate`` uses it unchanged.
* :class:`Int4Layer` — transformers' own ``QuantizedLayer`` (the KIVI-style cache behind
  ``QuantizedCache``: a full-precision residual of recent tokens, the rest quantized) with our own
  4-bit backend: per-token groups along ``head_dim``, asymmetric, two codes per byte, fp16 scale and
  fp16 minimum per group (the quanto/HQQ backends need compiled extensions; see notebook 07).

Both return *dequantized* K/V to attention, one layer at a time: storage shrinks, but each layer's
attention still sees a full-precision copy transiently — the peak saves less than the storage.
"""
from __future__ import annotations

import importlib.util

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, QuantizedCache, QuantizedLayer, StaticCache

from .budget_kv import KVLayout
from .quant import FP8_FORMATS, pack_nibbles, unpack_nibbles
from .validate import flag, model_config, non_negative_int, one_of, positive_int, positive_number, tensor

KV_KINDS = ("baseline", "fp8-e4m3", "fp8-e5m2", "int4", "int4-hqq")
# every name make_cache takes, and the keywords each one passes on to its layers
CACHE_KEYWORDS = {"baseline": (), "static": (), "fp8-e4m3": ("margin",), "fp8-e5m2": ("margin",),
                  "fp8-e4m3-unit": (), "fp8-e5m2-unit": (), "int4": ("q_group_size", "residual_length"),
                  "int4-hqq": ("q_group_size", "residual_length")}
HQQ_INSTALL = "pip install hqq==0.2.8.post1"
INT4_LAYOUT = KVLayout()   # the int4 caches' defaults: group size, residual length (helpers.budget_kv.KVLayout)


def available_kinds() -> tuple[str, ...]:
    """:data:`KV_KINDS` whose backend is installed here (``int4-hqq`` needs ``pip install hqq``)."""
    return tuple(k for k in KV_KINDS if k != "int4-hqq" or importlib.util.find_spec("hqq") is not None)


class FP8Layer(DynamicLayer):
    """One layer's K/V in FP8 with a static per-KV-head scale (see module docstring)."""

    def __init__(self, fmt: str = "e4m3fn", margin: float = 2.0, unit_scale: bool = False):
        super().__init__()
        self.fp8 = FP8_FORMATS[one_of(fmt, "fmt", FP8_FORMATS, what="FP8 format")]
        self.fmax = torch.finfo(self.fp8).max
        self.margin = positive_number(margin, "margin", "the scale is amax × margin / fp8 max; 2.0 leaves room "
                                      "for later, larger tokens")
        # scale 1.0: what vLLM/SGLang use when a checkpoint has no k/v scales
        self.unit_scale = flag(unit_scale, "unit_scale")
        self.length = 0

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        # scale per (kv head): amax over batch, positions and head_dim, times a margin for later tokens
        self.k_scale = self._scale(key_states)
        self.v_scale = self._scale(value_states)
        empty = (*key_states.shape[:2], 0, key_states.shape[-1])
        self.k_codes = torch.empty(empty, dtype=torch.uint8, device=self.device)
        self.v_codes = torch.empty(empty, dtype=torch.uint8, device=self.device)
        self.keys = self.values = None  # nothing is kept in full precision
        self.is_initialized = True

    def _scale(self, x):
        if self.unit_scale:
            return torch.ones((1, x.shape[1], 1, 1), device=x.device)
        amax = x.detach().abs().amax(dim=(0, 2, 3), keepdim=True).float()
        return (amax * self.margin / self.fmax).clamp(min=1e-8)

    def _encode(self, x, scale):
        return (x.float() / scale).clamp(-self.fmax, self.fmax).to(self.fp8).view(torch.uint8)

    def _decode(self, codes, scale):
        return (codes.view(self.fp8).float() * scale).to(self.dtype)

    def update(self, key_states, value_states, *args, **kwargs):
        _check_states(key_states, value_states, self.k_codes if self.is_initialized else None)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.k_codes = torch.cat([self.k_codes, self._encode(key_states, self.k_scale)], dim=-2)
        self.v_codes = torch.cat([self.v_codes, self._encode(value_states, self.v_scale)], dim=-2)
        self.length += key_states.shape[-2]
        return self._decode(self.k_codes, self.k_scale), self._decode(self.v_codes, self.v_scale)

    def get_seq_length(self) -> int:
        return self.length

    def stored_tensors(self):
        return [self.k_codes, self.v_codes, self.k_scale, self.v_scale] if self.is_initialized else []


def _check_states(key_states, value_states, codes=None) -> None:
    """New keys and values [batch, kv_heads, tokens, head_dim], floating, of one shape (and of the
    batch, heads and head_dim already stored)."""
    k = tensor(key_states, "key_states", 4, "float", "[batch, kv_heads, tokens, head_dim]")
    v = tensor(value_states, "value_states", 4, "float", "[batch, kv_heads, tokens, head_dim]")
    if k.shape != v.shape:
        raise ValueError(f"key_states {tuple(k.shape)} and value_states {tuple(v.shape)} must have one shape")
    if codes is not None and (k.shape[:2], k.shape[-1]) != (codes.shape[:2], codes.shape[-1]):
        raise ValueError(f"key_states {tuple(k.shape)} does not continue the cache's [batch, kv_heads, ·, head_dim] = "
                         f"{tuple(codes.shape)}: use a fresh cache for another batch or model")


def int4_group(head_dim: int, q_group_size: int) -> int:
    """Columns per (scale, min) of :class:`Int4Layer` along ``head_dim``: ``q_group_size``, or the whole
    row when the group is at least as wide as the head; a smaller group must divide ``head_dim``."""
    if q_group_size >= head_dim:
        return head_dim
    if head_dim % q_group_size:
        raise ValueError(f"q_group_size={q_group_size} does not divide head_dim={head_dim}; use a divisor of "
                         f"{head_dim} (or ≥ {head_dim}: one group per head row)")
    return q_group_size


class Int4Layer(QuantizedLayer):
    """transformers' QuantizedLayer with our own 4-bit backend (see module docstring): groups of
    ``q_group_size`` along ``head_dim`` (:func:`int4_group`); the tokens decoded since the cache was
    last re-quantized stay in full precision
    (:meth:`helpers.budget_kv.KVLayout.residual_tokens` says how many)."""

    def __init__(self, q_group_size: int = INT4_LAYOUT.group_size, residual_length: int = INT4_LAYOUT.residual_length):
        super().__init__(nbits=4, axis_key=-1, axis_value=-1,
                         q_group_size=positive_int(q_group_size, "q_group_size", "columns of head_dim per scale"),
                         residual_length=non_negative_int(residual_length, "residual_length",
                                                          "recent tokens kept in full precision"))

    def update(self, key_states, value_states, *args, **kwargs):
        _check_states(key_states, value_states)
        return super().update(key_states, value_states, *args, **kwargs)

    def _quantize(self, tensor, axis):
        shape = tensor.shape
        g = int4_group(shape[-1], self.q_group_size)
        x = tensor.float().reshape(*shape[:-1], shape[-1] // g, g)
        xmin, xmax = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        scale = ((xmax - xmin) / 15).clamp(min=1e-8)
        codes = torch.clamp(torch.round((x - xmin) / scale), 0, 15).to(torch.uint8).reshape(*shape[:-1], -1)
        packed = pack_nibbles(codes)                                  # two codes per byte
        return {"packed": packed, "scale": scale.half(), "min": xmin.half(), "shape": shape,
                "dtype": tensor.dtype, "g": g}

    def _dequantize(self, q):
        p = q["packed"]
        codes = unpack_nibbles(p)
        x = codes.reshape(*q["shape"][:-1], q["shape"][-1] // q["g"], q["g"]).float()
        return (x * q["scale"].float() + q["min"].float()).reshape(q["shape"]).to(q["dtype"])

    def stored_tensors(self):
        if not self.is_initialized:
            return []
        out = [self.keys, self.values]
        for q in (self._quantized_keys, self._quantized_values):
            out += [q["packed"], q["scale"], q["min"]]
        return out


def make_cache(kind: str, config, max_cache_len: int | None = None, **kw) -> Cache:
    """A fresh cache of one of :data:`KV_KINDS` for a model ``config`` (``"static"`` allocates
    ``max_cache_len`` up front; the others grow and need none). ``kw`` goes to the layers:
    ``margin`` for ``fp8-*``, ``q_group_size`` and ``residual_length`` for ``int4*`` (:data:`CACHE_KEYWORDS`;
    defaults :data:`INT4_LAYOUT`);
    ``-unit`` after an FP8 kind fixes the scale at 1.0 instead of the calibrated per-head scale."""
    one_of(kind, "kind", CACHE_KEYWORDS, what="KV cache kind")
    n = positive_int(model_config(config).num_hidden_layers, "config.num_hidden_layers")
    if max_cache_len is not None:
        max_cache_len = positive_int(max_cache_len, "max_cache_len", "tokens the cache can hold")
    unknown = sorted(set(kw) - set(CACHE_KEYWORDS[kind]))
    if unknown:
        raise TypeError(f"make_cache({kind!r}) takes no keyword {unknown}; it takes {list(CACHE_KEYWORDS[kind]) or 'none'}")
    if kind == "baseline":  # the model's own dtype, transformers' default DynamicCache
        return DynamicCache(config=config)
    if kind == "static":
        if max_cache_len is None:
            raise ValueError("a static cache needs max_cache_len (the prompt plus the new tokens)")
        return StaticCache(config=config, max_cache_len=max_cache_len)
    if kind.startswith("fp8-"):
        fmt = {"fp8-e4m3": "e4m3fn", "fp8-e5m2": "e5m2"}[kind.removesuffix("-unit")]
        return Cache(layers=[FP8Layer(fmt, unit_scale=kind.endswith("-unit"), **kw) for _ in range(n)])
    if kind == "int4":
        layers = [Int4Layer(**kw) for _ in range(n)]
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        int4_group(head_dim, layers[0].q_group_size)       # a group that does not fit fails here, not in generate
        return Cache(layers=layers)
    # int4-hqq: transformers' QuantizedCache, HQQ backend
    if importlib.util.find_spec("hqq") is None:
        raise ImportError(f"the int4-hqq cache needs the hqq package: {HQQ_INSTALL} (available_kinds() lists "
                          "the kinds installed here)")
    kw = {"q_group_size": positive_int(kw.get("q_group_size", INT4_LAYOUT.group_size), "q_group_size"),
          "residual_length": non_negative_int(kw.get("residual_length", INT4_LAYOUT.residual_length), "residual_length")}
    return QuantizedCache("hqq", config, nbits=4, axis_key=1, axis_value=1, **kw)


def stored_bytes(cache: Cache) -> int:
    """Bytes the cache actually stores (codes, scales, residual full-precision tokens), each once."""
    if not isinstance(cache, Cache):
        raise TypeError(f"cache must be a transformers Cache (make_cache(kind, config), or the past_key_values of "
                        f"a generate call), got {type(cache).__name__}")
    total, seen = 0, set()
    for layer in cache.layers:
        if hasattr(layer, "stored_tensors"):
            tensors = layer.stored_tensors()
        else:  # DynamicLayer, StaticLayer, or a library QuantizedLayer (tensors nested in tuples/dicts)
            tensors = _flatten([layer.keys, layer.values, getattr(layer, "_quantized_keys", None),
                                getattr(layer, "_quantized_values", None)])
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.numel():
                key = t.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total += t.numel() * t.element_size()
    return total


def _flatten(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _flatten(o)]
    return []


def fp8_roundtrip_bound(x: torch.Tensor, fmt: str = "e4m3fn", margin: float = 2.0) -> torch.Tensor:
    """Element-wise error bound of the FP8 layer's round trip: half an ulp of the scaled value,
    ``|x| · eps/2`` for normal values, plus half the subnormal spacing for tiny ones."""
    tensor(x, "x", 4, "float", "[batch, kv_heads, tokens, head_dim] (keys or values)")
    dt = FP8_FORMATS[one_of(fmt, "fmt", FP8_FORMATS, what="FP8 format")]
    margin = positive_number(margin, "margin", "the same margin as the FP8Layer's")
    fi = torch.finfo(dt)
    mant = {"e4m3fn": 3, "e5m2": 2, "e4m3fnuz": 3}[fmt]
    scale = (x.abs().amax(dim=(0, 2, 3), keepdim=True).float() * margin / fi.max).clamp(min=1e-8)
    sub_step = fi.tiny * 2.0 ** (-mant)
    return x.abs().float() * 2.0 ** (-mant - 1) + scale * sub_step / 2
