"""Course-wide settings: the run profile and the on-disk cache.

One environment variable, ``COURSE_PROFILE``, selects how much work every notebook does:

* ``full`` (default): the learner profile — real calibration sizes, full grids, whole evaluations.
* ``ci``: the fast profile CI runs the notebooks in (``pytest notebooks``) — fewer tokens and smaller grids, same code paths.
* ``workshop``: an instructor's half-day session (docs/workshop.md): the learner's code with a
  smaller calibration and evaluation, every quantized variant prebuilt into a shared cache
  (``scripts/prebuild.py``) so that no notebook quantizes with a library during the session.

Notebooks never read the variable themselves; they call :func:`pick`.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

PROFILES = ("full", "ci", "workshop")
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


def pick(full, ci, workshop=None):
    """The value for the active profile: ``n = pick(full=128, ci=8)``; ``workshop`` defaults to ``full``."""
    name = profile()
    if name == "ci":
        return ci
    if name == "workshop" and workshop is not None:
        return workshop
    return full


def quality_settings(gpu: bool) -> dict:
    """Profile-sized work for the quality notebooks (03–06): the full profile is the course as a
    learner runs it (on a GPU the papers' 128 × 512 calibration tokens; on a CPU 16 × 512, minutes
    instead of hours); CI is a smoke test with the same code paths on the model's first ``layers``
    decoder blocks (:func:`helpers.course_model.setup` cuts it); the workshop profile keeps the model
    whole and the calibration small."""
    full_gpu = {"calib_samples": 128, "seq_len": 512, "eval_tokens": 128 * 512, "n_grid": 20}
    full_cpu = {"calib_samples": 16, "seq_len": 512, "eval_tokens": 32 * 512, "n_grid": 20}
    return pick(full=full_gpu if gpu else full_cpu,
                ci={"calib_samples": 4, "seq_len": 128, "eval_tokens": 4 * 128, "n_grid": 4, "layers": 6},
                workshop={"calib_samples": 32 if gpu else 8, "seq_len": 512, "eval_tokens": 32 * 512, "n_grid": 10})


def cache_dir(*parts: str) -> Path:
    """The course cache (``COURSE_CACHE``, default ``~/.cache/gpu-quant-course``), created on demand."""
    root = Path(os.environ.get("COURSE_CACHE", Path.home() / ".cache" / "gpu-quant-course"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def results_path(*parts: str) -> Path:
    """A file of the course's recorded results (``results/…`` of the repository ``helpers`` was imported
    from — the clone on Colab too), found from anywhere rather than from the working directory; it may
    not exist (an installed copy without the repository has no ``results/``): callers check."""
    return Path(__file__).resolve().parents[1].joinpath("results", *parts)


def read_json(path: Path | str) -> dict:
    """A JSON file the course wrote, read back with a clear error naming the file and the remedy
    when it is corrupt (an interrupted write, a hand edit)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}). It is a file the course writes: delete it "
                         f"(rm '{path}') and run the cell again to rebuild it.") from None


def replace_whole(path: Path | str, write, fsync: bool = False) -> Path:
    """Write ``path`` whole or not at all: ``write(tmp)`` fills a file of this process's beside it
    (flushed to disk first when ``fsync``), which is then renamed over ``path`` (``os.replace`` is
    atomic). A run killed mid-write leaves the previous file, and processes sharing the folder (a
    workshop's cache) never read a half-written one. The folder is made if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json(path: Path | str, data, indent: int | None = 1, default=None) -> None:
    """``data`` as JSON at ``path``, whole or not at all (:func:`replace_whole`): a run killed mid-write
    (a timeout) leaves the previous rows, not an empty file. The folder is made if missing."""
    text = json.dumps(data, indent=indent, default=default)
    replace_whole(path, lambda tmp: tmp.write_text(text))


@contextlib.contextmanager
def file_lock(path: Path | str):
    """Hold an exclusive lock on ``path`` (created if missing) for the block: two processes that build
    the same cached file — two notebooks under ``pytest -n 2``, workshop participants sharing one
    cache — take turns instead of both building it and racing to write it. POSIX ``flock``; where
    there is none (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the cache's own checks still catch a torn write
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
