"""Round 15's question: does ``torch.compile`` fuse the prepared path's activation side into the kernel that
writes ``x``, so that one row costs one launch (the loop) instead of two (``prepare_x``, then the loop)?

A decode step's one-row activations come from RMSNorm (into q|k|v, gate|up and the head, ``K`` = hidden) and from
SiLU·mul (into down, ``K`` = intermediate). For each producer, compiled (inductor, ``fullgraph``) with:

* ``producer`` — the producer alone (the floor: what the step launches anyway);
* ``prepare_x`` — the producer compiled, then :func:`helpers.w4_kernel.prepare_x` outside the graph (today: the
  preparation's own launch, opaque to the compiler as the layers' custom op is);
* ``group`` — the producer, then :func:`helpers.w4_kernel.prepare_x_torch` in the graph (per-group shrink and Σx,
  what the prepared loop reads);
* ``row`` — one shrink for the whole row (its largest ``|x|``), the per-group Σx kept;
* ``row, planes only`` — one shrink, the planes and ``1/shrink`` without Σx (what a loop that summed ``x`` itself
  would need);

it records the kernels one call launches (``torch.profiler``) and the call's time under CUDA-graph replay
(:func:`helpers.timing.graph_ms`). A variant fuses where it launches as many kernels as ``producer``.

    python -m benchmarks.prep_fusion --out results/h100/prep_fusion.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from helpers import w4_kernel
from helpers.timing import graph_ms

PRODUCERS = {"RMSNorm": 4096, "SiLU·mul": 14336}   # Llama-3.1-8B's hidden and intermediate widths


def row_shrink_planes(x: torch.Tensor, group: int, sums: bool = True):
    """The planes of :func:`~helpers.w4_kernel.prepare_x_torch` with one power-of-two shrink for the whole row
    (:func:`~helpers.w4_kernel.pow2_shrink` of its largest ``|x|``, which keeps every group under the limit),
    ``inv`` repeated per group; with ``sums`` the per-group Σx too (else None)."""
    k = x.shape[1]
    xf = x.float()
    shrink = w4_kernel.pow2_shrink(xf.abs().amax(1, keepdim=True), group)
    inv = (1 / shrink).expand(1, k // group).reshape(-1)
    return w4_kernel.shrunk_planes(xf * shrink), (xf.view(k // group, group).sum(1) if sums else None), inv


def producer(name: str, k: int, device):
    """The producer of one row of ``k`` activations from its input ``h`` (RMSNorm as Llama writes it; SiLU·mul of
    ``h``'s two halves), and an input for it."""
    torch.manual_seed(0)
    if name == "RMSNorm":
        w = torch.rand(k, device=device, dtype=torch.bfloat16) + 0.5

        def f(h):
            hf = h.float()
            return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(h.dtype) * w
        return f, torch.randn(1, k, device=device, dtype=torch.bfloat16)
    if name == "SiLU·mul":
        return (lambda h: torch.nn.functional.silu(h[:, :k]) * h[:, k:]), \
            torch.randn(1, 2 * k, device=device, dtype=torch.bfloat16)
    raise ValueError(f"producer must be one of {sorted(PRODUCERS)}, got {name!r}")


VARIANTS = {   # the preparation traced into the graph after the producer (prepare_x: None, called outside it)
    "producer": lambda x, g: (x,),
    "prepare_x": None,
    "group": lambda x, g: w4_kernel.prepare_x_torch(x, g),
    "row": lambda x, g: row_shrink_planes(x, g),
    "row, planes only": lambda x, g: row_shrink_planes(x, g, sums=False)[::2],
}


def kernels_of(fn, h) -> list[str]:
    """The CUDA kernels one call of ``fn(h)`` launches (memsets and copies between host and device left out)."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(h)
        torch.cuda.synchronize()
    return sorted(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                  and not any(s in e.name.lower() for s in ("memset", "memcpy")))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file for the rows")
    ap.add_argument("--group", type=int, default=128)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("prep_fusion asks what inductor generates for a GPU: run it where CUDA is")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "how": "torch.compile(fullgraph) of producer → preparation (prepare_x: called after the compiled "
                   "producer); kernels of one call (torch.profiler); µs per call under CUDA-graph replay "
                   "(graph_ms, 32 calls a graph)"}
    out, rows = Path(args.out), []
    out.parent.mkdir(parents=True, exist_ok=True)
    for name, k in PRODUCERS.items():
        make, h = producer(name, k, "cuda")
        for variant, prep in VARIANTS.items():
            row = {"producer": name, "K": k, "group": args.group, "variant": variant}
            try:
                if prep is None:
                    made = torch.compile(make, fullgraph=True)

                    def fn(h, made=made):
                        return w4_kernel.prepare_x(made(h), args.group)
                else:
                    fn = torch.compile(lambda h, make=make, prep=prep: prep(make(h), args.group), fullgraph=True)
                for _ in range(3):
                    fn(h)
                names = kernels_of(fn, h)
                us = graph_ms([lambda fn=fn: fn(h)] * 32) * 1000
                row |= {"kernels": names, "n_kernels": len(names), "us": round(us, 2)}
                print(f"{name:9s} {variant:17s} {len(names)} kernels {us:7.2f} µs  {names}", flush=True)
            except Exception as e:   # a variant that does not compile is an answer too: its row says why
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"{name:9s} {variant:17s} failed: {row['error']}", flush=True)
            rows.append(row)
            out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, ensure_ascii=False))   # as it goes
            torch._dynamo.reset()
    print("wrote", out)


if __name__ == "__main__":
    main()
