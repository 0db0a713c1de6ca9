"""scripts/run_all.py's small parts: plots extracted from an executed notebook, the GPU peak sampler."""
import base64
import importlib.util
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


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_gpu_peak_is_none_without_nvidia_smi():
    assert run_all.GpuPeak().stop() is None
