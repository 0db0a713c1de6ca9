"""The notebooks' set-up cell as a fresh Colab-like kernel runs it: clone COURSE_REPO (a local bare clone
of this repository), install once (pip commands dry-run: a real install takes minutes), then nothing."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_notebooks", ROOT / "scripts" / "check_notebooks.py")
cn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cn)


def setup_cell() -> str:
    cells = json.loads((ROOT / "notebooks" / "00_setup.ipynb").read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c["cell_type"] == "code" and "colab_setup.py" in "".join(c["source"]))


def test_every_notebook_has_the_same_set_up_cell():
    cells = [json.loads(p.read_text())["cells"] for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    sources = {"".join(c["source"]) for nb in cells for c in nb if "colab_setup.py" in "".join(c["source"])}
    assert len(sources) == 1 and len(cells) >= 10


def test_repo_check_catches_a_stale_address():
    text = setup_cell().replace(cn.COURSE_REPO, "https://github.com/someone/else")
    assert cn.repo_problems(text, "00_setup.py")
    badge = "[x](https://colab.research.google.com/github/old/place/blob/main/notebooks/00_setup.ipynb)"
    assert cn.repo_problems(badge, "README.md") and not cn.repo_problems(cn.rewrite_repo(badge), "README.md")


def _is_checkout_root() -> bool:
    top = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return top.returncode == 0 and Path(top.stdout.strip()).resolve() == ROOT.resolve()


@pytest.mark.skipif(not _is_checkout_root(), reason="the course is not a git checkout here (a copy of its files): "
                                                    "nothing to clone")
def test_set_up_cell_clones_installs_once_and_imports(tmp_path):
    bare = tmp_path / "course.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(ROOT), str(bare)], check=True)
    env = {**os.environ, "COURSE_FORCE_SETUP": "1", "COURSE_REPO": f"file://{bare}", "COURSE_DIR": str(tmp_path / "course"),
           "COURSE_PIP_DRY_RUN": "1", "COURSE_CACHE": str(tmp_path / "cache")}
    code = setup_cell() + "\nimport helpers.config\nprint('IMPORTED', helpers.config.COURSE_REPO)\n"
    first = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert (tmp_path / "course" / "scripts" / "colab_setup.py").exists()
    assert "would run:" in first.stdout and " -c " in first.stdout and "IMPORTED" in first.stdout
    assert list((tmp_path / "cache").glob("installed-*")), "no marker written"
    second = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "nothing to do" in second.stdout and "would run:" not in second.stdout


def test_a_bad_address_stops_with_a_message(tmp_path):
    env = {**os.environ, "COURSE_FORCE_SETUP": "1", "COURSE_REPO": f"file://{tmp_path}/nope.git",
           "COURSE_DIR": str(tmp_path / "course"), "GIT_TERMINAL_PROMPT": "0"}
    r = subprocess.run([sys.executable, "-c", setup_cell()], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Could not clone" in r.stderr and "COURSE_REPO" in r.stderr
