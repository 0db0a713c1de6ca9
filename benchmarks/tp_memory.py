"""Tensor parallelism on two GPUs, measured: per-rank weights, KV pool, activation peak and NVML process
memory of a Llama-3-70B-shaped stack at tp=2, predicted vs measured, and the all-reduce time of a
decode step (CUDA, ≥ 2 GPUs, NCCL).

    python -m benchmarks.tp_memory --out results/h200x2/tp_memory.json [--tp 2] [--layers 4] \\
        [--batch 32] [--seq 4096] [--activation-tokens 2048] [--decode-batches 1,8,32,64,256]

No launcher: :func:`helpers.tp_run.measure_memory` spawns one process per GPU, each joins an NCCL
group with NVLink multicast off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``; no symmetric memory is used), builds its shard of the first ``--layers``
decoder layers plus the vocab-parallel embedding and lm_head with random bf16 weights (memory depends
on shapes only), profiles one forward, allocates its KV pool, and times all-reduces of ``[batch,
8192]`` bf16 hidden states. The file holds the arguments, the per-rank rows (``*_meas`` next to
``*_pred``, from :func:`helpers.tp_run.predicted_memory`) and the all-reduce timings.

**Not run yet**: written and its CPU parts tested (arguments, predictions: tests/test_parallel.py) on
a machine without GPUs; its first run on two GPUs is still to do (``results/h200x2/`` does not exist
until then).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from helpers import tp_run
from helpers.parallel import rank_shape
from helpers.units import GiB


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tp_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/h200x2/tp_memory.json"))
    ap.add_argument("--arch", default="Llama-3-70B", choices=("Llama-3-70B", "Llama-2-70B"))
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the stack (the model has 80)")
    ap.add_argument("--batch", type=int, default=32, help="sequences in the KV pool")
    ap.add_argument("--seq", type=int, default=4096, help="tokens per sequence in the KV pool")
    ap.add_argument("--activation-tokens", type=int, default=2048, help="tokens of the profiled forward")
    ap.add_argument("--decode-batches", default="1,8,32,64,256", help="batch sizes of the timed all-reduces")
    ap.add_argument("--iters", type=int, default=100, help="timed all-reduces per batch size")
    args = ap.parse_args(argv)
    for name in ("tp", "layers", "batch", "seq", "activation_tokens", "iters"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(args, name)}")
    if args.tp < 2:
        ap.error(f"--tp must be ≥ 2 (tensor parallelism over several GPUs), got {args.tp}")
    if args.layers > 80:
        ap.error(f"--layers must be ≤ 80 (the model's layers), got {args.layers}")
    try:
        args.decode_batches = [int(b) for b in args.decode_batches.split(",")]
    except ValueError:
        ap.error(f"--decode-batches must be comma-separated integers, got {args.decode_batches!r}")
    if any(b < 1 for b in args.decode_batches):
        ap.error(f"--decode-batches must all be ≥ 1, got {args.decode_batches}")
    try:
        rank_shape(tp_run.stack_config(args.arch, args.layers), args.tp)
    except ValueError as e:
        ap.error(f"--tp {args.tp}: {e}")
    return args


def prediction(args: argparse.Namespace) -> dict:
    """The per-rank prediction the run is checked against (bytes), with the split it assumes."""
    r = rank_shape(tp_run.stack_config(args.arch, args.layers), args.tp)
    pred = tp_run.predicted_memory(args.arch, args.tp, args.layers, args.batch, args.seq, args.activation_tokens)
    return {**pred, "kv_heads_per_rank": r.kv_heads, "kv_replicas": r.kv_replicas, "vocab_per_rank": r.vocab_per_rank}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    rows = tp_run.measure_memory(args.arch, args.tp, args.layers, args.batch, args.seq, args.activation_tokens,
                                 args.decode_batches, args.iters)
    out = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "prediction": prediction(args), "torch": torch.__version__,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())), "gpu": torch.cuda.get_device_name(0),
           "env": tp_run.MULTICAST_OFF, "ranks": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    for r in rows:
        nvml = "unavailable" if r["nvml_process"] is None else f"{r['nvml_process'] / GiB:.3f} GiB"
        print(f"rank {r['rank']}: weights {r['weights_meas'] / GiB:.3f} GiB (pred {r['weights_pred'] / GiB:.3f}), "
              f"KV {r['kv_meas'] / GiB:.3f} (pred {r['kv_pred'] / GiB:.3f}), activations "
              f"{r['activations_meas'] / GiB:.3f} (pred {r['activations_pred'] / GiB:.3f}), NVML {nvml}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
