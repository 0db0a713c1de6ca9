"""Course-wide settings: the run profile and the on-disk cache.

One environment variable, ``COURSE_PROFILE``, selects how much work every notebook does:

* ``full`` (default): the learner profile — real calibration sizes, full grids, whole evaluations.
* ``ci``: the fast profile CI runs under nbmake — fewer tokens and smaller grids, same code paths.

Notebooks never read the variable themselves; they call :func:`pick`.
"""
from __future__ import annotations

import os
from pathlib import Path

PROFILES = ("full", "ci")


def profile() -> str:
    """The active profile name, validated (``COURSE_PROFILE``, default ``full``)."""
    name = os.environ.get("COURSE_PROFILE", "full").strip().lower() or "full"
    if name not in PROFILES:
        raise ValueError(f"COURSE_PROFILE={name!r} is not a profile; use one of {PROFILES}")
    return name


def is_ci() -> bool:
    """True under the fast CI profile."""
    return profile() == "ci"


def pick(full, ci):
    """Return ``ci`` under the CI profile, ``full`` otherwise: ``n = pick(full=128, ci=8)``."""
    return ci if is_ci() else full


def cache_dir(*parts: str) -> Path:
    """The course cache (``COURSE_CACHE``, default ``~/.cache/gpu-quant-course``), created on demand."""
    root = Path(os.environ.get("COURSE_CACHE", Path.home() / ".cache" / "gpu-quant-course"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
