"""scripts/workshop_run.py: participants started together, each its own run_all report; the summary
counts who finished, who ran out of memory, and the agenda's share — run for real on tiny notebooks."""
import importlib.util
import json
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("workshop_run", ROOT / "scripts" / "workshop_run.py")
workshop_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(workshop_run)


def _nb(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def test_two_participants_start_together_and_the_oom_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "cache"))
    a = _nb(tmp_path / "00_a.ipynb", "import os, time; time.sleep(0.2)",
            "assert os.environ['COURSE_GPU_CAP_GIB'] == '7.5' and os.environ['COURSE_PROFILE'] == 'workshop'")
    b = _nb(tmp_path / "01_b.ipynb", "raise MemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')")
    out = tmp_path / "ws"
    code = workshop_run.main(["--participants", "2", "--cap-gib", "7.5", "--out", str(out), "--skip-cache-check",
                              str(a), str(b)])
    rep = json.loads((out / "workshop.json").read_text())
    assert code == 1 and not rep["everyone_finished"] and sorted(rep["runs"]) == ["p0", "p1"]
    first, second = rep["notebooks"]
    assert first["name"] == "00_a.ipynb" and first["ok"] == 2 == first["of"] and first["slowest_s"] > 0
    assert second["ok"] == 0 and second["oom"] == ["p0", "p1"] and second["failed"] == []
    assert rep["series_s"] == pytest.approx(first["slowest_s"] + second["slowest_s"], abs=0.11)
    assert rep["share"] == pytest.approx(rep["series_s"] / (3 * 3600), abs=1e-3)
    assert (out / "p1" / "00_a.ipynb").exists()


def test_summary_counts_a_participant_that_stopped_early():
    rows = lambda *names: [{"name": n, "seconds": 10.0, "ok": True, "error": None} for n in names]
    s = workshop_run.summarize({"p0": rows("a", "b"), "p1": rows("a")}, hours=1)
    assert [(r["name"], r["ok"], r["of"]) for r in s["notebooks"]] == [("a", 2, 2), ("b", 1, 2)]
    assert not s["everyone_finished"] and s["series_s"] == 20.0


def test_bad_arguments_and_an_empty_cache_are_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "empty"))
    with pytest.raises(SystemExit):
        workshop_run.main(["--participants", "0"])
    assert "--participants must be ≥ 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        workshop_run.main(["--out", str(tmp_path), str(tmp_path / "nope.ipynb")])
    assert "notebooks not found" in capsys.readouterr().err
    assert workshop_run.main(["--out", str(tmp_path / "w")]) == 2
    assert "run `python scripts/prebuild.py`" in capsys.readouterr().out


def test_a_time_limit_stops_the_participants_and_reports_what_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "cache"))
    a = _nb(tmp_path / "00_a.ipynb", "x = 1")
    b = _nb(tmp_path / "01_b.ipynb", "import time; time.sleep(120)")
    out = tmp_path / "ws"
    tmp = Path(workshop_run.tempfile.mkdtemp(prefix="ws-"))   # where the participants' TMPDIRs go (a short path:
    monkeypatch.setattr(workshop_run.tempfile, "tempdir", str(tmp))   # their kernels' sockets live there)
    code = workshop_run.main(["--participants", "2", "--out", str(out), "--skip-cache-check",
                              "--time-limit-s", "25", str(a), str(b)])
    rep = json.loads((out / "workshop.json").read_text())
    assert code == 1 and sorted(rep["stopped_at_limit"]) == ["p0", "p1"] and rep["wall_s"] < 60
    assert [(r["name"], r["ok"]) for r in rep["notebooks"]] == [("00_a.ipynb", 2), ("01_b.ipynb", 0)]
    assert rep["notebooks"][1]["slowest_s"] is None and not rep["everyone_finished"]
    assert list(tmp.iterdir()) == []          # each participant's TMPDIR (its kernels' sockets) went with it
    tmp.rmdir()
