"""The workshop rehearsed on one GPU: N participants' notebook runs, started together, each under its cap.

    COURSE_CACHE=/srv/course-cache python scripts/prebuild.py        # first: the shared cache (docs/workshop.md)
    COURSE_CACHE=/srv/course-cache python scripts/workshop_run.py --participants 4 --cap-gib 15 --out build/workshop

Each participant is one ``scripts/run_all.py --profile workshop`` process (a kernel per notebook, its own
folder ``p<k>/`` with the executed copies), with ``COURSE_GPU_CAP_GIB`` as docs/workshop.md sets it and
the shared ``COURSE_CACHE``. All start at once and run the notebooks in order — a room pressing "run
all" at the same moment, the worst case for the card. Writes ``workshop.json``: per participant and
notebook the seconds, ``ok`` and the error (``oom`` when it was an out-of-memory error); the device's
peak used memory sampled by nvidia-smi over the whole run (every process); and the agenda check — per
notebook the slowest participant's seconds, their sum, and its share of the session (``--hours``,
default 3: the course's target is ≤ 30 %, the rest is teaching).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = [f"{n}.ipynb" for n in ("00_setup", "01_memory_budget", "02_allocator_fragmentation",
                                    "03_quantization_basics", "04_gptq", "05_awq", "06_perplexity",
                                    "07_kv_cache_ab", "08_quantized_inference", "09_clinic")]
SHARE_TARGET = 0.30   # of the session's time spent waiting for cells (docs/workshop.md)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def is_oom(error: str | None) -> bool:
    """Whether a notebook's recorded error (run_all.json's last line of it) is an out-of-memory error."""
    return bool(error) and ("OutOfMemoryError" in error or "out of memory" in error.lower())


def summarize(runs: dict[str, list[dict]], hours: float, names: list[str] | None = None) -> dict:
    """Per notebook (``names``, default: the longest report's), over the participants' rows (``runs``:
    participant → run_all.json rows): the slowest seconds, how many finished, which ran out of memory;
    the series' sum of the slowest and its share of ``hours``. A participant without a row for a
    notebook (its run stopped before) has not finished it."""
    names = names or [r["name"] for r in max(runs.values(), key=len)]
    per_nb = []
    for name in names:
        rows = {p: next((r for r in rows if r["name"] == name), None) for p, rows in runs.items()}
        done = {p: r for p, r in rows.items() if r is not None}
        per_nb.append({"name": name, "slowest_s": max((r["seconds"] for r in done.values()), default=None),
                       "ok": sum(bool(r["ok"]) for r in done.values()), "of": len(runs),
                       "oom": sorted(p for p, r in done.items() if is_oom(r.get("error"))),
                       "failed": sorted(p for p, r in done.items() if not r["ok"] and not is_oom(r.get("error")))})
    total = sum(r["slowest_s"] or 0 for r in per_nb)
    return {"notebooks": per_nb, "series_s": round(total, 1), "session_s": hours * 3600,
            "share": round(total / (hours * 3600), 3), "share_target": SHARE_TARGET,
            "everyone_finished": all(r["ok"] == r["of"] for r in per_nb)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--participants", type=int, default=4)
    ap.add_argument("--cap-gib", type=float, default=15.0, help="COURSE_GPU_CAP_GIB of every participant")
    ap.add_argument("--hours", type=float, default=3.0, help="the session's length, for the agenda check")
    ap.add_argument("--out", default=str(ROOT / "build" / "workshop"))
    ap.add_argument("--time-limit-s", type=float, default=None,
                    help="stop every participant after this many seconds and report what had finished")
    ap.add_argument("--skip-cache-check", action="store_true",
                    help="start without the prebuilt variants (participants then quantize themselves)")
    ap.add_argument("notebooks", nargs="*", help=f"default: {NOTEBOOKS[0]} … {NOTEBOOKS[-1]} in notebooks/")
    args = ap.parse_args(argv)
    if args.participants < 1:
        ap.error(f"--participants must be ≥ 1, got {args.participants}")
    if not args.cap_gib > 0:
        ap.error(f"--cap-gib must be > 0 GiB, got {args.cap_gib}")
    if not args.hours > 0:
        ap.error(f"--hours must be > 0, got {args.hours}")
    if args.time_limit_s is not None and not args.time_limit_s > 0:
        ap.error(f"--time-limit-s must be > 0 seconds, got {args.time_limit_s}")
    books = [Path(n) for n in args.notebooks] or [ROOT / "notebooks" / n for n in NOTEBOOKS]
    missing = [str(b) for b in books if not b.exists()]
    if missing:
        ap.error(f"notebooks not found: {missing} (paired .ipynb files: jupytext --sync notebooks/*.py)")
    prebuild, run_all = _script("prebuild"), _script("run_all")
    if not args.skip_cache_check and not prebuild.stored_variants("workshop"):
        print(f"the cache {prebuild.cache_root()} holds no workshop variants: run `python scripts/prebuild.py` "
              "with the same COURSE_CACHE first (or pass --skip-cache-check)")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COURSE_PROFILE": "workshop", "COURSE_GPU_CAP_GIB": f"{args.cap_gib:g}"}
    peak = run_all.GpuPeak()
    t0 = time.perf_counter()
    procs, tmps = {}, []
    for k in range(args.participants):
        log = open(out / f"p{k}.log", "w")
        tmps.append(tempfile.mkdtemp(prefix=f"course-p{k}-"))   # its TMPDIR (its kernels' sockets), removed after
        procs[f"p{k}"] = (subprocess.Popen([sys.executable, str(ROOT / "scripts" / "run_all.py"), "--profile", "workshop",
                                            "--out", str(out / f"p{k}"), *map(str, books)],
                                           env={**env, "TMPDIR": tmps[-1]}, stdout=log, stderr=subprocess.STDOUT,
                                           cwd=ROOT, start_new_session=True), log)
    stopped = []
    for name, (proc, log) in procs.items():
        left = None if args.time_limit_s is None else max(0.0, args.time_limit_s - (time.perf_counter() - t0))
        try:
            proc.wait(timeout=left)
        except subprocess.TimeoutExpired:   # the notebook it was in has no row: not finished
            os.killpg(proc.pid, signal.SIGKILL)   # run_all.py and its notebook's kernel
            proc.wait()
            stopped.append(name)
        log.close()
    wall = time.perf_counter() - t0
    for tmp in tmps:   # a participant stopped at the limit (SIGKILL) leaves what its kernels had open there
        shutil.rmtree(tmp, ignore_errors=True)
    if stopped:
        print(f"stopped at the time limit ({args.time_limit_s:g} s): {stopped}")
    runs = {}
    for p in procs:
        f = out / p / "run_all.json"
        runs[p] = json.loads(f.read_text())["notebooks"] if f.exists() else []
    if not any(runs.values()):
        print(f"no participant wrote a report: see {out}/p0.log")
        return 1
    report = {"participants": args.participants, "cap_gib": args.cap_gib, "date": time.strftime("%Y-%m-%d"),
              "wall_s": round(wall, 1), "device_peak_mib": peak.stop(), "stopped_at_limit": stopped,
              **summarize(runs, args.hours, [b.name for b in books]), "runs": runs}
    (out / "workshop.json").write_text(json.dumps(report, indent=1))
    for r in report["notebooks"]:
        note = (f"  out of memory: {r['oom']}" if r["oom"] else "") + (f"  failed: {r['failed']}" if r["failed"] else "")
        slowest = "      —" if r["slowest_s"] is None else f"{r['slowest_s']:7.1f}"
        print(f"{r['name']:<36} slowest {slowest} s  finished {r['ok']}/{r['of']}{note}")
    print(f"series {report['series_s']:.0f} s = {report['share']:.0%} of a {args.hours:g}-hour session "
          f"(target ≤ {SHARE_TARGET:.0%}); wall {wall:.0f} s; device peak {report['device_peak_mib']} MiB")
    return 0 if report["everyone_finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
