"""Course-wide settings: the run profile and the on-disk cache.

One environment variable, ``COURSE_PROFILE``, selects how much work every notebook does:

* ``full`` (default): the learner profile — real calibration sizes, full grids, whole evaluations.
* ``ci``: the fast profile CI runs under nbmake — fewer tokens and smaller grids, same code paths.

Notebooks never read the variable themselves; they call :func:`pick`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

PROFILES = ("full", "ci")
# Where the course lives: the one place to change when it is published. Every notebook's set-up cell and
# Colab badge must agree with it (scripts/check_notebooks.py checks, and --fix rewrites them).
COURSE_REPO = "https://github.com/gpu-quant-course/gpu-quant-course"


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


def quality_settings(gpu: bool) -> dict:
    """Profile-sized work for the quality notebooks (03–06): the full profile is the course as a
    learner runs it (on a GPU the papers' 128 × 512 calibration tokens; on a CPU 16 × 512, minutes
    instead of hours); CI is a smoke test with the same code paths."""
    full_gpu = {"calib_samples": 128, "seq_len": 512, "eval_tokens": 128 * 512, "n_grid": 20}
    full_cpu = {"calib_samples": 16, "seq_len": 512, "eval_tokens": 32 * 512, "n_grid": 20}
    return pick(full=full_gpu if gpu else full_cpu,
                ci={"calib_samples": 4, "seq_len": 128, "eval_tokens": 8 * 128, "n_grid": 4})


def cache_dir(*parts: str) -> Path:
    """The course cache (``COURSE_CACHE``, default ``~/.cache/gpu-quant-course``), created on demand."""
    root = Path(os.environ.get("COURSE_CACHE", Path.home() / ".cache" / "gpu-quant-course"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_json(path: Path | str) -> dict:
    """A JSON file the course wrote, read back with a clear error naming the file and the remedy
    when it is corrupt (an interrupted write, a hand edit)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}). It is a file the course writes: delete it "
                         f"(rm '{path}') and run the cell again to rebuild it.") from None
