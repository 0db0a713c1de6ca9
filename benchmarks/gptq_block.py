"""One block of GPTQ's column loop (128 columns, static grids) timed three ways on CUDA: the eager
loop (:func:`helpers.gptq.quantize_block`, ~10 kernels a column), replayed as a CUDA graph
(:class:`helpers.gptq.BlockGraphs`) and as one Triton kernel (:class:`helpers.gptq.KernelBlock`, for
each tile height ``block_rows``) — on the row counts of Llama-3.2-1B's stacked linears (q/k/v 3072,
o and down 2048, gate/up 16384). Every variant is checked bit-equal to the eager loop first.

    python -m benchmarks.gptq_block --out results/h200/gptq_block.json
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

from helpers import gptq as G
from helpers import gptq_kernel
from helpers.config import write_json
from helpers.qspec import QuantSpec
from helpers.timing import gpu_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="3072,2048,16384")
    ap.add_argument("--cols", type=int, default=128)
    ap.add_argument("--block-rows", default="8,16,32,64")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gptq_block needs a CUDA device")
    spec, cols, rows_out = QuantSpec(4, 128), args.cols, []
    X = torch.randn(8 * cols, cols, device="cuda") @ torch.randn(cols, cols, device="cuda")
    H = X.t() @ X / len(X) + 0.01 * torch.eye(cols, device="cuda")
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    for rows in [int(r) for r in args.rows.split(",")]:
        W = torch.randn(rows, cols, device="cuda")
        S, Z = G.find_params(W, spec)
        grids = G.Grids(S[:, None].expand(rows, 1).contiguous(), Z[:, None].expand(rows, 1).contiguous(),
                        [0] * cols, cols, True)
        variants = {"eager": G.quantize_block, "graphs": G.BlockGraphs(spec)}
        variants |= {f"kernel, block_rows={b}": functools.partial(gptq_kernel.quantize_block_static, block_rows=b)
                     for b in [int(b) for b in args.block_rows.split(",")]}
        want = G.quantize_block(W.clone(), Hinv, 0, cols, grids, spec)
        for name, fn in variants.items():
            if name.startswith("kernel"):
                call = lambda fn=fn: fn(W.clone(), Hinv, S[:, None].expand(rows, cols).contiguous(),
                                        Z[:, None].expand(rows, cols).contiguous(), spec.bits, spec.symmetric)
            else:
                call = lambda fn=fn: fn(W.clone(), Hinv, 0, cols, grids, spec)
            got = call()
            exact = all(torch.equal(a, b) for a, b in zip(want, got))
            ms = gpu_ms(call, iters=5 if name == "eager" else 50, flush_l2=False)
            rows_out.append({"rows": rows, "cols": cols, "inner": name, "ms": round(ms, 4), "exact": exact,
                             "device": torch.cuda.get_device_name(), "torch": torch.__version__})
            print(rows_out[-1], flush=True)
            write_json(Path(args.out), rows_out, indent=1)
        variants["graphs"].close()


if __name__ == "__main__":
    main()
