"""Low-bit matmul kernels against the bandwidth limit, on real layer shapes (CUDA only).

    python benchmarks/kernels.py --out results/h200/kernels.json

Per (K, N) weight shape (Llama-3-8B and Llama-2-70B projections) and rows M: the median time of
``y = x @ W.T`` for bf16 (cuBLAS), W4A16 tinygemm (torchao ``Int4WeightOnlyConfig``, tile-packed),
our Triton W4A16 kernel (helpers/w4_kernel.py: its optimisation steps one by one, then tuned),
INT8 weight-only (torchao) and FP8 W8A8 rowwise (``torch._scaled_mm``, capability ≥ 8.9). Every
time is taken with the L2 cache flushed (helpers/timing.py). ``GBps`` = the weight bytes the kernel
must read / time; ``copy_GBps`` = the measured device-to-device copy bandwidth, the practical limit.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import decode_bench, timing, w4_kernel  # noqa: E402

SHAPES = {"8B q/o 4096x4096": (4096, 4096), "8B gate/up 4096x14336": (4096, 14336),
          "8B down 14336x4096": (14336, 4096), "70B gate/up 8192x28672": (8192, 28672),
          "70B down 28672x8192": (28672, 8192)}
STEPS = {  # our kernel, one optimisation at a time (helpers/w4_kernel.py docstring); M = 1 only
    "ours step 1: one group per step": dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=1, MAGIC=False, num_warps=4),
    "ours step 2: + 4 groups per step (wide loads)": dict(BLOCK_N=32, BLOCK_K=512, SPLIT_K=1, MAGIC=False, num_warps=4),
    "ours step 3: + split-K": dict(BLOCK_N=32, BLOCK_K=512, SPLIT_K=4, MAGIC=False, num_warps=4),
    "ours step 4: + 0x6400 nibble→fp16": dict(BLOCK_N=32, BLOCK_K=512, SPLIT_K=4, MAGIC=True, num_warps=4),
}


def torchao_linear(w: torch.Tensor, config) -> torch.nn.Module | None:
    from torchao.quantization import quantize_
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="cuda", dtype=torch.bfloat16)
    lin.weight.data.copy_(w)
    quantize_(lin, config)
    return lin


def fp8_rowwise(w: torch.Tensor):
    """W8A8 FP8 e4m3 with a scale per weight row and per activation row (``torch._scaled_mm``)."""
    wmax = w.abs().amax(1, keepdim=True).float().clamp(min=1e-12)
    ws = wmax / 448.0
    wq = (w.float() / ws).to(torch.float8_e4m3fn)

    def run(x):
        xs = x.abs().amax(1, keepdim=True).float().clamp(min=1e-12) / 448.0
        xq = (x.float() / xs).to(torch.float8_e4m3fn)
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)

    def matmul_only(x):  # activations already FP8 (what a fused kernel or a W8A8 engine passes along)
        xs = x.abs().amax(1, keepdim=True).float().clamp(min=1e-12) / 448.0
        xq = (x.float() / xs).to(torch.float8_e4m3fn)
        return lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)
    run.matmul_only = matmul_only
    return run, wq.numel() + ws.numel() * 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--crossover-rows", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--group", type=int, default=128)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kernels.py times CUDA kernels; there is no CUDA device here")
    from torchao.quantization import Int8WeightOnlyConfig
    cap = torch.cuda.get_device_capability()
    copy = timing.copy_bandwidth_gbps()
    print(f"copy bandwidth {copy:.0f} GB/s on {torch.cuda.get_device_name()}", flush=True)
    rows = []

    def add(kernel, fmt, k, n, m, ms, nbytes, **extra):
        row = {"kernel": kernel, "format": fmt, "K": k, "N": n, "M": m, "ms": ms,
               "GBps": nbytes / (ms * 1e-3) / 1e9, "copy_GBps": copy, **extra}
        rows.append(row)
        print(f"{kernel:48s} K={k:6d} N={n:6d} M={m:4d} {ms:8.4f} ms {row['GBps']:7.0f} GB/s", flush=True)

    for label in args.shapes.split(","):
        k, n = SHAPES[label]
        torch.manual_seed(0)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        p = w4_kernel.pack_w4(w, args.group)
        int4 = decode_bench.tinygemm_linear(w, args.group)
        int8 = torchao_linear(w, Int8WeightOnlyConfig())
        fp8, fp8_bytes = fp8_rowwise(w) if cap >= (8, 9) else (None, 0)
        ms_rows = sorted({int(r) for r in args.rows.split(",")} | {int(r) for r in args.crossover_rows.split(",")})
        for m in ms_rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            main_row = str(m) in args.rows.split(",")
            add("bf16 cuBLAS", "bf16", k, n, m, timing.gpu_ms(lambda: x @ w.t()), w.numel() * 2, shape=label)
            if int4 is not None:
                add("tinygemm (torchao int4)", f"W4A16 g{args.group}", k, n, m,
                    timing.gpu_ms(lambda: int4(x)), p.nbytes, shape=label)
            cfg, ms = w4_kernel.tuned_config(x, p, lambda fn: timing.gpu_ms(fn, iters=20, warmup=2))
            add("ours (Triton, tuned)", f"W4A16 g{args.group}", k, n, m, timing.gpu_ms(lambda: w4_kernel.w4a16_matmul(x, p, cfg)),
                p.nbytes, shape=label, config=cfg)
            if main_row and m == 1:
                for step, scfg in STEPS.items():
                    try:
                        ms = timing.gpu_ms(lambda: w4_kernel.w4a16_matmul(x, p, scfg))
                    except ValueError:
                        continue
                    add(step, f"W4A16 g{args.group}", k, n, m, ms, p.nbytes, shape=label, config=scfg)
            if main_row:
                if int8 is not None:
                    add("torchao int8 weight-only (eager)", "W8A16", k, n, m, timing.gpu_ms(lambda: int8(x)),
                        w.numel() + n * 2, shape=label)
                if fp8 is not None:
                    add("FP8 rowwise _scaled_mm (+ act. quant)", "W8A8 fp8", k, n, m, timing.gpu_ms(lambda: fp8(x)),
                        fp8_bytes, shape=label)
                    add("FP8 rowwise _scaled_mm (matmul only)", "W8A8 fp8", k, n, m,
                        timing.gpu_ms(fp8.matmul_only(x)), fp8_bytes, shape=label)
            # correctness of ours on this shape, every row count
            ref = w4_kernel.reference_matmul(x.float(), p).float()
            got = w4_kernel.w4a16_matmul(x, p, cfg, out_dtype=torch.float32)
            assert (got - ref).abs().max() <= 1e-3 * ref.abs().max(), (label, m, (got - ref).abs().max().item())
        w = p = int4 = int8 = fp8 = None
        torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "capability": list(cap),
            "copy_GBps": copy, "group": args.group, "l2_flushed": True}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
