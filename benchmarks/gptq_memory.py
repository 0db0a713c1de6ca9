"""Where our GPTQ's GPU peak goes: the column loop eager, as CUDA graphs each with its own memory pool,
and as CUDA graphs sharing one pool (the default), on one architecture (random weights, 128 × 512
calibration tokens, W4 g128, static groups as llm-compressor).

    python -m benchmarks.gptq_memory --arch Llama-3.2-1B --out results/h200/gptq_memory.json
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from helpers import gptq as G
from helpers import models
from helpers.data import random_ids
from helpers.measure import PeakMeter
from helpers.qspec import QuantSpec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="Llama-3.2-1B")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--out", default="results/h200/gptq_memory.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gptq_memory needs a CUDA device")
    base = models.model_from_config(args.arch, device="cuda", dtype=torch.bfloat16)
    calib = random_ids(base.config.vocab_size, (args.samples, 512), seed=0)
    spec, options = QuantSpec(4, 128), G.GPTQOptions(actorder=True, static_groups=True)
    rows = []
    for name, share in (("graphs, shared pool", True), ("graphs, a pool per shape", False), ("eager column loop", None)):
        m = copy.deepcopy(base)
        t0 = time.perf_counter()
        with PeakMeter() as meter:
            graphs = "eager" if share is None else G.BlockGraphs(spec, share_pool=share)
            G.gptq_model(m, calib, spec, options, progress=False, inner=graphs)
            if share is not None:
                graphs.close()
        rows.append({"arch": args.arch, "column_loop": name, "seconds": round(time.perf_counter() - t0, 2),
                     "peak_bytes": meter.peak, "calib_tokens": calib.numel()})
        print(rows[-1], flush=True)
        del m, graphs
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
