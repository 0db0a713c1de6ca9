"""The readable-outputs check (scripts/check_outputs.py) that runs on every notebook notebooks/conftest.py executes."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_outputs", ROOT / "scripts" / "check_outputs.py")
co = importlib.util.module_from_spec(spec)
spec.loader.exec_module(co)


def _stream(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text}


def _table():
    return {"output_type": "execute_result", "data": {"text/plain": "  a  b"}, "metadata": {}, "execution_count": 1}


def _nb(*cells):
    return {"cells": [{"cell_type": "code", "outputs": list(outs), "source": ""} for outs in cells]}


def test_progress_bar_redraws_are_one_line():
    assert co.screen_lines("\r 10%|#  |\r 50%|##### |\r100%|##########|\n") == 1
    assert co.screen_lines("a\nb\nc") == 3 and co.screen_lines("") == 0


def test_a_quiet_cell_passes():
    nb = _nb([_stream("loading\n"), _stream("\r 50%|#\r100%|##|\n", "stderr"), _table()])
    assert co.problems(nb) == []


def test_library_logs_are_caught():
    logs = [_stream(f"2026-12-01 | INFO | llmcompressor: step {i}\n", "stderr") for i in range(300)]
    found = co.problems(_nb([_stream("ok\n")], logs + [_table()]), "05.ipynb")
    assert found == ["05.ipynb cell [1]: 300 lines of text (more than a screenful; at most 60): quiet the logs"]
    interleaved = [o for i in range(45) for o in (_stream(f"step {i}\n", "stderr"), _table())]
    assert "90 outputs" in co.problems(_nb(interleaved))[0]


def test_outputs_are_counted_as_jupyterlab_merges_them():
    bar = [_stream(f"\r{i}/31", "stderr") for i in range(31)] + [_stream("\n", "stderr")]
    assert co.shown_outputs(bar + [_stream("done\n"), _table()]) == 3


def test_a_warning_after_the_result_is_caught():
    found = co.problems(_nb([_table(), _stream("UserWarning: clean_up_tokenization_spaces\n", "stderr")]))
    assert len(found) == 1 and "after the cell's result" in found[0] and "clean_up" in found[0]
    assert co.problems(_nb([_table(), _stream("a printed note\n")])) == []   # stdout after a table is prose


def test_command_line_names_a_missing_file(capsys):
    assert co.main(["no/such.ipynb"]) == 2
    assert "no/such.ipynb: no such file" in capsys.readouterr().out
