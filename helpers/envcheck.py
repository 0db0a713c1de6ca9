"""Environment check: installed versions against the course's requirements (OK / FAIL per package)."""
from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

from packaging.requirements import Requirement

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"


def requirements(path: Path | None = None) -> list[Requirement]:
    """Requirements from requirements.txt (repo checkout) or, installed elsewhere, the package metadata."""
    path = Path(path) if path else REQUIREMENTS
    if path.exists():
        lines = [re.split(r"\s+#", l)[0].strip() for l in path.read_text().splitlines()]
        return [Requirement(l) for l in lines if l and not l.startswith("#")]
    return [Requirement(r) for r in (md.requires("gpu-quant-course-helpers") or []) if "extra ==" not in r]


def check(path: Path | None = None, echo: bool = True) -> list[dict]:
    """One row per requirement: name, wanted, installed, ok."""
    rows = []
    for req in requirements(path):
        try:
            have = md.version(req.name)
            ok = req.specifier.contains(have, prereleases=True) if req.specifier else True
        except md.PackageNotFoundError:
            have, ok = None, False
        rows.append({"package": req.name, "wanted": str(req.specifier) or "any", "installed": have, "ok": ok})
    if echo:
        for r in rows:
            print(f"{'OK ' if r['ok'] else 'FAIL'} {r['package']:<18} wanted {r['wanted']:<12} installed {r['installed']}")
        bad = [r["package"] for r in rows if not r["ok"]]
        print("all requirements satisfied" if not bad else f"{len(bad)} FAIL: pip install -r requirements.txt")
    return rows
