"""Check that every notebook is committed as reviewable text and without outputs.

    python scripts/check_notebooks.py            # exit 1 with a line per problem
    python scripts/check_notebooks.py --fix      # strip outputs and re-sync .ipynb from its .py pair

* each ``notebooks/*.ipynb`` has a jupytext percent-format pair ``notebooks/*.py`` (what reviewers
  read and diff) and the two hold the same cells (type and source);
* no ``.ipynb`` carries outputs or execution counts (executed copies belong in reference runs);
* every notebook's set-up cell and Colab badge point at ``helpers.config.COURSE_REPO`` (the one place to
  change when the course is published; ``--fix`` rewrites the notebooks and the README to match).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(ROOT))
from helpers.config import COURSE_REPO  # noqa: E402

REPO_IN_CELL = re.compile(r'COURSE_REPO = "([^"]+)"')
REPO_IN_BADGE = re.compile(r"colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/")


def repo_problems(text: str, name: str) -> list[str]:
    """The set-up cell's address and every Colab badge must be :data:`COURSE_REPO`."""
    out = []
    slug = COURSE_REPO.removeprefix("https://github.com/")
    if name.endswith(".py") and name[:2].isdigit():
        found = REPO_IN_CELL.findall(text)
        if found != [COURSE_REPO]:
            out.append(f"{name}: set-up cell's COURSE_REPO is {found or 'missing'}, helpers.config says {COURSE_REPO}")
    for badge in REPO_IN_BADGE.findall(text):
        if badge != slug:
            out.append(f"{name}: Colab badge points at {badge}, helpers.config.COURSE_REPO at {slug}")
    return out


def rewrite_repo(text: str) -> str:
    slug = COURSE_REPO.removeprefix("https://github.com/")
    text = REPO_IN_CELL.sub(f'COURSE_REPO = "{COURSE_REPO}"', text)
    return REPO_IN_BADGE.sub(f"colab.research.google.com/github/{slug}/blob/", text)


def cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def problems(folder: Path = NOTEBOOKS) -> list[str]:
    out = []
    ipynbs, pys = sorted(folder.glob("*.ipynb")), sorted(p for p in folder.glob("*.py") if p.name != "conftest.py")
    for text_file in pys + ([ROOT / "README.md"] if folder == NOTEBOOKS else []):
        out += repo_problems(text_file.read_text(), text_file.name)
    for py in pys:
        if not py.with_suffix(".ipynb").exists():
            out.append(f"{py.name}: no paired .ipynb (run: jupytext --sync {py})")
    for path in ipynbs:
        nb = nbformat.read(path, as_version=4)
        py = path.with_suffix(".py")
        if not py.exists():
            out.append(f"{path.name}: no paired .py (run: jupytext --set-formats ipynb,py:percent {path})")
        elif cells(jupytext.read(py)) != cells(nb):
            out.append(f"{path.name}: differs from {py.name} (edit the .py, then: jupytext --sync {py})")
        for i, c in enumerate(nb.cells):
            if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None):
                out.append(f"{path.name}: cell {i} carries outputs (run: python scripts/check_notebooks.py --fix)")
                break
    return out


def fix(folder: Path = NOTEBOOKS) -> None:
    for text_file in sorted(p for p in folder.glob("*.py") if p.name != "conftest.py") + ([ROOT / "README.md"] if folder == NOTEBOOKS else []):
        text_file.write_text(rewrite_repo(text_file.read_text()))
    for path in sorted(folder.glob("*.ipynb")):
        py = path.with_suffix(".py")
        nb = jupytext.read(py) if py.exists() else nbformat.read(path, as_version=4)
        for c in nb.cells:
            if c.cell_type == "code":
                c.outputs, c.execution_count = [], None
        jupytext.write(nb, path)
        if not py.exists():
            jupytext.write(nb, py, fmt="py:percent")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fix", action="store_true")
    args = ap.parse_args()
    if args.fix:
        fix()
    found = problems()
    for p in found:
        print(p)
    print(f"notebooks: {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
