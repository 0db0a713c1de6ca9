"""Key numbers of a headless run: notebooks call :func:`record`, ``scripts/run_all.py`` collects.

``scripts/run_all.py`` sets ``COURSE_REPORT`` to ``<out>/key_numbers.json`` before it starts the
kernels; each notebook records its main tables there under its own name. In an interactive session
(no ``COURSE_REPORT``) the calls do nothing.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from .config import file_lock, read_json
from .validate import bad_file

ENV_VAR = "COURSE_REPORT"


def _plain(value, name: str):
    """DataFrames → list of row dicts; tensors/numpy scalars → Python numbers; NaN and ±inf → null
    (valid JSON: a missing value of a table); other objects with a text of their own (a dtype, a
    path) → that text; recursively. An object whose text is only its address is refused."""
    if hasattr(value, "to_dict") and hasattr(value, "columns"):
        return [_plain(r, name) for r in value.to_dict(orient="records")]
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{name}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{name}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return _plain(value.item(), name)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if re.search(r" at 0x[0-9a-fA-F]+>$", str(value)):
        raise TypeError(f"{name} ({type(value).__name__}) has no value to record: record numbers, strings, "
                        "tables (DataFrames), or lists and dicts of them")
    return str(value)


def _read_report(path: Path) -> dict:
    data = read_json(path)
    if not isinstance(data, dict):
        raise bad_file(path, f"holds {type(data).__name__}, not the {{notebook: {{name: value}}}} report")
    for notebook, numbers in data.items():
        if not isinstance(numbers, dict):
            raise bad_file(path, f"has {type(numbers).__name__} under {notebook!r}, not a {{name: value}} dict")
    return data


def record(notebook: str, **numbers) -> Path | None:
    """Merge ``numbers`` into ``{notebook: {...}}`` in the file named by ``COURSE_REPORT`` (nothing
    to do without it; the arguments are checked either way)."""
    if not isinstance(notebook, str) or not notebook:
        raise ValueError(f"notebook must be a non-empty name such as '01_memory_budget', got {notebook!r}")
    if not numbers:
        raise ValueError("record(notebook, name=value, ...) needs at least one number to record")
    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{ENV_VAR}={path} names a folder: set it to a file, e.g. {p / 'key_numbers.json'}")
    plain = {k: _plain(v, k) for k, v in numbers.items()}
    with file_lock(p.with_suffix(".lock")):   # notebooks run in parallel (pytest -n 2) report into one file
        data = _read_report(p) if p.exists() else {}
        data.setdefault(notebook, {}).update(plain)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(data, indent=1, default=str))
    return p
