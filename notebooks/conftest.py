"""The notebooks as tests: ``pytest notebooks`` (or ``pytest notebooks tests``, as CI does) collects every notebook
here and runs it top to bottom in a fresh kernel, the way a learner would; it fails on the first cell
that raises or runs past ``--notebook-timeout`` seconds (default 900), naming the cell with its source
and traceback. A notebook whose cells all run is then checked for what a learner would see of it
(scripts/check_outputs.py): no cell emits more than a screenful, and each cell's result is its last
output. ``COURSE_EXECUTED_DIR=DIR`` also saves each executed notebook there (reference-run artifacts;
the committed notebooks stay without outputs).

A pytest plugin in this folder's conftest (pytest's non-Python test collection, ``pytest_collect_file``
with a ``pytest.File`` and a ``pytest.Item``); a notebook runs with nbclient's ``NotebookClient``, as
nbmake runs one (outputs cleared first, the notebook's folder as the kernel's working directory, cell
timings recorded), so nbmake's ``--nbmake`` is not needed and is refused (it would run each notebook twice).
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest


def _script(name: str):
    """``scripts/<name>.py`` as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_outputs = _script("check_outputs")
run_all = _script("run_all")   # its headless_client: nbclient without the Output-widget hang (jupyter/nbclient#312)

DEFAULT_TIMEOUT = 900
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def pytest_addoption(parser):
    parser.addoption("--notebook-timeout", type=int, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                     help=f"seconds one notebook cell may run before the notebook fails (default {DEFAULT_TIMEOUT})")


def pytest_configure(config):
    if config.getoption("nbmake", default=False):
        raise pytest.UsageError("notebooks/conftest.py runs the notebooks itself, with the readable-outputs "
                                "check; drop --nbmake (and --nbmake-timeout: use --notebook-timeout)")


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix == ".ipynb" and ".ipynb_checkpoints" not in file_path.parts:
        return NotebookFile.from_parent(parent, path=file_path)
    return None


class NotebookFile(pytest.File):
    def collect(self):
        yield NotebookItem.from_parent(self, name=self.path.stem)


class NotebookFailure(Exception):
    """A notebook that did not run through, or whose outputs break check_outputs' rules: the report."""


class NotebookItem(pytest.Item):
    def runtest(self):
        import nbformat

        timeout = self.config.getoption("notebook_timeout", default=DEFAULT_TIMEOUT)
        nb = nbformat.read(str(self.path), as_version=4)
        failure = execute(nb, self.path.parent, timeout)
        where = os.environ.get("COURSE_EXECUTED_DIR")
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(Path(where) / self.path.name))
        if failure is None:
            found = check_outputs.problems(nb, self.path.name)
            if found:
                failure = "outputs a learner cannot read:\n" + "\n".join(found)
        if failure is not None:
            raise NotebookFailure(failure)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, NotebookFailure):
            return f"{self.path.name}: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, f"notebook {self.path.name}"


def execute(nb, cwd: Path, timeout: int) -> str | None:
    """Run ``nb`` (nbformat v4, changed in place: outputs cleared, then filled) with nbclient in a
    kernel whose working directory is ``cwd``, ``timeout`` seconds per cell; None when every cell ran,
    else the report: which cell, its source and what happened."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
    client = run_all.headless_client(nb, timeout=timeout, record_timing=True)
    try:
        client.execute(cwd=str(cwd))
    except CellExecutionError as e:
        i = _failing_cell(nb)
        return f"cell [{i}] raised {e.ename}: {e.evalue}\n{_cell_report(nb, i)}"
    except CellTimeoutError:
        i = _running_cell(nb)
        return f"cell [{i}] ran past {timeout} s (--notebook-timeout)\n{_cell_report(nb, i, traceback=False)}"
    except DeadKernelError as e:
        i = _running_cell(nb)
        return f"the kernel died in cell [{i}] ({e})\n{_cell_report(nb, i, traceback=False)}"
    return None


def _failing_cell(nb) -> int:
    """Index (among all cells) of the last code cell with an error output."""
    return max(i for i, c in enumerate(nb.cells) if c.cell_type == "code"
               and any(o.get("output_type") == "error" for o in c.get("outputs", [])))


def _running_cell(nb) -> int:
    """Index of the first code cell that did not finish (no ``shell.execute_reply`` timing)."""
    return next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                 and "shell.execute_reply" not in c.get("metadata", {}).get("execution", {})), -1)


def _cell_report(nb, i: int, traceback: bool = True) -> str:
    """Cell ``i``'s source and, with ``traceback``, its error's traceback as plain text."""
    if i < 0:
        return ""
    cell = nb.cells[i]
    out = [f"----- cell [{i}] -----", cell.source]
    if traceback:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                out += ["----- traceback -----", _ANSI.sub("", "\n".join(o.get("traceback", [])))]
    return "\n".join(out)
