"""Replays the notebook's allocator sequences on the real CUDA allocator and in the simulator.

    python benchmarks/allocator_agreement.py [--out results/h200/allocator_agreement.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import allocator_sim as A  # noqa: E402


def sequences():
    return {
        "seed_snippet": (A.seed_snippet(), None, False),
        "fragmenting": (A.fragmenting_sequence(), A.fragmenting_cap(), False),
        "fragmenting_expandable": (A.fragmenting_sequence(), A.fragmenting_cap(), True),
        "empty_cache_limits": (A.empty_cache_sequence(), None, False),
        "small_pool": ([["alloc", f"s{i}", 100_000] for i in range(30)] + [["free", f"s{i}"] for i in range(0, 30, 3)], None, False),
        "mid_sizes": ([["alloc", f"m{i}", (3 + i % 5) * 1024**2] for i in range(12)] + [["free", "m3"], ["free", "m4"], ["alloc", "x", 7 * 1024**2]], None, False),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/h200/allocator_agreement.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("allocator_agreement needs a CUDA device")
    rows = []
    for name, (ops, cap, exp) in sequences().items():
        real = A.run_real(ops, cap, exp)
        sim = A.simulate(ops, cap, exp)
        rows.append({"sequence": name, "cap": cap, "expandable": exp, "real_oom": real["oom"], "sim_oom": sim["oom"],
                     "real_reserved": real["reserved"], "sim_reserved": sim["reserved"],
                     "real_allocated": real["allocated"], "sim_allocated": sim["allocated"],
                     "real_segments": [s["total_size"] for s in real["snapshot"]],
                     "sim_segments": [s["total_size"] for s in sim["snapshot"]]})
        print({k: v for k, v in rows[-1].items() if not k.endswith("segments")}, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
