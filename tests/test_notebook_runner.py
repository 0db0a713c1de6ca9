"""The notebook runner (notebooks/conftest.py): notebooks collected without --nbmake, each run in a
kernel; a failing cell, a cell past the timeout and unreadable outputs reported by cell, with source
and traceback; executed copies saved to COURSE_EXECUTED_DIR."""
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

PLUGIN = Path(__file__).resolve().parents[1] / "notebooks" / "conftest.py"
SHIM = f"""import importlib.util
_spec = importlib.util.spec_from_file_location("course_notebook_runner", {str(PLUGIN)!r})
_plugin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_plugin)
pytest_addoption, pytest_configure, pytest_collect_file = (_plugin.pytest_addoption, _plugin.pytest_configure,
                                                           _plugin.pytest_collect_file)
"""


def _notebook(folder: Path, name: str, *cells) -> None:
    nb = new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(folder / name))


def _pytest(folder: Path, *args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", str(folder), "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, cwd=folder, env={**os.environ, **env}, timeout=600)


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "conftest.py").write_text(SHIM)
    return tmp_path


def test_notebooks_run_fail_by_cell_and_are_saved(folder, tmp_path_factory):
    _notebook(folder, "a_good.ipynb", new_markdown_cell("# fine"), new_code_cell("from pathlib import Path\n"
              "print('cwd', Path.cwd().name)"))
    _notebook(folder, "b_raises.ipynb", new_markdown_cell("# breaks"), new_code_cell("x = 1"),
              new_code_cell("y = x + 1\n1 / 0"), new_code_cell("print('never')"))
    _notebook(folder, "c_noisy.ipynb", new_code_cell("for i in range(100):\n    print(i)"))
    _notebook(folder, "d_slow.ipynb", new_code_cell("import time\ntime.sleep(120)"))
    saved = tmp_path_factory.mktemp("executed")
    r = _pytest(folder, "-q", "-rf", "--notebook-timeout=3", COURSE_EXECUTED_DIR=str(saved))
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "3 failed, 1 passed" in out, out
    assert "b_raises.ipynb: cell [2] raised ZeroDivisionError: division by zero" in out
    assert "----- cell [2] -----\ny = x + 1\n1 / 0" in out and "----- traceback -----" in out
    assert "\x1b[" not in out.split("b_raises.ipynb: cell [2]")[1].split("c_noisy")[0]   # plain text
    assert "c_noisy.ipynb: outputs a learner cannot read:\nc_noisy.ipynb cell [0]: 100 lines of text" in out
    assert "d_slow.ipynb: cell [0] ran past 3 s (--notebook-timeout)" in out
    good = json.loads((saved / "a_good.ipynb").read_text())
    assert "".join(good["cells"][1]["outputs"][0]["text"]) == f"cwd {folder.name}\n"     # run in the notebook's folder
    assert sorted(p.name for p in saved.iterdir()) == ["a_good.ipynb", "b_raises.ipynb", "c_noisy.ipynb",
                                                       "d_slow.ipynb"]


def test_nbmake_is_refused_not_run_twice(folder):
    _notebook(folder, "a.ipynb", new_code_cell("1"))
    r = _pytest(folder, "--nbmake")
    assert r.returncode == 4
    assert "drop --nbmake" in r.stderr or "unrecognized arguments: --nbmake" in r.stderr, r.stderr
