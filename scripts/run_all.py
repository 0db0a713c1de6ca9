"""Execute every notebook headless into build/: executed copies, run_all.json (wall time, status and
sampled peak GPU memory per notebook, device, versions, and the key numbers: the main tables each
notebook measured; rewritten after each notebook), key_numbers.json and plots/ (every figure, as PNG).

    python scripts/run_all.py [--out build] [--profile full|ci|workshop] [--progress] [notebooks...]
    COURSE_GPU_GIB=15 python scripts/run_all.py --out build-t4     # as on a 16 GB T4 (15 GiB usable)

Several GPUs: run a share of the notebooks on each (``CUDA_VISIBLE_DEVICES=k``, its own ``--out``),
then merge the parts into one report (same profile, device, versions and card required):

    python scripts/run_all.py --merge --out build-all build-gpu0 build-gpu1 [--note key=text ...]
        [--supersede]              # a notebook in several parts: the last part's run counts
        [--attach t4_sized=DIR]    # embed another (merged) report, e.g. the T4-sized run
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from traitlets.config import Config

ROOT = Path(__file__).resolve().parent.parent


def headless_client(nb, **kwargs) -> NotebookClient:
    """nbclient's ``NotebookClient`` for ``nb``, without its front-end for the Output widget.

    That front-end (``nbclient.output_widget.OutputWidget``) sends each captured output back to the
    kernel on the shell socket while the client awaits the cell's reply on the same socket. On a busy
    machine that await can miss the reply and hang until the cell timeout, with the kernel idle
    (jupyter/nbclient#312; here: notebook 07's widget cell, in one of six CI-like runs on two workers
    and two cores). Without it, what an Output widget captures, such as the text ``interactive_output``
    prints, stays in the cell's own outputs, where the output and prose checks read it. The widgets'
    state is still stored.

    Its kernel talks to it over Unix sockets in a folder of its own (jupyter_client's ``ipc`` transport) where
    the system has them, not over TCP ports: jupyter_client picks a free port before the kernel binds it, and a
    kernel started at the same moment as another can find it taken — seen in a CI run as ``Address already in
    use`` and "Kernel died before replying to kernel_info" (two workshop participants started together). A
    ``config`` of the caller's that sets the kernel's transport, a ``km`` of its own, or a socket path too long
    for the system (a long ``TMPDIR``) keep TCP.
    """
    config = Config(kwargs.pop("config", None) or {})
    sockets = None
    if os.name == "posix" and "km" not in kwargs and "transport" not in config.KernelManager:
        sockets = tempfile.mkdtemp(prefix="course-kernel-")
        ip = os.path.join(sockets, "kernel")
        if len(os.fsencode(ip)) + 4 <= 100:      # ip-N must fit a Unix socket address (104-108 bytes)
            config.KernelManager.transport, config.KernelManager.ip = "ipc", ip
        else:
            shutil.rmtree(sockets, ignore_errors=True)
            sockets = None
    client = NotebookClient(nb, config=config, **kwargs)
    if sockets is not None:   # the folder goes with the client (jupyter_client removes the sockets at shutdown)
        weakref.finalize(client, shutil.rmtree, sockets, ignore_errors=True)
    client.comm_open_handlers["jupyter.widget"] = lambda msg: None   # no comm object: nothing sent back
    return client


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "build"))
    ap.add_argument("--profile", default=os.environ.get("COURSE_PROFILE", "full"))
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--merge", action="store_true", help="merge the run folders given as arguments into --out")
    ap.add_argument("--note", action="append", default=[], help="key=text added to the merged report")
    ap.add_argument("--supersede", action="store_true", help="merge: a later part's run of a notebook replaces an earlier one")
    ap.add_argument("--attach", action="append", default=[], help="merge: name=DIR embeds DIR/run_all.json under name")
    ap.add_argument("--progress", action="store_true", help="one progress bar over every code cell")
    ap.add_argument("notebooks", nargs="*")
    args = ap.parse_args()
    if args.merge:
        notes = dict(n.split("=", 1) for n in args.note)
        for name, folder in (a.split("=", 1) for a in args.attach):
            notes[name] = json.loads((Path(folder) / "run_all.json").read_text())
        merge([Path(p) for p in args.notebooks], Path(args.out), notes, supersede=args.supersede)
        return
    nbs = [Path(n) for n in args.notebooks] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    rows = run(nbs, Path(args.out), args.profile, args.timeout, progress=args.progress)
    raise SystemExit(0 if all(r["ok"] for r in rows) else 1)


def run(nbs: list[Path], out: Path, profile: str, timeout: int = 3600, progress: bool = False) -> list[dict]:
    """Execute ``nbs`` in order under ``profile`` into ``out`` (executed copies, plots, run_all.json);
    ``progress`` draws one bar over all their code cells. Returns the per-notebook rows."""
    os.environ["COURSE_PROFILE"] = profile
    out.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_REPORT"] = str((out / "key_numbers.json").resolve())  # helpers.report writes here
    (out / "key_numbers.json").unlink(missing_ok=True)
    # versions and device from a child process: no CUDA context in this one while notebooks measure memory
    probe = ("import json, torch, transformers; print(json.dumps({'device': torch.cuda.get_device_name() "
             "if torch.cuda.is_available() else 'cpu', 'torch': torch.__version__, 'transformers': transformers.__version__}))")
    env = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    report = {"profile": profile, **env, "card_gib": os.environ.get("COURSE_GPU_GIB") or None,
              "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "notebooks": []}
    rows = report["notebooks"]
    books = [(p, nbformat.read(p, as_version=4)) for p in nbs]
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=sum(c.cell_type == "code" for _, nb in books for c in nb.cells), unit="cell")
    for nb_path, nb in books:
        peak = GpuPeak()
        t0, ok, err = time.perf_counter(), True, None
        client = headless_client(nb, timeout=timeout, kernel_name="python3",
                                 resources={"metadata": {"path": str(nb_path.parent)}})
        if bar is not None:
            bar.set_description(nb_path.stem)
            client.on_cell_executed = lambda **kw: bar.update(1)
        try:
            client.execute()
        except Exception as e:  # keep going: the report says which notebook failed and why
            ok, err = False, str(e).splitlines()[-1][:300] if str(e) else type(e).__name__
        secs = time.perf_counter() - t0
        peak_mib = peak.stop()
        nbformat.write(nb, out / nb_path.name)
        save_plots(nb, out / "plots", nb_path.stem)
        rows.append({"name": nb_path.name, "seconds": round(secs, 1), "ok": ok, "error": err, "peak_gpu_mib": peak_mib,
                     "slowest_cells": slowest_cells(nb)})
        kn = out / "key_numbers.json"
        report["key_numbers"] = json.loads(kn.read_text()) if kn.exists() else {}
        (out / "run_all.json").write_text(json.dumps(report, indent=1))
        (bar.write if bar is not None else print)(f"{nb_path.name:<36} {'ok ' if ok else 'FAIL'} {secs:7.1f} s")
    if bar is not None:
        bar.close()
    return rows


SAME = ("profile", "device", "torch", "transformers", "card_gib")  # what parts of one report must share


def merge(parts: list[Path], out: Path, notes: dict | None = None, supersede: bool = False) -> dict:
    """One report from run folders that ran different notebooks (e.g. one per GPU): notebook rows
    sorted by name, each tagged with its part; key numbers, executed copies and plots gathered.
    Refuses parts that differ in profile, device, versions or emulated card. A notebook run in two
    parts is refused too, unless ``supersede``: then the later part's run counts and the earlier
    row is kept under the new row's ``earlier``. A part may itself be a merged report (a
    ``reference_run.json`` copied into a folder as ``run_all.json``): its rows keep their own parts, and
    its dates and parts join the new report's."""
    if not parts:
        raise ValueError("merge needs at least one run folder")
    if any(Path(p).resolve() == Path(out).resolve() for p in parts):
        raise ValueError(f"--out {out} is one of the parts: merge into a new folder (it replaces the parts' plots)")
    runs = []
    for p in parts:
        f = Path(p) / "run_all.json"
        if not f.exists():
            raise FileNotFoundError(f"{f} not found: not a run_all.py output folder")
        runs.append(json.loads(f.read_text()))
    for key in SAME:
        values = {json.dumps(r.get(key)) for r in runs}
        if len(values) > 1:
            raise ValueError(f"cannot merge runs with different {key!r}: {sorted(values)}")
    merged = {k: v for k, v in runs[0].items() if k not in ("notebooks", "key_numbers", "date")}
    merged["dates"] = sorted({d for r in runs for d in (r.get("dates") or [r.get("date")]) if d})
    merged["parts"] = [q for p, r in zip(parts, runs) for q in (r.get("parts") or [Path(p).name])]
    merged.update(notes or {})
    rows, numbers = [], {}
    for p, r in zip(parts, runs):
        for row in r["notebooks"]:
            row = {**row, "part": row["part"] if r.get("parts") and row.get("part") else Path(p).name}
            old = next((x for x in rows if x["name"] == row["name"]), None)
            if old is not None:
                if not supersede:
                    raise ValueError(f"{row['name']} appears in more than one part; keep one run of each "
                                     "notebook, or pass supersede to let the later part's run count")
                rows.remove(old)
                row["earlier"] = old.pop("earlier", []) + [old] + row.get("earlier", [])
            rows.append(row)
        kn = r.get("key_numbers")
        if kn is None and (Path(p) / "key_numbers.json").exists():
            kn = json.loads((Path(p) / "key_numbers.json").read_text())
        numbers.update(kn or {})
    merged["notebooks"] = sorted(rows, key=lambda x: x["name"])
    merged["key_numbers"] = dict(sorted(numbers.items()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)
    for p, r in zip(parts, runs):   # only what each part's report ran (a folder may hold older copies)
        for name in (row["name"] for row in r["notebooks"]):   # a later part's run replaces an earlier one's
            stem = Path(name).stem
            for old in (out / "plots").glob(f"{stem}_cell*.png"):
                old.unlink()
            if (Path(p) / name).exists():
                shutil.copy2(Path(p) / name, out / name)
            for png in (Path(p) / "plots").glob(f"{stem}_cell*.png"):
                shutil.copy2(png, out / "plots" / png.name)
    (out / "run_all.json").write_text(json.dumps(merged, indent=1))
    return merged


class GpuPeak:
    """The driver's peak used memory (MiB) of this run's GPU while a notebook runs, by polling
    ``nvidia-smi`` (it counts CUDA contexts too, as a card's limit does); None without a GPU."""

    def __init__(self, interval: float = 0.2):
        import shutil
        import threading

        gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        self.cmd = ["nvidia-smi", "-i", gpu, "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        self.peak, self.done = None, threading.Event()
        self.thread = threading.Thread(target=self._poll, args=(interval,), daemon=True)
        if shutil.which("nvidia-smi"):
            self.thread.start()

    def _poll(self, interval):
        while not self.done.is_set():
            r = subprocess.run(self.cmd, capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.strip().isdigit():
                self.peak = max(self.peak or 0, int(r.stdout.strip()))
            self.done.wait(interval)

    def stop(self):
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()
        return self.peak


def cell_seconds(cell) -> float | None:
    """A code cell's run time from the timestamps nbclient records (``execute_input`` to
    ``execute_reply``); None for a cell that did not run."""
    from datetime import datetime

    t = cell.get("metadata", {}).get("execution", {})
    start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
    if not (start and end):
        return None
    return (datetime.fromisoformat(end.replace("Z", "+00:00")) - datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()


def slowest_cells(nb, n: int = 5) -> list[dict]:
    """The ``n`` longest code cells of an executed notebook: index, seconds and first source line —
    where a learner waits."""
    rows = [{"cell": k, "seconds": round(s, 1), "source": cell.source.strip().splitlines()[0][:80] if cell.source.strip() else ""}
            for k, cell in enumerate(nb.cells) if cell.cell_type == "code" and (s := cell_seconds(cell)) is not None]
    return sorted(rows, key=lambda r: -r["seconds"])[:n]


def save_plots(nb, folder: Path, stem: str) -> None:
    """Every PNG output of an executed notebook as ``<stem>_cell<k>[_<j>].png``; the notebook's plots of an
    earlier run in ``folder`` are removed first (a cell that no longer plots, or a run that failed early,
    leaves none of them behind)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{stem}_cell*.png"):
        old.unlink()
    for k, cell in enumerate(nb.cells):
        pngs = [o["data"]["image/png"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        for j, png in enumerate(pngs):
            (folder / f"{stem}_cell{k}{f'_{j}' if len(pngs) > 1 else ''}.png").write_bytes(base64.b64decode(png))


if __name__ == "__main__":
    main()
