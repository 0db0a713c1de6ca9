"""safetensors vs a torch pickle: the same state dict loaded both ways, warm and cold, repeated.

    python -m benchmarks.load_formats --out results/cpu/load_formats.json --repeats 7

For each size (``--mib``) a random decoder-shaped state dict (``helpers.loading.demo_state``) is saved
as ``model.safetensors`` and as ``pytorch_model.bin`` (``torch.save``) in a scratch folder of the
course cache, then ``helpers.loading.format_load_times`` loads each — ``safetensors.torch.load_file``,
``torch.load(weights_only=True)`` and ``torch.load(weights_only=True, mmap=True)`` — and touches one
byte of every page of every tensor (``loading.TOUCH``): one untimed load each, then ``--repeats``
timed loads from the warm page cache and ``--repeats`` with the file's pages dropped before each load
(``posix_fadvise(POSIX_FADV_DONTNEED)``, checked with ``mincore``), the formats' order alternating.
Rows: median, min, max, spread ((max - min) / median) and GB/s of the file per format and cache.
The seed document's claim under test: safetensors loads "2-3x" faster than ``.bin``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import safetensors
import torch

from helpers import loading
from helpers.config import cache_dir


def filesystem(path: Path) -> str:
    """The type of the file system holding ``path`` (``/proc/self/mounts``; "unknown" elsewhere)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    path = str(path.resolve())
    best = max((m for m in mounts if path == m[0] or path.startswith(m[0].rstrip("/") + "/")),
               key=lambda m: len(m[0]), default=None)
    return best[1] if best else "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/cpu/load_formats.json")
    ap.add_argument("--repeats", type=int, default=7, help="timed loads per format and cache")
    ap.add_argument("--mib", default="64,512", help="state-dict sizes in MiB, comma-separated")
    ap.add_argument("--layers", type=int, default=30, help="decoder blocks in each state dict (SmolLM2-135M: 30)")
    ap.add_argument("--no-cold", action="store_true", help="warm page cache only")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        meta = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                "threads": torch.get_num_threads(), "torch": torch.__version__,
                "safetensors": safetensors.__version__, "filesystem": filesystem(Path(tmp)),
                "date": time.strftime("%Y-%m-%d"), "command": "python -m benchmarks.load_formats --out "
                f"{args.out} --repeats {args.repeats} --mib {args.mib} --layers {args.layers}"
                + (" --no-cold" if args.no_cold else "")}
        for mib in (float(m) for m in args.mib.split(",")):
            folder = loading.write_both_formats(loading.demo_state(mib, args.layers), Path(tmp) / f"{mib:g}MiB")
            run = {"mib": mib, "layers": args.layers,
                   **loading.format_load_times(folder, repeats=args.repeats, cold=not args.no_cold)}
            runs.append(run)
            for r in run["rows"]:
                print(f"{mib:>6g} MiB {r['format']:<16} {r['cache']}: median {r['median_s'] * 1e3:8.1f} ms "
                      f"[{r['min_s'] * 1e3:.1f}–{r['max_s'] * 1e3:.1f}] {r['GBps']:.2f} GB/s")
            if not run["cold"]["ran"] and run["cold"]["asked"]:
                print("cold cache not measured:", run["cold"].get("why_not"))
            for f in folder.iterdir():
                f.unlink()
    out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
