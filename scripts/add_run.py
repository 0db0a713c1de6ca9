"""Add one device run's rows to a results file (``results/<card>/kernels.json`` or ``decode.json``):

    python scripts/add_run.py SRC DEST --run "2026-12-06 U" --commit 412c6fa --what "..." --command "..."

Each row of ``SRC`` (a file ``benchmarks/kernels.py`` or ``benchmarks/decode.py`` wrote on the device) gets
``run`` and, where it has none, ``commit``; ``DEST``'s ``meta.runs`` gets the run's entry (what ran, the
command, the copy bandwidth and seconds the run recorded). Refused, with DEST unchanged: a run name DEST
already holds, a device other than DEST's, a file that is not such a results file.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(path: Path, what: str) -> dict:
    """A results file: ``{"meta": {...}, "rows": [...]}``."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        sys.exit(f"{what} {path}: no such file")
    except json.JSONDecodeError as e:
        sys.exit(f"{what} {path}: not JSON ({e})")
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict) or not isinstance(data.get("rows"), list):
        sys.exit(f"{what} {path}: not a results file (a JSON object with 'meta' and 'rows')")
    return data


def add_run(src: dict, dest: dict, run: str, commit: str, what: str, command: str) -> dict:
    """``dest`` with ``src``'s rows added as run ``run`` (a new dict; see the module's docstring)."""
    runs = dest["meta"].setdefault("runs", {})
    if run in runs:
        raise ValueError(f"--run {run!r}: the destination already holds a run of that name; choose another")
    if src["meta"].get("device") and dest["meta"].get("device") and src["meta"]["device"] != dest["meta"]["device"]:
        raise ValueError(f"the run was measured on {src['meta']['device']!r}, the destination holds "
                         f"{dest['meta']['device']!r}'s runs: add it to that card's results folder")
    rows = [{**r, "run": run, "commit": r.get("commit") or commit} for r in src["rows"]]
    entry = {"commit": commit, "what": what, "command": command}
    entry.update({k: src["meta"][k] for k in ("copy_GBps", "seconds") if k in src["meta"]})
    return {"meta": {**dest["meta"], "runs": {**runs, run: entry}}, "rows": dest["rows"] + rows}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python scripts/add_run.py", description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help="the file the benchmark wrote on the device")
    ap.add_argument("dest", type=Path, help="the results file to add it to")
    ap.add_argument("--run", required=True, help='the run\'s name, e.g. "2026-12-06 U"')
    ap.add_argument("--commit", required=True, help="the commit the device ran")
    ap.add_argument("--what", required=True, help="what the run measured, in words")
    ap.add_argument("--command", required=True, help="the command that ran it")
    args = ap.parse_args(argv)
    src, dest = load(args.src, "src"), load(args.dest, "dest")
    try:
        out = add_run(src, dest, args.run, args.commit, args.what, args.command)
    except ValueError as e:
        sys.exit(str(e))
    args.dest.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"{args.dest}: {len(src['rows'])} rows added as run {args.run!r}")


if __name__ == "__main__":
    main()
