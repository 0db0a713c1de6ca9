"""What the memory budget accepts: the names of the KV/activation formats, attention
implementations, caches and devices it models, and its door checks.

Each check has :mod:`helpers.validate`'s meaning (numpy and torch integers accepted; bools, floats
where a count is meant, NaN and inf refused) and raises a ``ValueError`` naming the argument, so
every ``budget*`` function refuses a bad argument the same way.
"""
from __future__ import annotations

import torch

from . import validate

KV_FORMATS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
PLAIN_FORMATS = ("fp32", "bf16", "fp16")   # floating formats stored as they are (no codes, no scales)
ATTENTIONS = ("sdpa", "eager")
CACHES = ("dynamic", "static")
DEVICES = ("cuda", "cpu")


def positive_int(value, name: str) -> int:
    """``value`` as an int ≥ 1 (:func:`helpers.validate.positive_int`), else a ``ValueError`` naming ``name``."""
    try:
        return validate.positive_int(value, name)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None


def non_negative_int(value, name: str) -> int:
    """``value`` as an int ≥ 0 (:func:`helpers.validate.non_negative_int`), else a ``ValueError`` naming ``name``."""
    try:
        return validate.non_negative_int(value, name)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer ≥ 0, got {value!r}") from None


def byte_count(value, name: str, hint: str = "", unit: str = "bytes") -> float:
    """``value`` as a finite number ≥ 0 of ``unit`` (:func:`helpers.validate.non_negative_number`), else a
    ``ValueError`` naming ``name``."""
    try:
        return float(validate.non_negative_number(value, name))
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number of {unit} ≥ 0{hint}, got {value!r}") from None


def choice(value, name: str, options) -> str:
    """``value`` if it is one of ``options`` (:func:`helpers.validate.one_of`), else a ``ValueError``
    naming ``name`` and the options."""
    try:
        return validate.one_of(value, name, options)
    except ValueError:
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}") from None


def dtype_bytes(fmt) -> float:
    """Bytes per element of a KV/activation format name (:data:`KV_FORMATS`) or a torch dtype."""
    if isinstance(fmt, torch.dtype):
        return torch.empty(0, dtype=fmt).element_size()
    if isinstance(fmt, str) and fmt in KV_FORMATS:
        return KV_FORMATS[fmt] / 8
    raise ValueError(f"unknown dtype {fmt!r}; use one of {sorted(KV_FORMATS)} or a torch.dtype")


def is_fp16(fmt) -> bool:
    """Whether ``fmt`` names fp16 (the name or the torch dtype)."""
    return fmt in ("fp16", torch.float16)
