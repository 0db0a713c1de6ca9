"""The KV cache as transformers stores it: positions per layer and bytes per position.

What the cache *exposes* (:func:`kv_positions`: a sliding or chunked layer holds at most its
window) and what its storage *occupies* (:func:`kv_storage_positions`: a sliding layer's view keeps
the whole prompt until the first decode step), and the bytes of one position's K and V
(:func:`kv_position_bytes`; latents for MLA), and the layout of the course's int4 cache
(:class:`KVLayout`). Sources: transformers 5.17 ``cache_utils`` (``DynamicCache``,
``DynamicSlidingWindowLayer.update``, ``StaticCache``, ``QuantizedLayer.update``); DeepSeek-V2
(arXiv:2405.04434 §2.1.2) for the latent cache; KIVI (Liu et al. 2024) for the residual.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .budget_inputs import CACHES, PLAIN_FORMATS, choice, dtype_bytes, non_negative_int, positive_int
from .budget_shape import Shape


@dataclass(frozen=True)
class KVLayout:
    """How the course's int4 KV cache (:class:`helpers.kvcache.Int4Layer`, transformers'
    ``QuantizedLayer``) stores one layer's K and V, validated once; the defaults are the cache's own
    (``make_cache("int4", config)``):

    * ``group_size`` — values of one token's head along ``head_dim`` that share an fp16 scale and an
      fp16 minimum (a group at least as wide as the head: one per row);
    * ``residual_length`` — the newest tokens wait unquantized in a residual, and the whole cache is
      re-quantized at the step that would fill it (:meth:`residual_tokens`);
    * ``residual_dtype`` — the residual's format: the model's dtype (a plain format or a floating
      torch dtype)."""
    group_size: int = 64
    residual_length: int = 16
    residual_dtype: str | torch.dtype = "bf16"

    def __post_init__(self):
        object.__setattr__(self, "group_size", positive_int(self.group_size, "group_size"))
        object.__setattr__(self, "residual_length", non_negative_int(self.residual_length, "residual_length"))
        d = self.residual_dtype
        if not (isinstance(d, torch.dtype) and d.is_floating_point or isinstance(d, str) and d in PLAIN_FORMATS):
            raise ValueError(f"residual_dtype must be one of {list(PLAIN_FORMATS)} or a floating torch.dtype (the "
                             f"model's dtype: the residual holds its K and V unquantized), got {d!r}")

    def residual_tokens(self, decode_steps: int) -> int:
        """Tokens in the unquantized residual after a prefill and ``decode_steps`` one-token steps:
        ``decode_steps mod max(residual_length, 2)``. ``QuantizedLayer.update`` quantizes the whole
        prompt at the prefill, appends each new token to the residual, and re-quantizes everything
        (emptying the residual) at a step that finds ``residual_length − 1`` or more tokens there;
        the step after an emptying always appends, hence the period of at least 2."""
        return non_negative_int(decode_steps, "decode_steps") % max(self.residual_length, 2)


def layer_windows(config) -> list[int | None]:
    """Each layer's attention window: ``None`` for full attention (and for a layer without a cache),
    the window of a sliding or chunked layer (:func:`helpers.budget_shape.layer_caches`)."""
    return [c.window for c in Shape.from_config(config).check_caches()]


def exposed_positions(s: Shape, tokens: int, cache: str) -> list[int]:
    """:func:`kv_positions` for a :class:`Shape` already read, ``cache`` already checked."""
    keep = (lambda w: w - 1) if cache == "dynamic" else (lambda w: w)
    return [0 if c.kind == "none" else tokens if c.window is None else min(tokens, keep(c.window))
            for c in s.check_caches()]


def kv_positions(config, tokens: int, cache: str = "dynamic") -> list[int]:
    """Positions each layer's KV cache holds after ``tokens`` tokens. A full-attention layer holds
    all of them; a sliding or chunked layer in transformers' ``DynamicCache`` keeps the last
    ``window − 1`` (``DynamicSlidingWindowLayer.update``: all a later query can attend to besides
    itself), a ``StaticCache`` allocates ``min(window, length)``; a layer without a cache holds none."""
    tokens = positive_int(tokens, "tokens")
    return exposed_positions(Shape.from_config(config), tokens, choice(cache, "cache", CACHES))


def storage_positions(s: Shape, prompt_len: int, steps: int) -> list[int]:
    """:func:`kv_storage_positions` for a :class:`Shape` already read, the arguments already checked."""
    return [0 if c.kind == "none" else prompt_len + steps if c.window is None or steps == 0
            else min(prompt_len + steps, c.window) for c in s.check_caches()]


def kv_storage_positions(config, prompt_len: int, steps: int = 0) -> list[int]:
    """Positions each layer's K (or V) *storage* holds in transformers' ``DynamicCache`` after the
    prefill of ``prompt_len`` tokens and ``steps`` one-token decode steps. A sliding layer keeps its
    last ``window − 1`` positions as a **view** of the tensor ``torch.cat`` just made
    (``full[:, :, -window + 1:, :]``, ``DynamicSlidingWindowLayer.update``), so after the prefill the
    whole prompt's storage stays alive; each decode step's ``torch.cat`` makes a new tensor of
    ``min(prompt_len + steps, window)`` positions and lets the old one go. Full-attention layers hold
    every position. (:func:`kv_positions` is what the cache *exposes*; this is what it *occupies*.)"""
    prompt_len = positive_int(prompt_len, "prompt_len")
    try:
        steps = non_negative_int(steps, "steps")
    except ValueError:
        raise ValueError(f"steps must be an int ≥ 0 (decode steps after the prefill), got {steps!r}") from None
    return storage_positions(Shape.from_config(config), prompt_len, steps)


def kv_widths(s: Shape) -> tuple[int, int, int]:
    """``(heads, k_dim, v_dim)`` of one layer's cached K and V per position: ``(kv_heads, head_dim,
    head_dim)``, or with MLA the single-head latents ``(1, kv_lora_rank, rope_dim)``."""
    if s.mla:
        return 1, s.mla.kv_lora_rank, s.mla.rope_dim
    return s.kv_heads, s.head_dim, s.head_dim


def kv_tensor_bytes(s: Shape, b: float) -> tuple[float, float]:
    """Bytes of one position in one layer's K tensor and in its V tensor at ``b`` bytes per element:
    ``heads · k_dim · b`` and ``heads · v_dim · b`` over :func:`kv_widths` — equal halves, except with
    MLA, whose two cached latents (``kv_lora_rank`` and the rotary key) differ in width."""
    heads, k, v = kv_widths(s)
    return heads * k * b, heads * v * b


def position_bytes(s: Shape, b: float) -> float:
    """Bytes of one position's K and V in one layer at ``b`` bytes per element: ``heads · (k_dim + v_dim) · b``
    over :func:`kv_widths`."""
    return sum(kv_tensor_bytes(s, b))


def kv_position_bytes(config, kv_dtype="bf16") -> float:
    """Bytes of one position's K and V in one layer for batch 1 (16-bit or fp32 plain formats):
    ``2 · kv_heads · head_dim · b``, or ``(kv_lora_rank + qk_rope_head_dim) · b`` with multi-head
    latent attention (DeepSeek-V2, arXiv:2405.04434 §2.1.2)."""
    return position_bytes(Shape.from_config(config), dtype_bytes(kv_dtype))
