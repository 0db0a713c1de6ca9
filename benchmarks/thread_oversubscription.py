"""Two torch processes on one machine's cores: what each one's OpenMP threads cost the other.

    python -m benchmarks.thread_oversubscription --out results/cpu/thread_oversubscription.json

The same loop of small matmuls (``--size`` × ``--size``, ``--iters`` times) is timed alone and as
two processes started together, with torch's default threads (one per core), with
``OMP_WAIT_POLICY=PASSIVE`` and with ``OMP_NUM_THREADS=1``. This is why CI does not run its tests on
two pytest-xdist workers on a 2-core machine (README, "Tests"): two processes that each use every
core can make each other's small ops several times slower, because OpenMP's idle threads spin
(GNU libgomp's ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

LOOP = ("import sys, time, torch\n"
        "n, iters = int(sys.argv[1]), int(sys.argv[2])\n"
        "a = torch.randn(n, n)\n"
        "(a @ a).sum()\n"
        "t = time.perf_counter()\n"
        "for _ in range(iters): (a @ a).sum()\n"
        "print(time.perf_counter() - t)\n")
SETTINGS = {"default threads": {}, "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
            "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"}}


def timed(n_procs: int, env_extra: dict, size: int, iters: int) -> list[float]:
    """Seconds of the loop in each of ``n_procs`` processes started together."""
    env = {**os.environ, **env_extra}
    procs = [subprocess.Popen([sys.executable, "-c", LOOP, str(size), str(iters)], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(n_procs)]
    return [float(p.communicate()[0]) for p in procs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/cpu/thread_oversubscription.json")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--iters", type=int, default=4000)
    args = ap.parse_args()
    rows = []
    for name, env in SETTINGS.items():
        alone = timed(1, env, args.size, args.iters)[0]
        pair = timed(2, env, args.size, args.iters)
        rows.append({"setting": name, "alone_s": alone, "pair_s": pair, "pair_over_alone": max(pair) / alone})
        print(rows[-1], flush=True)
    import torch
    out = {"meta": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
                    "size": args.size, "iters": args.iters,
                    "reference": "default threads, alone"}, "rows": rows}
    base = rows[0]["alone_s"]
    for r in rows:
        r["pair_over_default_alone"] = max(r["pair_s"]) / base
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
