"""What a notebook's first cell waits for: importing the course's modules, and where that time goes.

    python -m benchmarks.import_time --out results/cpu/import_time.json [--runs 3]

Each statement of :data:`STATEMENTS` runs in a fresh interpreter, as in a new notebook kernel, ``--runs``
times; its row holds each run's wall seconds (the parent's clock around the child process, interpreter
start included). The first run of a statement on a machine that just started reads its files from disk;
the later ones from the page cache. The notebooks' own import line is also run under ``python -X
importtime`` (CPython's per-module import timer: self and cumulative microseconds, nested by
indentation), whose slowest modules, cumulative and self, are listed with the chain of imports that
reached each one. A cumulative time counts what a module's imports would cost anyway (``torch._dynamo``
under ``hqq``, though other modules import it too): what removing a module saves is the difference of
two statements' wall times, as the hqq-hidden statement measures. Where CUDA exists, a statement times
the first CUDA call after ``import torch``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_IMPORTS = "from helpers import config, device, envcheck, models, data"   # notebook 00's first cell
STATEMENTS = {
    "python": "pass",
    "torch": "import torch",
    "transformers": "import torch, transformers",
    "transformers' model classes": "import transformers.models.auto.auto_factory",
    "notebook 00's imports": NOTEBOOK_IMPORTS,
    # the same with hqq hidden from transformers (only in this child process: transformers imports hqq,
    # notebook 07's int4-hqq cache, whenever it is installed): what that optional package costs every kernel
    "notebook 00's imports, hqq hidden": "import importlib.util as u; f = u.find_spec; "
                                         "u.find_spec = lambda name, package=None: None if name.split('.')[0] == 'hqq' "
                                         "else f(name, package); "
                                         + NOTEBOOK_IMPORTS,
}
CUDA_STATEMENT = "import time, torch; t = time.perf_counter(); torch.zeros(1, device='cuda'); " \
                 "print('cuda_init_s', time.perf_counter() - t)"


def parse_importtime(text: str) -> list[dict]:
    """The rows of ``python -X importtime``'s report (its stderr): ``module``, ``self_us``, ``cumulative_us``,
    ``depth`` (its nesting: 0 for what the statement imported itself), in the report's order — each
    module after the modules it imported. Lines that are not report rows are skipped."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3:
            continue
        try:
            self_us, cum_us = int(parts[0]), int(parts[1])
        except ValueError:
            continue
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        rows.append({"module": name.strip(), "self_us": self_us, "cumulative_us": cum_us, "depth": max(depth, 0)})
    return rows


def chains(rows: list[dict]) -> list[list[str]]:
    """For each row of :func:`parse_importtime`, the modules that imported it, outermost first. The report
    lists a module after everything it imported (post-order), so read backwards it lists each module
    before its imports: the path of modules seen at depths 0 … d−1 is then the chain of a row at depth d."""
    out: list[list[str]] = [[] for _ in rows]
    path: list[str] = []
    for i in range(len(rows) - 1, -1, -1):
        d = rows[i]["depth"]
        out[i] = path[:d]
        path = path[:d] + [rows[i]["module"]]
    return out


def slowest(rows: list[dict], key: str, n: int = 12) -> list[dict]:
    """The ``n`` rows with the largest ``key`` (``self_us`` or ``cumulative_us``), each with ``via``: the
    chain of imports that reached it."""
    if key not in ("self_us", "cumulative_us"):
        raise ValueError(f"key must be 'self_us' or 'cumulative_us', got {key!r}")
    via = chains(rows)
    order = sorted(range(len(rows)), key=lambda i: -rows[i][key])[:n]
    return [{**rows[i], "via": " > ".join(via[i])} for i in order]


def run_statement(statement: str, runs: int, importtime: bool = False, env: dict | None = None) -> dict:
    """Wall seconds of ``python -c statement`` in ``runs`` fresh interpreters (from the repository root);
    with ``importtime`` the last run under ``-X importtime``, its report parsed. Raises, naming the
    statement and its error, when a run fails."""
    if runs < 1:
        raise ValueError(f"runs must be ≥ 1, got {runs}")
    seconds, report, stdout = [], "", ""
    for i in range(runs):
        cmd = [sys.executable] + (["-X", "importtime"] if importtime and i == runs - 1 else []) + ["-c", statement]
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        seconds.append(time.perf_counter() - t)
        if p.returncode:
            raise RuntimeError(f"`python -c {statement!r}` failed (exit {p.returncode}): {p.stderr.strip()[-600:]}")
        report, stdout = p.stderr, p.stdout
    out = {"statement": statement, "seconds": seconds, "stdout": stdout.strip()[-300:]}
    if importtime:
        out["report"] = parse_importtime(report)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.import_time")
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    import platform

    import torch

    from helpers.config import write_json
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = {"python": platform.python_version(), "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "cuda": torch.cuda.is_available(), "runs": args.runs,
              "commit": os.environ.get("COURSE_COMMIT"), "statements": {}}
    for label, statement in STATEMENTS.items():
        r = run_statement(statement, args.runs, importtime=statement == NOTEBOOK_IMPORTS, env=env)
        if "report" in r:
            rep = r.pop("report")
            result["slowest_cumulative"] = slowest(rep, "cumulative_us", args.top)
            result["slowest_self"] = slowest(rep, "self_us", args.top)
            result["modules"] = len(rep)
        result["statements"][label] = r
        write_json(Path(args.out), result, indent=1)          # as it goes: a part cut short keeps its rows
        print(f"{label:28s} " + " ".join(f"{s:6.2f}" for s in r["seconds"]) + " s", flush=True)
    if torch.cuda.is_available():
        r = run_statement(CUDA_STATEMENT, args.runs, env=env)
        r["cuda_init_s"] = float(r["stdout"].split()[-1])
        result["statements"]["first CUDA call after import torch"] = r
        print(f"first CUDA call: {r['cuda_init_s']:.2f} s", flush=True)
    for row in result.get("slowest_cumulative", [])[:8]:
        print(f"  {row['cumulative_us'] / 1e6:6.2f} s  {row['module']:40s} via {row['via'][:80]}")
    write_json(Path(args.out), result, indent=1)
    print("wrote", args.out)
    return result


if __name__ == "__main__":
    main()
