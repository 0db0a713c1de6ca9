"""The widgets in a real browser: JupyterLab + Chromium driven by Playwright.

``pytest notebooks`` proves the notebooks run; it cannot see whether a widget renders (a front-end without the
widget manager shows "Error displaying widget" or the text fallback) or whether moving a slider
updates anything. This test starts JupyterLab on a copy of notebooks 01 and 07 cut to what their widgets need (the set-up
and import cells, the cells named in ``tests/widget_notebooks.WIDGET_NEEDS`` and the widget's own: the whole notebooks run under
``pytest notebooks``), runs all its cells in the browser, checks that every widget rendered, moves the seq_len and batch sliders (typing into
their readouts, as a learner can) and a dropdown, and checks that the widget's output changed.
Screenshots go to ``build/browser/``.

Needs Debian's ``chromium`` (``apt-get install chromium``; .ci/run installs it) and the ``playwright``
package (its own browser download does not work offline: the system browser is used). Skips, saying
which is missing, where either is absent.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from widget_notebooks import WIDGET_NEEDS, widget_copy

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("COURSE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = ROOT / "build" / "browser"

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium, or set COURSE_CHROMIUM)"),
    pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None,
                       reason="JupyterLab is not installed (pip install jupyterlab)"),
]
playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on copies of the widget notebooks, cut to what their widgets need
    (:func:`widget_copy`; the committed ones stay without outputs)."""
    work = tmp_path_factory.mktemp("lab")
    (work / "notebooks").mkdir()
    for name, needs in WIDGET_NEEDS.items():
        widget_copy(ROOT / "notebooks" / name, work / "notebooks" / name, needs)
    (work / "results").symlink_to(ROOT / "results")   # notebooks read ../results/…
    port, token = _free_port(), "course-browser-test"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work / 'notebooks'}",
                             "--ServerApp.disable_check_xsrf=True", "--allow-root",
                             "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("JupyterLab did not start within 60 s: " + proc.stderr.read().decode()[-2000:])
    yield f"http://127.0.0.1:{port}", token
    proc.terminate()
    proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser():
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _run_all(page, url: str, token: str, name: str, timeout_s: int = 240):
    page.goto(f"{url}/lab/tree/{name}?token={token}&reset")
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    # the kernel must be connected and idle before "Run All Cells", or the request can be lost
    page.wait_for_function("document.querySelector('#jp-main-statusbar') && "
                           "document.querySelector('#jp-main-statusbar').innerText.includes('Idle')", timeout=120_000)

    def run_all():
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_text("Run All Cells", exact=True).click()

    def started() -> bool:
        return any("[*]" in p or p.strip("[]: ").isdigit()
                   for p in page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts())

    for _attempt in range(2):              # nothing started within 30 s: ask once more
        run_all()
        t0 = time.time()
        while not started() and time.time() - t0 < 30:
            time.sleep(0.5)
        if started():
            break
    else:
        pytest.fail(f"{name}: 'Run All Cells' started no cell (twice)")
    # done when every code cell has run: no prompt still empty ("[ ]:") or running ("[*]:"); a busy
    # machine may take a while to start the kernel, so an idle-looking notebook is not yet "done"
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error'], "
                          ".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']:has-text('Traceback')")
    start = time.time()
    while time.time() - start < timeout_s:
        if errors.count():
            pytest.fail(f"{name}: a cell raised in the browser: {errors.first.inner_text()[:800]}")
        prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
        if prompts and not any("[*]" in p or "[ ]" in p for p in prompts):
            break
        time.sleep(1)
    else:
        pytest.fail(f"{name}: cells still running (or never started) after {timeout_s} s; prompts: "
                    f"{[p for p in page.locator('.jp-CodeCell .jp-InputPrompt').all_inner_texts()][:40]}")


def _widget_text(widget) -> str:
    return widget.locator(".widget-output, .jp-OutputArea").first.inner_text()


def _set_slider(widget, label: str, value: int):
    """Type a value into a slider's readout (ipywidgets 8 readouts are editable) and press Enter."""
    box = widget.locator(".widget-slider", has=widget.page.get_by_text(label, exact=True)).first
    readout = box.locator(".widget-readout")
    readout.click()
    readout.press("Control+a")
    readout.type(str(value))
    readout.press("Enter")


def _changed(widget, before: str, timeout_s: int = 60, shows: str = "") -> str:
    """The widget's output once it differs from ``before`` (and holds ``shows``: a slider's events may
    re-render the output with an earlier value first)."""
    start = time.time()
    while time.time() - start < timeout_s:
        now = _widget_text(widget)
        if now != before and now.strip() and shows in now:
            return now
        time.sleep(0.5)
    pytest.fail(f"the widget's output did not change within {timeout_s} s")


@pytest.mark.parametrize("name, slider_values, dropdown", [
    ("01_memory_budget.ipynb", {"seq_len": 4096, "batch": 4}, ("kv_dtype", "fp8")),
    ("07_kv_cache_ab.ipynb", {"seq_len": 8192, "batch": 2}, None),
])
def test_widgets_render_and_respond(lab, browser, name, slider_values, dropdown):
    url, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        _run_all(page, url, token, name)
        assert page.get_by_text("Error displaying widget").count() == 0, f"{name}: a widget failed to render"
        widgets = page.locator(".widget-interact")
        assert widgets.count() >= 1, f"{name}: no interactive widget rendered (text fallback only?)"
        w = widgets.first
        w.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / f"{Path(name).stem}-before.png"))
        text = _widget_text(w)
        for label, value in slider_values.items():
            _set_slider(w, label, value)
            text = _changed(w, text, shows=str(value))
            assert str(value) in text, f"{name}: after setting {label}={value} the output does not show it: {text[:300]}"
        if dropdown:
            label, option = dropdown
            w.locator(".widget-dropdown", has=page.get_by_text(label, exact=True)).locator("select").select_option(option)
            text = _changed(w, text)
        page.screenshot(path=str(SHOTS / f"{Path(name).stem}-after.png"))
    except BaseException:
        page.screenshot(path=str(SHOTS / f"{Path(name).stem}-FAILED.png"))
        raise
    finally:
        page.close()
