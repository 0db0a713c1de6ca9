"""An op sequence (:mod:`helpers.allocator_ops`) replayed on the real CUDA caching allocator, run as its
own program so that the allocator starts empty and ``PYTORCH_CUDA_ALLOC_CONF`` is set before CUDA starts.

    python -m helpers.allocator_replay --ops '[["alloc", "a", 1048576], ["free", "a"]]'
        [--cap BYTES] [--card-gib GIB] [--expandable] [--max-split-mb N]

It prints one JSON line with the keys :func:`helpers.allocator_sim.simulate` returns: ``oom``,
``failed_at``, ``allocated``, ``reserved``, ``peak_reserved``, ``trace`` (``[allocated, reserved]`` after
every op that ran) and ``snapshot`` (``torch.cuda.memory_snapshot()``'s segments and blocks), plus
``cap`` (the cap applied, bytes) and, at an OOM, ``summary`` (``torch.cuda.memory_summary``).
``--card-gib`` emulates a card of that size (``COURSE_GPU_GIB``): the cap is at most this process's
:func:`~helpers.device.card_share` of it. :func:`run_real` starts the program and reads its line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from .allocator_ops import check_op
from .validate import positive_number

MODULE = "helpers.allocator_replay"


def check_max_split_mb(max_split_mb) -> int | None:
    """``max_split_mb`` when it is None or an integer ≥ 20 (the least ``max_split_size_mb`` PyTorch accepts)."""
    if max_split_mb is not None and (isinstance(max_split_mb, bool) or not isinstance(max_split_mb, int)
                                     or max_split_mb < 20):
        raise ValueError(f"max_split_mb must be an integer ≥ 20 (PyTorch's minimum) or None, got {max_split_mb!r}")
    return max_split_mb


def alloc_conf(base: str, expandable: bool = False, max_split_mb: int | None = None) -> str:
    """``PYTORCH_CUDA_ALLOC_CONF`` for a replay: ``base`` without its ``expandable_segments`` and
    ``max_split_size_mb`` entries, then those two as asked."""
    conf = [c for c in (base or "").split(",") if c and "expandable" not in c and "max_split" not in c]
    if expandable:
        conf.append("expandable_segments:True")
    if check_max_split_mb(max_split_mb) is not None:
        conf.append(f"max_split_size_mb:{max_split_mb}")
    return ",".join(conf)


def checked(ops, cap=None, max_split_mb=None, card_gib=None) -> tuple[list, int | None, float | None]:
    """``(ops, cap, card_gib)`` after the checks a replay needs: every op well formed, ``cap`` a positive
    number of bytes (as an int) or None, ``card_gib`` a positive number or None, ``max_split_mb`` as
    :func:`check_max_split_mb` accepts it; a ValueError or TypeError otherwise."""
    if not isinstance(ops, (list, tuple)):
        raise ValueError(f"ops must be a list of ops such as [['alloc', 'a', 1024]], got {type(ops).__name__}")
    for op in ops:
        check_op(op)
    check_max_split_mb(max_split_mb)
    if cap is not None:
        cap = int(positive_number(cap, "cap", "bytes the allocator may reserve, or None"))
    if card_gib is not None:
        card_gib = float(positive_number(card_gib, "card_gib", "the emulated card in GiB, or None"))
    return list(ops), cap, card_gib


def command(ops: list, cap: int | None = None, expandable: bool = False, max_split_mb: int | None = None,
            card_gib: float | None = None) -> tuple[list[str], dict]:
    """``(argv, env)`` that run this module on ``ops`` with ``subprocess``: this interpreter, the
    course's folder on ``PYTHONPATH``, the allocator's settings in ``PYTORCH_CUDA_ALLOC_CONF``."""
    ops, cap, card_gib = checked(ops, cap, max_split_mb, card_gib)
    argv = [sys.executable, "-m", MODULE, "--ops", json.dumps(ops)]
    if cap is not None:
        argv += ["--cap", str(cap)]
    if card_gib is not None:
        argv += ["--card-gib", repr(card_gib)]
    if expandable:
        argv.append("--expandable")
    if max_split_mb is not None:
        argv += ["--max-split-mb", str(max_split_mb)]
    env = dict(os.environ)
    env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf(env.get("PYTORCH_CUDA_ALLOC_CONF", ""), expandable, max_split_mb)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return argv, env


def read_result(stdout: str, stderr: str = "", returncode: int = 0) -> dict:
    """The JSON line a replay printed last, as a dict; a RuntimeError with the end of its stderr when
    it exited with an error or printed no such line."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    try:
        if returncode == 0 and lines:
            return json.loads(lines[-1])
    except json.JSONDecodeError:
        pass
    raise RuntimeError(f"real allocator run failed (exit status {returncode}):\n{stderr[-2000:]}")


