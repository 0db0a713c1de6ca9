"""Execute every notebook headless into build/: executed copies, run_all.json (wall time and status
per notebook, device, versions) and key_numbers.json (the main tables each notebook measured).

    python scripts/run_all.py [--out build] [--profile full|ci] [notebooks...]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "build"))
    ap.add_argument("--profile", default=os.environ.get("COURSE_PROFILE", "full"))
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("notebooks", nargs="*")
    args = ap.parse_args()
    os.environ["COURSE_PROFILE"] = args.profile
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_REPORT"] = str((out / "key_numbers.json").resolve())  # helpers.report writes here
    (out / "key_numbers.json").unlink(missing_ok=True)
    nbs = [Path(n) for n in args.notebooks] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    rows = []
    for nb_path in nbs:
        nb = nbformat.read(nb_path, as_version=4)
        t0, ok, err = time.perf_counter(), True, None
        try:
            NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(nb_path.parent)}}).execute()
        except Exception as e:  # keep going: the report says which notebook failed and why
            ok, err = False, str(e).splitlines()[-1][:300] if str(e) else type(e).__name__
        secs = time.perf_counter() - t0
        nbformat.write(nb, out / nb_path.name)
        rows.append({"name": nb_path.name, "seconds": round(secs, 1), "ok": ok, "error": err})
        print(f"{nb_path.name:<36} {'ok ' if ok else 'FAIL'} {secs:7.1f} s", flush=True)
    import torch
    report = {"profile": args.profile, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
              "notebooks": rows}
    (out / "run_all.json").write_text(json.dumps(report, indent=1))
    raise SystemExit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
