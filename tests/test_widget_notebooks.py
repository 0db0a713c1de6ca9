"""tests/widget_notebooks.py: the widget notebooks cut for the browser test (no browser needed here)."""
from pathlib import Path

import pytest
from widget_notebooks import WIDGET_NEEDS, widget_copy

ROOT = Path(__file__).resolve().parents[1]


def test_widget_copy_keeps_set_up_and_the_named_cells(tmp_path):
    kept = widget_copy(ROOT / "notebooks" / "07_kv_cache_ab.ipynb", tmp_path / "07.ipynb",
                       WIDGET_NEEDS["07_kv_cache_ab.ipynb"])
    import nbformat
    cut = nbformat.read(tmp_path / "07.ipynb", as_version=4).cells
    # set-up, imports, the model's load, the widget
    assert kept == 4 == len(cut) and "widgets.kv_widget(" in cut[-1].source and "load_for_memory(" in cut[2].source
    with pytest.raises(ValueError, match="no code cell holds"):
        widget_copy(ROOT / "notebooks" / "07_kv_cache_ab.ipynb", tmp_path / "x.ipynb", ("no such line",))
