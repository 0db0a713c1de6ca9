"""The one-row GEMV's sums on the course model's real weights and activations (CPU, Triton's interpreter).

    python -m benchmarks.gemv_precision --out results/cpu/gemv_precision.json

The kernels' exactness rows in ``results/h200/kernels.json`` use random activations; this is the same
check where the numbers are real: the offline SmolLM2's ``down_proj`` weights (K = 1536, twelve groups of
128) packed at g128, fed the inputs that layer really receives on WikiText-2 evaluation tokens (bf16,
as on a GPU). Per layer and sum mode (fp32, ``HALF2``: fp16 pairs per word, ``ACC16``: fp16 pairs per
group — ``helpers.w4_kernel``), the largest ``|ours − reference_matmul|`` over the largest ``|reference|``.
The interpreter rounds each fp16 product and sum separately where the GPU fuses them (``HFMA2``), so its
fp16 errors are an upper estimate of the GPU's.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from helpers.device import use_triton_interpreter_without_gpu

use_triton_interpreter_without_gpu()   # before triton is imported (the helpers below import it)

import torch  # noqa: E402

from helpers import calib, data, models, w4_format, w4_kernel  # noqa: E402
from helpers.config import write_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gemv_precision")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="2,15,29")
    ap.add_argument("--rows", type=int, default=4, help="token rows timed per layer (each one GEMV call)")
    args = ap.parse_args()
    model, tok = models.load_model("offline", device="cpu", dtype="fp32", echo=False)
    ids = data.tokens(tok)[:64][None]
    rows = []
    for li in (int(x) for x in args.layers.split(",")):
        down = models.decoder_layers(model)[li].mlp.down_proj
        p = w4_format.pack_w4(down.weight.data, 128)
        x = calib.capture_inputs(model, down, ids)[-args.rows:].to(torch.bfloat16)
        ref = w4_format.reference_matmul(x.float(), p)
        for name, sums in w4_kernel.SUMS.items():
            t = time.perf_counter()
            cfg = dict(KERNEL="gemv", BLOCK_N=64, GROUPS=4, SPLIT_K=1, MAGIC=False, **sums)
            got = torch.cat([w4_kernel.w4a16_matmul(x[r:r + 1], p, cfg, out_dtype=torch.float32) for r in range(len(x))])
            err = ((got - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
            rows.append({"layer": li, "sums": name, "rows": len(x), "max_abs_x": x.abs().max().item(), "rel_err": err,
                         "seconds": time.perf_counter() - t})
            print(rows[-1], flush=True)
    meta = {"model": "offline SmolLM2-135M-Instruct (dequantized Q4_1), real weights", "weight": "mlp.down_proj, g128",
            "activations": f"its inputs on the first 64 WikiText-2 evaluation tokens, the last {args.rows} rows, bf16",
            "engine": "Triton interpreter on the CPU (fp16 products and sums rounded separately)",
            "torch": torch.__version__}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, {"meta": meta, "rows": rows}, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
