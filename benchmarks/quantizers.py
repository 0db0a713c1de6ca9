"""Our GPTQ / AWQ against llm-compressor's, on the same model, calibration tokens and settings.

    python -m benchmarks.quantizers --out results/cpu/quantizers.json             # offline SmolLM2, ppl
    python -m benchmarks.quantizers --out results/h200/quantizers.json --arch SmolLM2-135M,Qwen2.5-0.5B

CPU: the offline SmolLM2-135M (dequantized Q4_1, fp32) with perplexity on the course's eval text.
CUDA: architectures from their configs with random weights (bf16) and random calibration tokens:
time only (quality numbers of random weights mean nothing, so none are reported).
Settings shared by both implementations: asymmetric int, group size, GPTQ with act-order "static"
(llm-compressor's default) and dampening 0.01, AWQ with a 20-point grid. Rows are written after every
measurement: model, method, impl, bits, group_size, calib_tokens, seconds, ppl (CPU), peak_bytes
(CUDA: the allocator's peak during the quantizer over what was allocated before it, i.e. over the
model's own weights; CPU: the same for the C allocator's live bytes, :mod:`helpers.host_alloc`).

    python -m benchmarks.quantizers --out results/cpu/quantizers_memory.json --arch Llama-3.2-1B \
        --layers 2 --bits 4 --group 128 --calib-samples 16      # quantizer memory, CPU-sized
"""
from __future__ import annotations

import argparse
import copy
import platform
import time
from pathlib import Path

import torch

from helpers import data, evaluate, gptq, host_alloc, models, variants
from helpers.config import write_json
from helpers.measure import PeakMeter
from helpers.qspec import QuantSpec


def gptq_with(model, calib, spec: QuantSpec, inner: str) -> dict:
    """Our GPTQ as :func:`helpers.variants.apply_quantizer` runs it (act-order, static groups), with the
    column loop ``inner`` (:func:`helpers.gptq.inner_loop`)."""
    t0 = time.perf_counter()
    gptq.gptq_model(model, calib, spec, gptq.GPTQOptions(actorder=True, static_groups=True), inner=inner)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0}


def profile_to(path: Path, fn) -> str:
    """Run ``fn`` under ``torch.profiler`` (CPU and CUDA activity) and write its 40 costliest ops by
    CUDA time to ``path``; returns the path."""
    from torch.profiler import ProfilerActivity, profile
    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    path.write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40))
    return str(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", default="offline", help="'offline' (CPU, real weights) or architecture names")
    ap.add_argument("--methods", default="rtn,gptq,awq")
    ap.add_argument("--impls", default="ours,llmcompressor")
    ap.add_argument("--bits", default="4,3")
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--calib-samples", type=int, default=None,
                    help="calibration windows: default 128 on a GPU (the papers' 128 × 512), 16 on a CPU")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--layers", type=int, default=None,
                    help="keep only the first N decoder layers of an architecture (CPU-sized memory checks)")
    ap.add_argument("--eval-tokens", type=int, default=32 * 512)
    ap.add_argument("--awq-search-dtype", default="auto",
                    help="our AWQ's α-search dtype: auto (helpers.awq.default_search_dtype), float32, bfloat16")
    ap.add_argument("--gptq-inner", default="default",
                    help="our GPTQ's column loops, comma-separated: default (helpers.gptq.inner_loop's pick), "
                         "eager, graphs, kernel — one row each")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="CUDA: run our default GPTQ once more under torch.profiler and write its kernel table to DIR")
    args = ap.parse_args()
    out, rows = Path(args.out), []
    out.parent.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    args.calib_samples = args.calib_samples or (128 if cuda else 16)
    env = {"device": torch.cuda.get_device_name() if cuda else f"cpu ({platform.processor() or 'x86_64'})",
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    for arch in args.arch.split(","):
        if arch == "offline":
            base, tok = models.load_model("offline", dtype=torch.float32, device="cpu", echo=False)
            calib = data.calibration_batch(tok, args.calib_samples, args.seq_len)
            ev = data.tokens(tok, "eval")[:args.eval_tokens]
            name, note = "SmolLM2-135M-Instruct (offline, dequantized Q4_1)", "real weights, fp32"
        else:
            base = models.model_from_config(arch, device="cuda" if cuda else "cpu",
                                            dtype=torch.bfloat16 if cuda else torch.float32)
            if args.layers:
                models.keep_first_layers(base, args.layers)
                arch = f"{arch} (first {args.layers} layers)"
            calib = data.random_ids(base.config.vocab_size, (args.calib_samples, args.seq_len), seed=0)
            ev, name, note = None, arch, "architecture from config, random weights: time only"
        ppl = lambda m: None if ev is None else round(evaluate.perplexity(m, ev, args.seq_len, progress=False)["ppl"], 4)

        def add(**row):
            rows.append({"model": name, "group_size": args.group, "calib_tokens": calib.numel(),
                         "note": note, **env, **row})
            write_json(out, rows, indent=1)
            print({k: row[k] for k in row if k in ("method", "impl", "bits", "seconds", "ppl")}, flush=True)

        add(method="baseline", impl="-", bits=16 if ev is None else 32, seconds=0.0, ppl=ppl(base),
            calib_tokens=0)
        for bits in [int(b) for b in args.bits.split(",")]:
            for method in args.methods.split(","):
                impls = ["ours"] if method == "rtn" else args.impls.split(",")
                runs = [(impl, inner) for impl in impls
                        for inner in (args.gptq_inner.split(",") if (method, impl) == ("gptq", "ours") else ["default"])]
                for impl, inner in runs:
                    m = copy.deepcopy(base)
                    kw = ({"search_dtype": getattr(torch, args.awq_search_dtype)}
                          if (method, impl) == ("awq", "ours") and args.awq_search_dtype != "auto" else {})
                    spec = QuantSpec(bits, args.group)
                    run = (lambda m=m, kw=kw: variants.apply_quantizer(m, calib, method, impl, spec, **kw)) \
                        if inner == "default" else (lambda m=m, inner=inner: gptq_with(m, calib, spec, inner))
                    if cuda:
                        with PeakMeter() as meter:
                            info = run()
                        peak = meter.peak
                    else:   # the C allocator's live bytes after every op (helpers.host_alloc), over the start
                        box = {}
                        peak = host_alloc.peak_bytes(lambda: box.setdefault("info", run()), warmup=False,
                                                    no_grad=False)["peak"]   # autograd as the caller has it
                        info = box["info"]
                    profiled = None
                    if args.profile and cuda and (method, impl, inner) == ("gptq", "ours", "default"):
                        m2 = copy.deepcopy(base)
                        rerun = lambda: variants.apply_quantizer(m2, calib, method, impl, spec)
                        profiled = profile_to(Path(args.profile) / f"profile_{arch}_{method}_{impl}_{inner}_w{bits}.txt", rerun)
                        del m2
                    add(method=method, impl=impl, bits=bits, seconds=round(info["seconds"], 2), ppl=ppl(m),
                        peak_bytes=peak, **({} if inner == "default" else {"gptq_inner": inner}),
                        **({"profiled": profiled} if profiled else {}),
                        **({"calib_tokens": 0} if method == "rtn" else {}),
                        **({"search_dtype": info["search_dtype"]} if "search_dtype" in info else {}),
                        **({"calib_batch": info["batch_size"]} if "batch_size" in info else {}))
                    del m
                    if cuda:
                        torch.cuda.empty_cache()
        del base
    print("wrote", out)


if __name__ == "__main__":
    main()
