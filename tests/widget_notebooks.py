"""What tests/test_browser.py runs in JupyterLab: copies of the widget notebooks cut to what their widgets need
(the whole notebooks run under ``pytest notebooks``). Its own test, which needs no browser, is
tests/test_widget_notebooks.py."""
from __future__ import annotations

from pathlib import Path

# per notebook, the code cells its widget needs besides the set-up and import cells (the first two code
# cells), each named by a line it holds, and the widget's cell last
WIDGET_NEEDS = {
    "01_memory_budget.ipynb": ("widgets.budget_widget()",),
    "07_kv_cache_ab.ipynb": ("prof = measure.StageProfiler()", "widgets.kv_widget("),
}


def widget_copy(src: Path, dest: Path, needs: tuple[str, ...]) -> int:
    """``src`` written to ``dest`` with only its first two code cells and the code cells holding one of
    ``needs`` (in order); refuses a notebook where a line of ``needs`` matches no cell. Returns the cells kept."""
    import nbformat
    nb = nbformat.read(src, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    missing = [n for n in needs if not any(n in c.source for c in code)]
    if missing:
        raise ValueError(f"{src.name}: no code cell holds {missing}: update WIDGET_NEEDS in tests/widget_notebooks.py")
    nb.cells = [c for k, c in enumerate(code) if k < 2 or any(n in c.source for n in needs)]
    nbformat.write(nb, dest)
    return len(nb.cells)
