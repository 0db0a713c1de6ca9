"""scripts/run_all.py's small parts: plots extracted from an executed notebook, the GPU peak sampler,
merging the runs of several GPUs into one report."""
import base64
import importlib.util
import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest

spec = importlib.util.spec_from_file_location("run_all", Path(__file__).resolve().parent.parent / "scripts" / "run_all.py")
run_all = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_all)

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


def test_save_plots_writes_every_png(tmp_path):
    nb = nbformat.v4.new_notebook()
    one = nbformat.v4.new_code_cell("plot")
    one.outputs = [nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "fig"})]
    two = nbformat.v4.new_code_cell("two plots")
    two.outputs = [nbformat.v4.new_output("display_data", data={"image/png": PNG}) for _ in range(2)]
    nb.cells = [nbformat.v4.new_markdown_cell("text"), one, two, nbformat.v4.new_code_cell("print(1)")]
    run_all.save_plots(nb, tmp_path / "plots", "99_demo")
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["99_demo_cell1.png", "99_demo_cell2_0.png", "99_demo_cell2_1.png"]
    assert (tmp_path / "plots" / "99_demo_cell1.png").read_bytes().startswith(b"\x89PNG")
    nb.cells = nb.cells[:2]                                    # run again: the cell that plotted twice is gone
    (tmp_path / "plots" / "98_other_cell1.png").write_bytes(b"kept")
    run_all.save_plots(nb, tmp_path / "plots", "99_demo")
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["98_other_cell1.png", "99_demo_cell1.png"]


