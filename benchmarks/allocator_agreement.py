"""Replays allocator sequences on the real CUDA allocator and in the simulator: the notebook's own, and
``--random N`` seeded random workloads per mode (``allocator_ops.random_sequence``: small, mid and large
sizes, frees in random order, caps 0.7–1.4 × the peak of live bytes), in the default and the
``expandable_segments`` mode. Every row has ``mode``; a sequence agrees when the OOM outcome, the
failing op, reserved and allocated bytes are the same. Target (issue 16): 100 % of default-mode and
≥ 95 % of expandable-mode sequences.

    python -m benchmarks.allocator_agreement [--random 40] [--out results/h200/allocator_agreement.json]
    python -m benchmarks.allocator_agreement --random 40 --seed-start 40 --out results/h200/allocator_agreement_heldout.json
    python -m benchmarks.allocator_agreement --resimulate   # no GPU: the sim columns of a recorded run
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch

from helpers import allocator_ops, allocator_replay, allocator_sim
from helpers.config import write_json


def sequences():
    return {
        "seed_snippet": (allocator_ops.seed_snippet(), None, False),
        "fragmenting": (allocator_ops.fragmenting_sequence(), allocator_ops.fragmenting_cap(), False),
        "fragmenting_expandable": (allocator_ops.fragmenting_sequence(), allocator_ops.fragmenting_cap(), True),
        "empty_cache_limits": (allocator_ops.empty_cache_sequence(), None, False),
        "small_pool": ([["alloc", f"s{i}", 100_000] for i in range(30)] + [["free", f"s{i}"] for i in range(0, 30, 3)], None, False),
        "mid_sizes": ([["alloc", f"m{i}", (3 + i % 5) * 1024**2] for i in range(12)] + [["free", "m3"], ["free", "m4"], ["alloc", "x", 7 * 1024**2]], None, False),
    }


def random_sequences(n: int, start: int = 0):
    out = {}
    for seed in range(start, start + n):
        ops, cap = allocator_ops.random_sequence(seed)
        for exp in (False, True):
            out[f"random_{seed}" + ("_expandable" if exp else "")] = (ops, cap, exp)
    return out


def agrees(r: dict) -> bool:
    return (r["real_oom"] == r["sim_oom"] and r["real_failed_at"] == r["sim_failed_at"]
            and r["real_reserved"] == r["sim_reserved"] and r["real_allocated"] == r["sim_allocated"])


def compare(name, ops, cap, exp) -> dict:
    """One sequence on the real allocator (a fresh process) and in the simulator."""
    real = allocator_replay.run_real(ops, cap, exp)
    row = {"sequence": name, "mode": "expandable" if exp else "default", "cap": cap, "expandable": exp,
           "real_oom": real["oom"], "real_failed_at": real["failed_at"], "real_reserved": real["reserved"],
           "real_allocated": real["allocated"], "real_segments": [s["total_size"] for s in real["snapshot"]]}
    return simulated(row, ops)


def simulated(row: dict, ops: list) -> dict:
    """``row`` with the simulator's side (re)computed for its sequence: ``sim_*`` keys and ``agree``."""
    sim = allocator_sim.simulate(ops, row["cap"], row["expandable"])
    row.update(sim_oom=sim["oom"], sim_failed_at=sim["failed_at"], sim_reserved=sim["reserved"],
               sim_allocated=sim["allocated"], sim_segments=[s["total_size"] for s in sim["snapshot"]])
    row["agree"] = agrees(row)
    return row


def ops_of(name: str) -> list:
    """The op sequence a row's name stands for: one of :func:`sequences`, or ``random_<seed>[_expandable]``."""
    fixed = sequences()
    if name in fixed:
        return fixed[name][0]
    m = re.fullmatch(r"random_(\d+)(_expandable)?", name)
    if not m:
        raise SystemExit(f"sequence {name!r} is not one this script generates")
    return allocator_ops.random_sequence(int(m.group(1)))[0]


def resimulate(path: Path) -> list:
    """Recompute the simulator's columns of a recorded run (no GPU): the real columns are measurements
    and stay; the sim columns follow the current simulator."""
    rows = json.loads(path.read_text())
    for r in rows:
        simulated(r, ops_of(r["sequence"]))
    return rows


def report(rows: list) -> None:
    for mode in ("default", "expandable"):
        mine = [r for r in rows if r["mode"] == mode]
        print(f"{mode}: {sum(r['agree'] for r in mine)}/{len(mine)} sequences agree", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/h200/allocator_agreement.json")
    ap.add_argument("--random", type=int, default=40, help="seeded random sequences per mode")
    ap.add_argument("--seed-start", type=int, default=0,
                    help="first seed (e.g. 40: sequences the simulator was never compared on)")
    ap.add_argument("--workers", type=int, default=8,
                    help="sequences replayed at once, each in its own process (each has its own allocator and cap)")
    ap.add_argument("--resimulate", action="store_true",
                    help="no GPU: recompute the simulator's columns of --out from its recorded real runs")
    args = ap.parse_args()
    if args.resimulate:
        rows = resimulate(Path(args.out))
        Path(args.out).write_text(json.dumps(rows, indent=1))
        report(rows)
        print("re-simulated", args.out)
        return
    if not torch.cuda.is_available():
        sys.exit("allocator_agreement needs a CUDA device")
    todo = {**sequences(), **random_sequences(args.random, args.seed_start)}
    out, rows = Path(args.out), {}
    out.parent.mkdir(parents=True, exist_ok=True)
    # a fresh process per sequence (clean allocator, the mode set before CUDA starts), several at a
    # time: processes do not share a caching allocator, and the caps are far below the card's memory
    with ThreadPoolExecutor(args.workers) as pool:
        futures = {pool.submit(compare, name, *v): name for name, v in todo.items()}
        for f in as_completed(futures):
            r = f.result()
            rows[r["sequence"]] = r
            print({k: v for k, v in r.items() if not k.endswith("segments")}, flush=True)
            write_json(out, [rows[n] for n in todo if n in rows], indent=1)   # kept if cut off
    rows = [rows[n] for n in todo]
    report(rows)
    print("wrote", out)


if __name__ == "__main__":
    main()
