"""Whole-model decode and prefill speed per weight format, against the bandwidth roofline (CUDA).

    python -m benchmarks.decode --out results/h200/decode.json

An 8B-class architecture (Llama-3.1-8B's config, random weights: speed and memory are real, the
tokens mean nothing) in bf16, W4A16 with our Triton kernel (helpers/w4_kernel.py) and W4A16 with
tinygemm (torchao). Per batch: prefill tokens/s (one forward over ``batch × prompt`` tokens) and
decode tokens/s (``batch`` tokens per step, a static KV cache), each decode step replayed as a CUDA
graph (helpers/cuda_graphs.py), once eagerly (``graphs: false``: the launch overhead) and, with
``--compile BATCHES``, ``torch.compile``d then graphed (``compiled: true``: the norms, rotary embeddings and
activations between the matmuls fused). ``--recipes`` adds what engines do around the kernel
(``helpers.decode_bench.Recipe``: ``fused`` q|k|v and gate|up projections, ``head`` the LM head in the
weight format too, ``attn`` the split-KV decode attention); each row names its recipe.
``roofline_tok_s = batch · copy bandwidth / (weight bytes read + batch · KV bytes at mid-decode)``: every
step must read all weights once (the input embedding table excepted: one row per token,
``decode_bench.bytes_read_per_step``) and each sequence's KV cache.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from helpers import budget, models, timing
from helpers.config import write_json
from helpers.decode_bench import Recipe, build, bytes_read_per_step, run, step_profile
from helpers.measure import module_bytes
from helpers.w4_kernel import one_row_prepared


def kernel_families(family: str, base: dict | None = None) -> list[dict | None]:
    """``--family`` read: a JSON object, or a non-empty list of them, each laid over ``base`` (``--family-from``'s
    family; ``{}`` leaves ``base`` as it is) — one kernel family per build of our W4 format, with its one-row
    kernel written out (``PREPARED``, :func:`helpers.w4_kernel.one_row_prepared`): a row then says which ran,
    whatever ``auto_config``'s default was at its commit (the rule before round 14, the prepared path since)."""
    try:
        extra = json.loads(family)
    except json.JSONDecodeError as e:
        raise ValueError(f"--family must be JSON (an object or a list of objects), got {family!r}: {e}") from None
    extras = extra if isinstance(extra, list) else [extra]
    if not extras or not all(isinstance(e, dict) for e in extras):
        raise ValueError(f"--family takes a JSON object or a non-empty list of objects, got {family!r}")
    return [{"PREPARED": one_row_prepared(f), **(f or {})} for f in ({**(base or {}), **e} for e in extras)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", default="Llama-3.1-8B")
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--formats", default="bf16,W4A16 ours,W4A16 tinygemm")
    ap.add_argument("--recipes", default="plain", help="decode_bench.Recipe labels, comma-separated, run for every "
                                                        "format: plain or switches joined by '+' from fused, "
                                                        "head, attn (e.g. fused+head+attn)")
    ap.add_argument("--family-from", help="a kernels.json whose meta.family our W4 layers use (auto_config)")
    ap.add_argument("--family", default="{}", help='JSON added to the kernel family, e.g. \'{"HALF2": true}\' '
                                                 "for the one-row GEMV's options; a JSON list of such objects "
                                                 "builds our W4 format once per family, in this one process (each "
                                                 "row names its family)")
    ap.add_argument("--profile", nargs="?", const="eager", default="",
                    help="one batch-1 step per format and recipe under torch.profiler: eager (the default), "
                         "compiled, or eager,compiled")
    ap.add_argument("--compile", default="", help="batches (e.g. 1,8) whose decode step is also torch.compiled, "
                                                   "then replayed as a CUDA graph")
    ap.add_argument("--eager", default=None, help="batches also decoded without graphs (default: the first "
                                                  "batch; '' for none)")
    args = ap.parse_args()
    recipes = [Recipe.parse(r) for r in args.recipes.split(",")]
    profiles = [p for p in args.profile.split(",") if p]
    if set(profiles) - {"eager", "compiled"}:
        ap.error(f"--profile takes eager and/or compiled, got {args.profile!r}")
    if not torch.cuda.is_available():
        sys.exit("decode.py measures CUDA decode; there is no CUDA device here")
    batches = [int(b) for b in args.batches.split(",")]
    eager = {int(b) for b in (str(batches[0]) if args.eager is None else args.eager).split(",") if b}
    copy = timing.copy_bandwidth_gbps()
    config = models.architecture_config(args.arch)
    rows = []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_GBps": copy,
            "commit": os.environ.get("COURSE_COMMIT")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():   # after every row: a run stopped by a time limit keeps what it measured
        write_json(out, {"meta": meta, "rows": rows}, indent=1, default=str)
    base = json.loads(Path(args.family_from).read_text())["meta"].get("family") if args.family_from else None
    try:
        families = kernel_families(args.family, base)
    except ValueError as e:
        ap.error(str(e))
    runs = [(f, r, fam) for f in args.formats.split(",") for r in recipes      # a family is ours' alone
            for fam in (families if f == "W4A16 ours" else [None])]
    for fmt, recipe, family in runs:
        if recipe.head and fmt == "bf16":   # its head is already in the 16-bit format
            if not any(not r.head for r in recipes):
                print(f"bf16 has no row: {recipe.label} quantizes the head, which bf16 keeps as it is — add a recipe "
                      "without 'head' (e.g. fused+attn) to --recipes for bf16's row", flush=True)
            continue
        try:
            model = build(args.arch, fmt, family=family, recipe=recipe)
        except Exception as e:  # noqa: BLE001 - record what could not be built (e.g. torchao missing)
            rows.append({"model": args.arch, "format": fmt, "recipe": recipe.label, "family": family,
                         "error": f"{type(e).__name__}: {e}"})
            print(fmt, recipe.label, "failed:", e, flush=True)
            continue
        wbytes, rbytes = module_bytes(model), bytes_read_per_step(model)
        for mode in profiles:
            try:
                prof = step_profile(model, 1, args.prompt, compiled=mode == "compiled")
                rows.append({"model": args.arch, "format": fmt, "recipe": recipe.label, "batch": 1,
                             "profile_of": f"{mode} step", "profile": prof, "commit": meta["commit"],
                             "family": family})
                print(fmt, recipe.label, f"{mode} step:", {k: round(v) for k, v in prof["us"].items()}, "kernels",
                      prof["kernels"], "wall", round(prof["wall_us"]), flush=True)
            except Exception as e:  # noqa: BLE001
                print(fmt, recipe.label, "profile failed:", e, flush=True)
            save()
        for batch in batches:
            kv_mid = budget.kv_bytes(config, args.prompt + args.steps // 2, 1, "bf16")
            roof = batch * timing.roofline_tokens_per_s(rbytes, copy, batch * kv_mid) if batch else 0
            compile_too = str(batch) in args.compile.split(",")
            for graphs, compiled in ((True, False), (False, False)) + (((True, True),) if compile_too else ()):
                if not graphs and batch not in eager:
                    continue
                try:
                    r = run(model, batch, args.prompt, args.steps, graphs, compiled)
                except Exception as e:  # noqa: BLE001 - e.g. a capture that transformers' code breaks
                    r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                row = {"model": f"{args.arch} (random weights)", "format": fmt, "recipe": recipe.label, "batch": batch,
                       "graphs": graphs, "compiled": compiled, "weights_bytes": wbytes, "read_bytes": rbytes,
                       "roofline_tok_s": roof, "prompt": args.prompt, "steps": args.steps, **r,
                       "commit": meta["commit"], "family": family}
                if "decode_tok_s" in r:
                    row["share_of_roofline"] = r["decode_tok_s"] / roof
                rows.append(row)
                print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
                save()
        del model
        torch.cuda.empty_cache()
    meta["kernel_family"] = families[0] if len(families) == 1 else families
    save()
    print("wrote", args.out)


if __name__ == "__main__":
    main()