def run_real(ops: list, cap: int | None = None, expandable: bool = False, timeout: int = 300,
             max_split_mb: int | None = None) -> dict:
    """Replay ``ops`` on the real GPU in a fresh process of this module (see the module docstring).
    ``cap`` (bytes) caps its allocator; under ``COURSE_GPU_GIB`` it is at most the process's
    :func:`~helpers.device.card_share` of that card (the notebook's own process holds part of it).
    ``max_split_mb`` sets ``max_split_size_mb`` (PyTorch allows ≥ 20). The result's ``trace`` is
    ``(allocated, reserved)`` after every op that ran, as :func:`helpers.allocator_sim.simulate` returns it."""
    from .device import card_gib

    argv, env = command(ops, cap, expandable, max_split_mb, card_gib())
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    return read_result(out.stdout, out.stderr, out.returncode)


def replay(ops: list, cap: int | None = None, card_gib: float | None = None) -> dict:
    """Run ``ops`` with real CUDA tensors in this process and return the result the module prints.
    The allocator's settings are those this process started with: call it in a fresh process."""
    import torch

    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    if card_gib:  # emulated card: what the driver already uses (contexts, the notebook's kernel) comes off it
        from .device import card_share
        free, total_now = torch.cuda.mem_get_info()
        share = card_share(card_gib, total_now, free)
        cap = share if cap is None else min(cap, share)
    if cap:
        torch.cuda.set_per_process_memory_fraction(cap / total)
    live, res, trace = {}, {"oom": False, "failed_at": None, "cap": cap}, []
    for i, op in enumerate(ops):
        try:
            if op[0] == "alloc":
                live[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
            elif op[0] == "free":
                del live[op[1]]
            else:
                torch.cuda.empty_cache()
        except torch.OutOfMemoryError:
            res.update(oom=True, failed_at=i, summary=torch.cuda.memory_summary(abbreviated=True))
            break
        trace.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
    torch.cuda.synchronize()
    res.update(allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved(), trace=trace,
               peak_reserved=torch.cuda.max_memory_reserved(),
               snapshot=[{"segment_type": s["segment_type"], "total_size": s["total_size"],
                          "blocks": [{"size": b["size"], "state": b["state"]} for b in s["blocks"]]}
                         for s in torch.cuda.memory_snapshot()])
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="Replay an op sequence on the real CUDA caching allocator, in this fresh process, "
                    "and print the result as one JSON line (helpers.allocator_sim.simulate's keys).")
    ap.add_argument("--ops", required=True,
                    help="the op sequence as JSON: [\"alloc\", name, bytes], [\"free\", name], [\"empty_cache\"]")
    ap.add_argument("--cap", type=int, default=None, help="bytes the allocator may reserve (default: no cap)")
    ap.add_argument("--card-gib", type=float, default=None, help="run as on a card of this many GiB")
    ap.add_argument("--expandable", action="store_true", help="expandable_segments:True")
    ap.add_argument("--max-split-mb", type=int, default=None, help="max_split_size_mb (≥ 20)")
    args = ap.parse_args(argv)
    try:
        ops, cap, card_gib = checked(json.loads(args.ops), args.cap, args.max_split_mb, args.card_gib)
    except (ValueError, TypeError) as e:
        ap.error(str(e))
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf(os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                                                       args.expandable, args.max_split_mb)
    import torch

    if not torch.cuda.is_available():
        print(f"{MODULE}: no CUDA device here; the real allocator needs one "
              "(helpers.allocator_sim.simulate runs the same ops on the CPU)", file=sys.stderr)
        return 1
    print(json.dumps(replay(ops, cap, card_gib)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
