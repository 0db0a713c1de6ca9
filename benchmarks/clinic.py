"""Notebook 09's GPU measurements, recorded: the real OOMs diagnosed alone on the card and beside
another process, and what MPS changes for two processes on one GPU (CUDA only).

    python -m benchmarks.clinic --out results/h200/clinic.json [--holder-gib 8] [--mps]

``scenarios``: :func:`helpers.clinic.real_oom_scenarios` (load, prefill, decode, fragmentation) and
:func:`helpers.clinic.device_full_scenario`, run twice — alone, and while a second process holds
``--holder-gib`` GiB of the same card — one row each (``scenario``, ``oom``, ``verdict``, ``expected``,
``ok``, ``process_bytes``, ``others_bytes``, ``source``, ``run``). ``--mps``: two spinners
(:mod:`helpers.gpu_share` ``spin``) alone, together, and together under an MPS daemon of our own
(private pipe directory; stopped at the end), or the reason MPS could not start.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from helpers import clinic, device, gpu_share, measure, models


def scenario_rows(holder_gib: float | None) -> list[dict]:
    model = models.model_from_config("SmolLM2-135M", device="cuda", dtype=torch.bfloat16)
    run = "alone on the card" if holder_gib is None else f"beside another process holding {holder_gib:g} GiB"
    if holder_gib is None:
        rows = clinic.diagnose_real_ooms(clinic.real_oom_scenarios(model) + [clinic.device_full_scenario()])
    else:
        with clinic.other_process(holder_gib):
            rows = clinic.diagnose_real_ooms(clinic.real_oom_scenarios(model) + [clinic.device_full_scenario()])
    del model
    measure.free_memory()
    return [{**r, "run": run} for r in rows]


def _spinners(n: int, extra_env: dict | None = None, kernels: int = 500) -> list[dict]:
    """``n`` spinners started together: each reports ``ready`` once its CUDA context is up, then all
    are told to go at once, so their kernel streams overlap (process start-up takes seconds)."""
    argv, env = gpu_share.command("spin", "--kernels", kernels, "--wait")
    env.update(extra_env or {})
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(n)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a spinner did not start: {p.stderr.read()[-400:]}")
    t0 = time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        o, e = p.communicate(timeout=300)
        out.append(gpu_share.last_json(o) or {"error": e[-400:]})
    wall = time.perf_counter() - t0
    return [{**r, "wall_seconds": wall} for r in out]


def mps_rows() -> list[dict]:
    rows = [{"setting": "one spinner, no MPS", "procs": _spinners(1)},
            {"setting": "two spinners at once, no MPS", "procs": _spinners(2)}]
    ctl = shutil.which("nvidia-cuda-mps-control")
    if ctl is None:
        return rows + [{"setting": "MPS", "error": "nvidia-cuda-mps-control is not on this machine's PATH"}]
    tmp = Path(tempfile.mkdtemp(prefix="mps-"))
    mps = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp / "log")}
    menv = {**os.environ, **mps}
    (tmp / "pipe").mkdir()
    (tmp / "log").mkdir()
    start = subprocess.run([ctl, "-d"], env=menv, capture_output=True, text=True)
    if start.returncode:
        return rows + [{"setting": "MPS", "error": f"the daemon did not start: {start.stderr[-300:]}"}]
    try:
        rows.append({"setting": "two spinners at once, under MPS", "procs": _spinners(2, mps)})
    finally:
        subprocess.run([ctl], input="quit\n", env=menv, capture_output=True, text=True)
        log = (tmp / "log" / "control.log")
        rows[-1]["control_log_tail"] = log.read_text()[-600:] if log.exists() else None
    return rows


def main():
    ap = argparse.ArgumentParser(prog="python -m benchmarks.clinic")
    ap.add_argument("--out", required=True)
    ap.add_argument("--holder-gib", type=float, default=8.0)
    ap.add_argument("--mps", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/clinic.py measures real OOMs on a CUDA device; there is none here")
    out = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "total_bytes": torch.cuda.get_device_properties(0).total_memory,
                    "process_memory_source": device.process_memory().source,
                    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}, "rows": []}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    for holder in (None, args.holder_gib):
        out["rows"] += scenario_rows(holder)
        path.write_text(json.dumps(out, indent=1))
        for r in out["rows"][-5:]:
            print(f"{r['run'][:28]:28s} {r['scenario'][:48]:48s} oom={r['oom']!s:5} {r['verdict']!s:14} "
                  f"expected {r['expected']:14} {'ok' if r['ok'] else 'WRONG'}", flush=True)
    if args.mps:
        out["mps"] = mps_rows()
        path.write_text(json.dumps(out, indent=1))
        for r in out["mps"]:
            print(r["setting"], [round(p.get("seconds", -1), 3) for p in r.get("procs", [])], r.get("error", ""))
    print("wrote", path)


if __name__ == "__main__":
    main()