def test_headless_client_keeps_what_an_output_widget_captures_in_the_cell():
    """No front-end for the Output widget (jupyter/nbclient#312): nothing is sent back to the kernel, and
    what ``interactive_output`` prints stays in the cell's outputs, before the widget's view."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import ipywidgets as w\n"
                                          "ui = w.IntSlider(value=3)\n"
                                          "out = w.interactive_output(lambda x: print('value', x), {'x': ui})\n"
                                          "w.VBox([ui, out])")]
    client = run_all.headless_client(nb, timeout=60, kernel_name="python3")
    client.execute()
    outs = nb.cells[0].outputs
    assert client.comm_objects == {}
    assert [o.output_type for o in outs] == ["stream", "execute_result"] and outs[0].text == "value 3\n"
    assert "application/vnd.jupyter.widget-view+json" in outs[1].data
    assert nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]   # the widgets' state is kept


@pytest.mark.skipif(os.name != "posix", reason="Unix sockets: POSIX only (elsewhere the client keeps TCP)")
def test_headless_kernels_talk_over_sockets_of_their_own_not_tcp_ports():
    """A kernel started over TCP at the same moment as another can find the free port it was given taken (a
    CI run: "Address already in use", "Kernel died before replying to kernel_info"); each headless client's
    kernel uses Unix sockets in a folder of its own, removed with the client."""
    import gc
    clients, folders = [], []
    for _ in range(2):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell("from ipykernel.connect import get_connection_info as c\n"
                                              "i = c(unpack=True); print(i['transport'], i['ip'])")]
        client = run_all.headless_client(nb, timeout=60, kernel_name="python3")
        client.execute()
        transport, ip = nb.cells[0].outputs[0].text.split()
        assert transport == "ipc"
        clients.append(client)
        folders.append(Path(ip).parent)
    assert folders[0] != folders[1] and all(f.is_dir() for f in folders)
    del client, clients
    gc.collect()
    assert not any(f.exists() for f in folders)


def test_headless_client_keeps_tcp_where_the_caller_or_the_system_says_so(tmp_path, monkeypatch):
    from traitlets.config import Config
    nb = nbformat.v4.new_notebook()
    long = tmp_path / ("d" * 100)                       # a TMPDIR whose socket paths would not fit
    long.mkdir()
    monkeypatch.setattr(run_all.tempfile, "tempdir", str(long))
    client = run_all.headless_client(nb, timeout=60, kernel_name="python3")
    assert "transport" not in client.config.KernelManager and list(long.iterdir()) == []
    monkeypatch.undo()
    tcp = Config({"KernelManager": {"transport": "tcp"}})
    assert run_all.headless_client(nb, kernel_name="python3", config=tcp).config.KernelManager.transport == "tcp"
    other = run_all.headless_client(nb, kernel_name="python3", config=Config({"NotebookClient": {"allow_errors": True}}))
    assert other.allow_errors and other.config.KernelManager.transport == ("ipc" if os.name == "posix" else "tcp")


def test_slowest_cells_read_the_recorded_timestamps(tmp_path):
    """Executed for real by nbclient: the two sleeps are the slowest cells, in order, with their seconds."""
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("text"), nbformat.v4.new_code_cell("import time; time.sleep(0.3)"),
                nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("time.sleep(0.6)  # the longest")]
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    rows = run_all.slowest_cells(nb, n=2)
    assert [r["cell"] for r in rows] == [3, 1]
    assert rows[0]["source"] == "time.sleep(0.6)  # the longest"
    assert 0.55 <= rows[0]["seconds"] < 5 and 0.25 <= rows[1]["seconds"] < rows[0]["seconds"]
    assert run_all.cell_seconds(nbformat.v4.new_code_cell("never run")) is None


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_gpu_peak_is_none_without_nvidia_smi():
    assert run_all.GpuPeak().stop() is None


def _part(folder, names, **meta):
    folder.mkdir()
    run = {"profile": "full", "device": "GPU X", "torch": "2", "transformers": "5", "card_gib": None,
           "date": "2026-11-30", **meta,
           "notebooks": [{"name": n, "seconds": 1.0, "ok": True} for n in names],
           "key_numbers": {n.removesuffix(".ipynb"): {"x": i} for i, n in enumerate(names)}}
    (folder / "run_all.json").write_text(json.dumps(run))
    for n in names:
        (folder / n).write_text("{}")
    return folder


def test_merge_sorts_rows_tags_parts_and_gathers_numbers(tmp_path):
    a = _part(tmp_path / "gpu0", ["05_b.ipynb", "06_c.ipynb"])
    b = _part(tmp_path / "gpu1", ["00_a.ipynb"])
    m = run_all.merge([a, b], tmp_path / "all", {"note": "random weights"})
    assert [r["name"] for r in m["notebooks"]] == ["00_a.ipynb", "05_b.ipynb", "06_c.ipynb"]
    assert [r["part"] for r in m["notebooks"]] == ["gpu1", "gpu0", "gpu0"]
    assert m["key_numbers"] == {"00_a": {"x": 0}, "05_b": {"x": 0}, "06_c": {"x": 1}}
    assert m["note"] == "random weights" and m["parts"] == ["gpu0", "gpu1"]
    assert json.loads((tmp_path / "all" / "run_all.json").read_text()) == m
    assert sorted(p.name for p in (tmp_path / "all").glob("*.ipynb")) == ["00_a.ipynb", "05_b.ipynb", "06_c.ipynb"]


def test_merge_refuses_mixed_runs_and_repeats(tmp_path):
    a = _part(tmp_path / "h200", ["00_a.ipynb"])
    t4 = _part(tmp_path / "t4", ["01_b.ipynb"], card_gib="15")
    with pytest.raises(ValueError, match="card_gib"):
        run_all.merge([a, t4], tmp_path / "out")
    again = _part(tmp_path / "again", ["00_a.ipynb"])
    with pytest.raises(ValueError, match="more than one part"):
        run_all.merge([a, again], tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="run_all.json"):
        run_all.merge([tmp_path / "missing"], tmp_path / "out")
    with pytest.raises(ValueError, match="at least one"):
        run_all.merge([], tmp_path / "out")
    with pytest.raises(ValueError, match="is one of the parts"):
        run_all.merge([a, t4], a)


def test_merge_supersede_keeps_the_later_run_and_records_the_earlier(tmp_path):
    first = _part(tmp_path / "first", ["02_x.ipynb", "03_y.ipynb"])
    rerun = _part(tmp_path / "rerun", ["02_x.ipynb"])
    json_rows = json.loads((rerun / "run_all.json").read_text())
    json_rows["notebooks"][0]["seconds"] = 9.0
    json_rows["key_numbers"] = {"02_x": {"x": "new"}}
    (rerun / "run_all.json").write_text(json.dumps(json_rows))
    m = run_all.merge([first, rerun], tmp_path / "out", supersede=True)
    row = next(r for r in m["notebooks"] if r["name"] == "02_x.ipynb")
    assert row["seconds"] == 9.0 and row["part"] == "rerun"
    assert [e["part"] for e in row["earlier"]] == ["first"]
    assert m["key_numbers"]["02_x"] == {"x": "new"} and len(m["notebooks"]) == 2


def test_merge_takes_a_merged_report_as_a_part_keeping_its_parts_and_dates(tmp_path):
    """A card's reference_run.json (itself a merge) copied into a folder as run_all.json joins a new part:
    its rows keep their own parts (the superseded one under earlier), its dates and parts join the new ones'."""
    old = run_all.merge([_part(tmp_path / "call1", ["00_a.ipynb"]), _part(tmp_path / "call2", ["01_b.ipynb"])],
                        tmp_path / "reference")
    assert old["parts"] == ["call1", "call2"] and old["dates"] == ["2026-11-30"] and "date" not in old
    new = _part(tmp_path / "today", ["01_b.ipynb"], date="2026-12-07")
    m = run_all.merge([tmp_path / "reference", new], tmp_path / "out", supersede=True)
    assert [(r["name"], r["part"]) for r in m["notebooks"]] == [("00_a.ipynb", "call1"), ("01_b.ipynb", "today")]
    assert [e["part"] for e in m["notebooks"][1]["earlier"]] == ["call2"]
    assert m["parts"] == ["call1", "call2", "today"] and m["dates"] == ["2026-11-30", "2026-12-07"]
    # a merged report as the later part keeps its own earlier rows beside the one it supersedes
    m2 = run_all.merge([_part(tmp_path / "first", ["01_b.ipynb"]), tmp_path / "out"], tmp_path / "out2", supersede=True)
    row = next(r for r in m2["notebooks"] if r["name"] == "01_b.ipynb")
    assert row["part"] == "today" and [e["part"] for e in row["earlier"]] == ["first", "call2"]


