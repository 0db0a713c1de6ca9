"""The course's door checks: one meaning of "a positive integer", "finite bytes", "a name from
this list" for every public helper.

Each check takes the value and the argument's ``name`` and returns the value normalised (a Python
``int``/``float``/``bool``) or raises an error that names the argument, what it got and what to
give instead (``TypeError`` for a wrong kind of value, ``ValueError`` for a value outside its
domain). Conventions, the same everywhere:

* integers of any library are integers: ``int``, ``numpy.int64``, a 0-d integer ``torch.Tensor``;
* a bool is never a number (``True`` is not a batch size of 1), and a float is never an integer
  (``4.0`` is refused where a count is meant, never truncated);
* NaN and ±inf are refused wherever a number is meant;
* a file the course wrote that parses but is not what it claims (:func:`bad_file`) names the file
  and the remedy (delete it, run the cell again).

Standard library only, so any module of any layer can call it.
"""
from __future__ import annotations

import math
import operator

_BOOL_DTYPES = ("bool", "torch.bool")


def _is_bool(value) -> bool:
    return isinstance(value, bool) or str(getattr(value, "dtype", "")) in _BOOL_DTYPES


def _tail(hint: str) -> str:
    return f"; {hint}" if hint else ""


def _scalar(value) -> bool:
    return getattr(value, "ndim", 0) == 0


def as_int(value, name: str, hint: str = "") -> int:
    """``value`` as a Python int (numpy and 0-d torch integers accepted); bools and floats refused."""
    if _is_bool(value):
        raise TypeError(f"{name} must be an integer, got the bool {value!r}{_tail(hint)}")
    try:
        if not _scalar(value):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}{_tail(hint)}") from None


def positive_int(value, name: str, hint: str = "") -> int:
    """``value`` as an int ≥ 1, or an error that names ``name``."""
    v = as_int(value, name, hint)
    if v <= 0:
        raise ValueError(f"{name} must be a positive integer, got {v}{_tail(hint)}")
    return v


def non_negative_int(value, name: str, hint: str = "") -> int:
    """``value`` as an int ≥ 0, or an error that names ``name``."""
    v = as_int(value, name, hint)
    if v < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {v}{_tail(hint)}")
    return v


def as_number(value, name: str, hint: str = "") -> int | float:
    """``value`` as a finite Python number: an int stays an int (exact bytes), anything else real
    (numpy floats, 0-d torch tensors) becomes a float. Bools, strings, NaN and ±inf are refused."""
    if _is_bool(value) or isinstance(value, (str, bytes)) or not _scalar(value):
        kind = "the bool" if _is_bool(value) else type(value).__name__
        raise TypeError(f"{name} must be a number, got {kind} {value!r}{_tail(hint)}")
    try:
        return operator.index(value)
    except TypeError:
        pass
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}{_tail(hint)}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v}{_tail(hint)}")
    return v


def positive_number(value, name: str, hint: str = "") -> int | float:
    """``value`` as a finite number > 0 (see :func:`as_number`)."""
    v = as_number(value, name, hint)
    if v <= 0:
        raise ValueError(f"{name} must be a positive, finite number, got {v}{_tail(hint)}")
    return v


def non_negative_number(value, name: str, hint: str = "") -> int | float:
    """``value`` as a finite number ≥ 0, e.g. bytes or seconds (see :func:`as_number`)."""
    v = as_number(value, name, hint)
    if v < 0:
        raise ValueError(f"{name} must be a non-negative, finite number, got {v}{_tail(hint)}")
    return v


def number_in(value, name: str, low: float, high: float, *, low_open: bool = False, high_open: bool = False,
              hint: str = "") -> int | float:
    """``value`` as a finite number inside ``[low, high]``; ``low_open``/``high_open`` exclude an end."""
    v = as_number(value, name, hint)
    if v < low or v > high or (low_open and v == low) or (high_open and v == high):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {v}{_tail(hint)}")
    return v


def flag(value, name: str) -> bool:
    """``value`` as ``True``/``False`` (numpy bools accepted); ``1``, ``"yes"``, ``None`` refused."""
    if type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def one_of(value, name: str, options, what: str = "", hint: str = ""):
    """``value`` itself when it is one of ``options`` (a tuple, set or the keys of a dict), else a
    ``ValueError`` listing them: ``unknown {what} name=…; use one of […]``."""
    try:
        known = not _is_bool(value) and value in options
    except TypeError:                       # unhashable: a list where a name is meant
        known = False
    if known:
        return value
    names = list(options)
    shown = sorted(names) if all(isinstance(o, str) for o in names) else names
    if what:
        raise ValueError(f"unknown {what} {name}={value!r}; use one of {shown}{_tail(hint)}")
    raise ValueError(f"{name} must be one of {shown}, got {value!r}{_tail(hint)}")


def text(value, name: str, hint: str = "") -> str:
    """``value`` as a non-empty ``str``."""
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{name} must be a non-empty string, got {type(value).__name__} {value!r}{_tail(hint)}")
    return value


def tensor(value, name: str, ndim: int | None = None, kind: str | None = None, layout: str = ""):
    """``value`` itself when it is a ``torch.Tensor`` with ``ndim`` dimensions and, for ``kind``,
    a floating (``"float"``) or integer (``"int"``) dtype; ``layout`` (e.g. ``"[batch, len]"``)
    describes the expected shape in the message."""
    import torch  # every caller of a tensor check has torch loaded already

    want = f"a {ndim}-D torch.Tensor" if ndim is not None else "a torch.Tensor"
    want += f" {layout}" if layout else ""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be {want}, got {type(value).__name__}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name} must be {want}, got shape {tuple(value.shape)}")
    if kind == "float" and not value.is_floating_point():
        raise TypeError(f"{name} must hold floating-point values, got {value.dtype}")
    if kind == "int" and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        raise TypeError(f"{name} must hold integers, got {value.dtype}")
    return value


def model_config(value, name: str = "config"):
    """``value`` itself when it looks like a transformers model config (it has
    ``num_hidden_layers``); a dict, a path or ``None`` gets an error saying where configs come from."""
    if isinstance(value, (dict, str)) or not hasattr(value, "num_hidden_layers"):
        raise TypeError(f"{name} must be a model config (transformers.AutoConfig.from_pretrained(...) or "
                        f"model.config), got {type(value).__name__}")
    return value


def bad_file(path, problem: str) -> ValueError:
    """The error for a file the course wrote that parses but is not what it claims: it names the
    file, what is wrong with it, and the remedy."""
    return ValueError(f"{path} {problem}. It is a file the course writes: delete it (rm '{path}') and run "
                      "the cell again to rebuild it.")


def json_fields(row, path, fields: dict, where: str = "") -> dict:
    """``row`` (one record read from the JSON file ``path``) when it is a dict holding every key of
    ``fields``, each passing its check (``fields[key](value, key)``, one of the checks above); else
    :func:`bad_file` naming the key. ``where`` says which record (``"entry 'cpu:bfloat16' row 1"``)."""
    at = f" in {where}" if where else ""
    if not isinstance(row, dict):
        raise bad_file(path, f"holds {type(row).__name__} {str(row)[:40]!r}{at} where a record (a JSON object) belongs")
    for key, check in fields.items():
        if key not in row:
            raise bad_file(path, f"lacks {key!r}{at}")
        try:
            check(row[key], key)
        except (TypeError, ValueError) as e:
            raise bad_file(path, f"has a bad {key!r}{at} ({e})") from None
    return row
