"""nbmake runs every notebook; this checks what a learner would see of it (scripts/check_outputs.py):
no cell emits more than a screenful, and each cell's result is its last output. A notebook whose
cells all run but break these rules fails, naming the cell. ``COURSE_EXECUTED_DIR=DIR`` also saves
each executed notebook there (reference-run artifacts; the committed notebooks stay without outputs)."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

_spec = importlib.util.spec_from_file_location("check_outputs", Path(__file__).parents[1] / "scripts" / "check_outputs.py")
check_outputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_outputs)


def pytest_configure(config):
    try:
        from nbmake import nb_run
        from nbmake.nb_result import NotebookError
    except ImportError:  # nbmake not installed: nothing runs the notebooks, nothing to check
        return
    if getattr(nb_run.NotebookRun.execute, "_course_checked", False):
        return
    original = nb_run.NotebookRun.execute

    def execute(self):
        res = original(self)
        where = os.environ.get("COURSE_EXECUTED_DIR")
        if where:
            import nbformat
            Path(where).mkdir(parents=True, exist_ok=True)
            nbformat.write(res.nb, str(Path(where) / Path(self.filename).name))
        if res.error is None:
            found = check_outputs.problems(res.nb, Path(self.filename).name)
            if found:
                first = int(found[0].split("cell [")[1].split("]")[0])
                res.error = NotebookError(summary="outputs a learner cannot read: " + found[0],
                                          trace="\n".join(found), failing_cell_index=first)
        return res

    execute._course_checked = True
    nb_run.NotebookRun.execute = execute

