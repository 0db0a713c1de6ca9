"""One process of a shared GPU, run as its own program: a workshop participant under an allocator cap,
or another user holding memory. Notebook 09 starts several at once to show what a cap isolates.

    python -m helpers.gpu_share participant --cap-gib 4 --want-gib 3 [--lift]
    python -m helpers.gpu_share hold --gib 8          # holds until its stdin closes
    python -m helpers.gpu_share spin --kernels 500 --wait   # a stream of one-block kernels, timed

A participant sets ``torch.cuda.set_per_process_memory_fraction(cap / total)`` (what
:func:`helpers.device.limit_memory` sets), takes 256 MiB tensors until it has ``want`` GiB or runs out,
and prints one JSON line: what it got, whether it hit an OOM, and its own device memory by NVML (so
the per-process memory outside PyTorch — the CUDA context — is measured, not assumed). ``--lift``
calls ``set_per_process_memory_fraction(1.0)`` after the cap, as a participant's own code may: a cap
set by the process itself is advice, not isolation. A holder takes ``gib`` GiB, prints one JSON line
and keeps the memory until its standard input closes (the parent ends it). A spinner launches
``kernels`` kernels of one thread block each (``torch.cuda._sleep``: a busy-wait of ``cycles`` GPU
clock cycles) and prints how long they took; with ``--wait`` it prints ``ready`` once its CUDA context
is up and starts when a line arrives on its standard input, so that several spinners really run at
the same time. Two spinners at once share the GPU by time slices unless MPS lets their kernels run
side by side.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .units import GiB, MiB

CHUNK = 256 * MiB


def command(role: str, *args: str) -> tuple[list[str], dict]:
    """``(argv, env)`` to start one process of ``role`` (``participant``, ``hold``, ``spin``) with
    ``subprocess``: this interpreter running this module, the course's folder on ``PYTHONPATH``."""
    import os
    from pathlib import Path
    if role not in ("participant", "hold", "spin"):
        raise ValueError(f"role must be 'participant', 'hold' or 'spin', got {role!r}")
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return [sys.executable, "-m", "helpers.gpu_share", role, *map(str, args)], env


def last_json(stdout: str) -> dict | None:
    """The last JSON line a process of this module printed (its result), or None."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def participant(cap_gib: float, want_gib: float, lift: bool = False, name: str = "p") -> dict:
    import torch

    from .device import process_memory
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GiB / total))
    if lift:
        torch.cuda.set_per_process_memory_fraction(1.0)
    chunks, err = [], None
    try:
        while len(chunks) * CHUNK < want_gib * GiB:
            chunks.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
            time.sleep(0.02)      # the participants run side by side, not one after another
    except torch.OutOfMemoryError as e:
        err = str(e).splitlines()[0][:160]
    proc = process_memory(torch.cuda.current_device())
    reserved = torch.cuda.memory_reserved()
    return {"participant": name, "cap_gib": cap_gib, "wanted_gib": want_gib, "lifted": lift,
            "got_gib": len(chunks) * CHUNK / GiB, "oom": err is not None, "error": err,
            "reserved_bytes": reserved, "process_bytes": proc.bytes,
            "non_torch_bytes": None if proc.bytes is None else proc.bytes - reserved, "source": proc.source}


def hold(gib: float) -> None:
    import torch
    n = int(gib * GiB)
    keep = torch.empty(n, dtype=torch.uint8, device="cuda")
    keep.fill_(1)                          # touch it: the memory is really in use
    torch.cuda.synchronize()
    print(json.dumps({"holding_bytes": n}), flush=True)
    sys.stdin.read()                       # until the parent closes our stdin
    del keep


def spin(kernels: int, cycles: int, wait: bool = False) -> dict:
    import torch

    from .device import process_memory
    torch.cuda._sleep(1000)                # context and module load outside the timing
    torch.cuda.synchronize()
    if wait:                               # start together with the other spinners: the parent says "go"
        print("ready", flush=True)
        sys.stdin.readline()
    t0 = time.perf_counter()
    for _ in range(kernels):
        torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    proc = process_memory(torch.cuda.current_device())
    return {"kernels": kernels, "cycles": cycles, "seconds": time.perf_counter() - t0,
            "process_bytes": proc.bytes, "source": proc.source}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers.gpu_share", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="role", required=True)
    p = sub.add_parser("participant")
    p.add_argument("--cap-gib", type=float, required=True)
    p.add_argument("--want-gib", type=float, required=True)
    p.add_argument("--lift", action="store_true")
    p.add_argument("--name", default="p")
    h = sub.add_parser("hold")
    h.add_argument("--gib", type=float, required=True)
    sp = sub.add_parser("spin")
    sp.add_argument("--kernels", type=int, default=200)
    sp.add_argument("--cycles", type=int, default=2_000_000)
    sp.add_argument("--wait", action="store_true")
    args = ap.parse_args(argv)
    for name in ("cap_gib", "want_gib", "gib"):
        v = getattr(args, name, None)
        if v is not None and not 0 < v < float("inf"):
            ap.error(f"--{name.replace('_', '-')} must be a positive, finite number of GiB, got {v}")
    if args.role == "participant":
        print(json.dumps(participant(args.cap_gib, args.want_gib, args.lift, args.name)), flush=True)
    elif args.role == "spin":
        print(json.dumps(spin(args.kernels, args.cycles, args.wait)), flush=True)
    else:
        hold(args.gib)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