def test_merge_takes_only_what_each_part_ran_and_the_later_parts_plots(tmp_path):
    """A part's folder may hold executed copies and plots of an older run of notebooks it did not run this
    time: they are not gathered; a notebook's plots come from the part whose run counts, none of the earlier's."""
    first = _part(tmp_path / "first", ["02_x.ipynb"])
    (first / "plots").mkdir()
    (first / "plots" / "02_x_cell3.png").write_bytes(b"first")
    (first / "plots" / "02_x_cell4.png").write_bytes(b"first")
    rerun = _part(tmp_path / "rerun", ["02_x.ipynb"])
    (rerun / "03_stale.ipynb").write_text("{}")                 # an older run's copy, not in this report
    (rerun / "plots").mkdir()
    (rerun / "plots" / "02_x_cell3.png").write_bytes(b"rerun")
    (rerun / "plots" / "03_stale_cell1.png").write_bytes(b"old")
    run_all.merge([first, rerun], tmp_path / "out", supersede=True)
    assert sorted(p.name for p in (tmp_path / "out").glob("*.ipynb")) == ["02_x.ipynb"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "out" / "plots").iterdir()} == {"02_x_cell3.png": b"rerun"}


def test_run_executes_notebooks_with_one_progress_bar(tmp_path, capsys, monkeypatch):
    import nbformat
    monkeypatch.setenv("COURSE_PROFILE", "ci")           # run() sets both for its notebooks; restored after
    monkeypatch.setenv("COURSE_REPORT", str(tmp_path / "unused.json"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 6 * 7"), nbformat.v4.new_code_cell("print(x)")])
    path = tmp_path / "99_demo.ipynb"
    nbformat.write(nb, path)
    rows = run_all.run([path], tmp_path / "out", "ci", timeout=120, progress=True)
    assert [r["ok"] for r in rows] == [True] and rows[0]["name"] == "99_demo.ipynb"
    done = nbformat.read(tmp_path / "out" / "99_demo.ipynb", 4)
    assert done.cells[1].outputs[0]["text"] == "42\n"
    assert "2/2" in capsys.readouterr().err                     # the bar counted both code cells
