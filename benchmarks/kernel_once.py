"""A few calls of the W4A16 kernel at one weight shape, group, row count and config: what a profiler
(Nsight Compute) looks at, one kernel at a time.

    ncu --section SpeedOfLight --section WarpStateStats -k "regex:_w4a16|_gemv_prepared" --launch-skip 2 \\
        --launch-count 1 python -m benchmarks.kernel_once --shape "8B gate/up 4096x14336" --group 128 --rows 8

``--shape`` is a label of :data:`benchmarks.kernels.SHAPES` (or ``HELD_OUT``) or ``KxN`` (in, out
features). The config is :func:`helpers.w4_kernel.auto_config`'s unless ``--config`` gives one as JSON
(its keys: :data:`helpers.w4_kernel.GEMV_KEYS`, ``PREPARED_KEYS`` or ``TC_KEYS``), or ``--family`` a kernel family
for ``auto_config`` (e.g. ``'{"PREPARED": true, "SUBNORMAL": true}'``: the rule's config with that switch; one row's default, the prepared path,
launches its activation preparation before the loop the regex above picks). The first ``--calls`` − 1 calls compile
and warm up; profile the last one (``--launch-skip calls-1 --launch-count 1``). It prints the config,
the launch grid and the error (of its bf16 output, as a decode step calls it) against
:func:`helpers.w4_format.reference_matmul`, so the profile's
kernel is known to be the right one. Without CUDA it runs in Triton's interpreter (small shapes only).
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from helpers.device import use_triton_interpreter_without_gpu


def parse_shape(text: str) -> tuple[int, int]:
    """``(K, N)`` of a shape label of ``benchmarks.kernels`` or of ``"KxN"``."""
    from benchmarks.kernels import HELD_OUT, SHAPES
    if text in SHAPES or text in HELD_OUT:
        return {**SHAPES, **HELD_OUT}[text]
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"--shape must be one of benchmarks.kernels.SHAPES / HELD_OUT or 'KxN' with K, N ≥ 1 "
                         f"(e.g. 4096x14336), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def run(shape: str, group: int, rows: int, config: dict | None = None, calls: int = 3, seed: int = 0,
        family: dict | None = None) -> dict:
    """Pack a random ``N×K`` weight at ``group``, call the kernel ``calls`` times on ``rows`` random rows with
    ``config`` (default ``auto_config(p, rows, family)``); return the config, grid, rows and the last call's error
    relative to the largest reference output."""
    import torch

    from helpers import w4_format, w4_kernel
    k, n = parse_shape(shape)
    if rows < 1 or calls < 1:
        raise ValueError(f"--rows and --calls must be ≥ 1, got rows={rows}, calls={calls}")
    if config is not None and family is not None:
        raise ValueError("give --config (a whole config) or --family (auto_config's switches), not both")
    if group < 2 or group & (group - 1) or k % group:
        raise ValueError(f"--group must be a power of two ≥ 2 that divides K={k} (64 or 128 in the course), got {group}")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(dev, torch.bfloat16)
    p = w4_format.pack_w4(w, group)
    x = torch.randn(rows, k, generator=g).to(dev, torch.bfloat16)
    cfg = w4_kernel._check_config(dict(config) if config else w4_kernel.auto_config(p, rows, family), p, rows)
    for _ in range(calls):   # the output in the activations' dtype, as a decode step calls it
        y = w4_kernel.w4a16_matmul(x, p, cfg)
    if dev == "cuda":
        torch.cuda.synchronize()
    ref = w4_format.reference_matmul(x.float(), p).float()
    tiles = -(-n // cfg["BLOCK_N"])
    grid = [tiles, cfg["SPLIT_K"]] + ([] if cfg["KERNEL"] in ("gemv", "prepared")   # the prepared loop's grid
                                      else [-(-rows // w4_kernel.block_rows(rows))])
    return {"shape": shape, "K": k, "N": n, "group": group, "M": rows, "config": cfg, "grid": grid,
            "device": dev, "rel_err": w4_format.max_rel_err(y, ref)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernel_once")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--config", default=None, help="a JSON dict; default helpers.w4_kernel.auto_config's")
    ap.add_argument("--family", default=None, help="a JSON dict of auto_config's switches, e.g. "
                    "'{\"PREPARED\": true, \"SUBNORMAL\": true}'")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args(argv)
    use_triton_interpreter_without_gpu()   # before triton is imported (a no-op where there is a GPU)
    config = _json_dict(args.config, "--config", '{"BLOCK_N": 64, "SPLIT_K": 4}', "a kernel config")
    family = _json_dict(args.family, "--family", '{"PREPARED": true, "SUBNORMAL": true}', "auto_config's switches")
    try:
        out = run(args.shape, args.group, args.rows, config, args.calls, family=family)
    except ValueError as e:
        sys.exit(str(e))
    print(json.dumps(out), flush=True)
    return out


def _json_dict(text: str | None, flag: str, example: str, what: str) -> dict | None:
    """``text`` parsed as a JSON dict (None for None); exits naming ``flag`` and an example otherwise."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        sys.exit(f"{flag} must be a JSON dict such as '{example}': {e}")
    if not isinstance(value, dict):
        sys.exit(f"{flag} must be a JSON dict ({what}), got {type(value).__name__}")
    return value


if __name__ == "__main__":
    main()
