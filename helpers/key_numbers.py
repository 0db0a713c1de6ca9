"""Key numbers of a headless run: notebooks call :func:`record`, ``scripts/run_all.py`` collects.

``scripts/run_all.py`` sets ``COURSE_REPORT`` to ``<out>/key_numbers.json`` before it starts the
kernels; each notebook records its main tables there under its own name. In an interactive session
(no ``COURSE_REPORT``) the calls do nothing.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .config import file_lock, read_json

ENV_VAR = "COURSE_REPORT"


def _plain(value):
    """DataFrames → list of row dicts; tensors/numpy scalars → Python numbers; recursively."""
    if hasattr(value, "to_dict") and hasattr(value, "columns"):
        return [_plain(r) for r in value.to_dict(orient="records")]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    if isinstance(value, float) and value != value:  # NaN → null (valid JSON)
        return None
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def record(notebook: str, **numbers) -> Path | None:
    """Merge ``numbers`` into ``{notebook: {...}}`` in the file named by ``COURSE_REPORT``."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    if not isinstance(notebook, str) or not notebook:
        raise ValueError(f"notebook must be a non-empty name such as '01_memory_budget', got {notebook!r}")
    p = Path(path)
    with file_lock(p.with_suffix(".lock")):   # notebooks run in parallel (pytest -n 2) report into one file
        data = read_json(p) if p.exists() else {}
        data.setdefault(notebook, {}).update({k: _plain(v) for k, v in numbers.items()})
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(data, indent=1, default=str))
    return p
