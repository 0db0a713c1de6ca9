# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 · The OOM and quantization clinic
#
# A casebook. Each case is a symptom as people report it (with one public thread where it was
# reported), a cell that reproduces it — on your GPU, or on the CPU through the course's budget and
# allocator simulator — the diagnosis from measured numbers, and the fix, measured again. Then the
# source document's own troubleshooting advice, run as written and corrected, and how to share one
# GPU between several people.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/gpu-quant-course/gpu-quant-course/blob/main/notebooks/09_clinic.ipynb)

# %%
# Set-up cell: on Colab (or any kernel without the course) this clones the course and installs it once
# per runtime, keeping the preinstalled torch (scripts/colab_setup.py); where `helpers` imports, it does nothing.
COURSE_REPO = "https://github.com/gpu-quant-course/gpu-quant-course"   # = helpers.config.COURSE_REPO
import importlib.util, os, subprocess, sys
if importlib.util.find_spec("helpers") is None or os.environ.get("COURSE_FORCE_SETUP"):
    repo, dest = os.environ.get("COURSE_REPO", COURSE_REPO), os.environ.get("COURSE_DIR", "/content/course")
    if not os.path.isdir(dest) and subprocess.run(["git", "clone", "-q", "--depth", "1", repo, dest]).returncode:
        raise SystemExit(f"Could not clone {repo}: check the address (COURSE_REPO) and the runtime's internet.")
    if subprocess.run([sys.executable, os.path.join(dest, "scripts", "colab_setup.py")]).returncode:
        raise SystemExit("The course could not be installed: see the message above, then run this cell again.")
    sys.path.insert(0, dest)

# %%
import copy, json
import pandas as pd
import torch
import matplotlib.pyplot as plt
from helpers import (allocator_ops, allocator_replay, allocator_sim, budget, clinic, course_model, device,
                     engine_plan, evaluate, exercises, generation, key_numbers, llm_compressor, loading, measure,
                     models, plots, quant)
from helpers.config import pick, results_path
from helpers.device import has_cuda, get_device
from helpers.qspec import QuantSpec
from helpers.units import GiB, MiB
cuda, dev = has_cuda(), get_device()
REF = results_path()
bench = course_model.setup()          # the real model where there is one (offline SmolLM2 here); see its report
model, tok = bench.model, bench.tokenizer
REAL = bench.quality_meaningful       # quality verdicts below are printed only from real weights on real text
print("quality numbers in this notebook are", "meaningful" if REAL else
      "NOT meaningful (random weights or random text): read them as a demonstration of the method only")

# %% [markdown]
# ## Case 1 — "The model loads, but `generate` runs out of memory"
# *huggingface/transformers#12964 ("Using `model.sample()` and increasing the `max_length` leads to CUDA
# OOM crash": "using ~10 GB for an increase of 300 tokens is... something wrong").* The weights fit;
# the KV cache grows with every token and every sequence in the batch. Predicted for Llama-3.1-8B in
# bf16 on a 24 GB card (the budget of notebook 01), batch 4:

# %%
llama8b = models.architecture_config("Llama-3.1-8B")
card = 24 * 1e9
growth = pd.DataFrame(clinic.generation_oom_point(llama8b, card, 4, [2048, 4096, 8192, 16384])
                      + clinic.generation_oom_point(llama8b, card, 4, [8192, 16384], kv_dtype="fp8"))
print(growth.assign(kv_GB=growth.kv_cache / 1e9, total_GB=growth.total / 1e9)[
    ["context", "batch", "kv_dtype", "kv_GB", "total_GB", "fits"]].round(2).to_string(index=False))

# %% [markdown]
# The KV cache is `2 · layers · kv_heads · head_dim · bytes` per token and sequence (128 KiB for
# this model in bf16): it grows linearly in both context and batch, and past a few thousand tokens
# it, not the weights, decides the fit. The fixes: a shorter context or an FP8 KV cache (half the
# bytes), both in the table, or a smaller batch (the KV is linear in it). On a GPU, the same story measured — decode until
# the OOM under one cap for both caches. The cap is notebook 07's rule: what the bf16 baseline's
# prefill reserved at its peak, plus the bf16 KV of `EXTRA` more tokens — so the prefill always fits
# and the decode runs out somewhere after `EXTRA` tokens (the prefill's freed activations are room too):

# %%
EXTRA, OOM_BATCH, OOM_PROMPT = 64, 64, 128   # many short sequences: the OOM comes after few decode steps
tokens = list(range(0, 16385, 512))
pred = {kv: [budget.budget(llama8b, "bf16", seq_len=max(1, t), batch=4, kv_dtype=kv)["total"] for t in tokens]
        for kv in ("bf16", "fp8")}
fig, axes = plt.subplots(1, 2 if cuda else 1, figsize=(12 if cuda else 6, 3), squeeze=False)
ax = axes[0][0]
for kv, ys in pred.items():
    ax.plot(tokens, [y / 1e9 for y in ys], label=f"{kv} KV (predicted)")
ax.axhline(card / 1e9, color="red", linestyle="--", linewidth=1, label="24 GB card")
ax.set(xlabel="context (tokens), batch 4", ylabel="GB", title="Llama-3.1-8B bf16: predicted total")
ax.legend(fontsize=8)
if cuda:
    gm = models.model_from_config("SmolLM2-135M", device="cuda", dtype=torch.bfloat16)
    case1 = generation.oom_points(gm, batch=OOM_BATCH, prompt_len=OOM_PROMPT, extra=EXTRA, max_new=4096,
                                  kinds=("baseline", "fp8-e4m3"), traces=True)
    for r in case1["rows"]:
        print(f"{r['kv']:>9}: decoded {r['generated']} tokens" + (" before running out" if r["oom"] else " (no OOM)"))
    key_numbers.record("09_clinic", case1={"cap_gib": case1["cap_gib"],
                                           "rows": [{k: v for k, v in r.items() if k != "trace"} for r in case1["rows"]]})
    plots.memory_lines({f"{r['kv']} cache": r["trace"] for r in case1["rows"]}, ax=axes[0][1],
                       cap=case1["cap_gib"] * GiB, xlabel=f"decoded tokens (batch {OOM_BATCH}, prompt {OOM_PROMPT})",
                       title=f"SmolLM2 on this GPU: allocated until the OOM (cap {case1['cap_gib']:.2f} GiB)")
    del gm
    measure.free_memory()
else:
    print("No CUDA device: the OOM point is predicted (left), not measured.")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## Case 2 — "Reserved but unallocated is huge" / "`expandable_segments` didn't help"
# The OOM message itself suggests `expandable_segments:True` whenever reserved-but-unallocated memory
# is large. Whether it helps depends on **what separates the free bytes**. Two workloads of the same
# shape — a cached segment carved into blocks, every other block freed, then a request of two blocks
# under a cap of the arena plus one block — with 64 MiB holes and with 16 MiB holes, in both modes, in
# the allocator simulator (its agreement with the real allocator is measured in notebook 02) and, on a
# GPU, on the real allocator beside it:

# %%
rows2, traces2 = [], {}
for name, (ops, cap) in clinic.holes_sequences().items():
    for exp in (False, True):
        r = clinic.simulated_oom(ops, cap, expandable=exp)
        real = allocator_replay.run_real(ops, cap, exp) if cuda else None
        rows2.append({"sequence": name, "expandable_segments": exp, "oom (simulator)": r["oom"],
                      "oom (this GPU)": real["oom"] if real else None,
                      "reserved_MiB": r["reserved"] / MiB, "allocated_MiB": r["allocated"] / MiB,
                      "gap_MiB": (r["reserved"] - r["allocated"]) / MiB, "diagnose_oom": r["verdict"]})
        traces2[f"{name}, {'expandable' if exp else 'default'}"] = [t[1] for t in r["trace"]]
table2 = pd.DataFrame(rows2)
key_numbers.record("09_clinic", case2=table2)
display(table2.round(1))
plots.memory_lines(traces2, unit=MiB, xlabel="allocator op", title="reserved memory per op (simulator)")
plt.show()

# %% [markdown]
# Read it row by row. In both workloads `reserved − allocated` exceeds the request and the default
# allocator runs out: the free bytes are holes *between live blocks of one segment*, which nothing can
# merge — `diagnose_oom` says "fragmentation". With `expandable_segments` the allocator maps physical
# pages into one large virtual segment (20 MiB pages in the large pool). Under pressure it **unmaps the
# whole free pages inside the holes** and maps pages again where the request fits (the end of the
# segment), so memory the holes held becomes usable: the 64 MiB holes each contain whole pages, and
# the request succeeds. A 16 MiB hole contains no whole 20 MiB page — nothing can be unmapped — so
# the same workload with smaller holes runs out in both modes. Expandable segments rescue holes larger
# than a page; for smaller ones the fixes are in the program: free (or never create) long-lived small
# tensors between big ones, allocate long-lived buffers first, keep shapes constant.
#
# ### `max_split_size_mb` together with `expandable_segments`
# *pytorch/pytorch#123548 ("An error occurs when 'max_split_size_mb' and 'expandable_segments' are
# enabled at the same time"): its reproducer (2026-08-13) has reserved memory growing by ~138 MiB a
# cycle while allocated stays small, when a small allocation stays alive after the large ones.* The
# mechanism, in `get_free_block`: a request at or above `max_split_size` may not take a free block 20
# MiB or more larger than itself, and that filter also applies inside an expandable segment — so a
# freed pair of big blocks, fenced off from the segment's tail by a live small block, is skipped by the
# next cycle's requests, which map new pages instead. pytorch/pytorch#193400 ("Let expandable segments
# reuse free blocks larger than max_split_size") is an open pull request, not a release. Eight cycles
# of two 138 MiB tensors and a 2 MiB fence, in the simulator and (on a GPU) on this machine's torch:

# %%
ops_f = allocator_ops.fenced_cycles_sequence(cycles=8)
rows_f = []
for label, exp, split in (("default", False, None), ("max_split_size_mb:128", False, 128),
                          ("expandable_segments", True, None), ("both", True, 128)):
    sim = allocator_sim.simulate(ops_f, expandable=exp, max_split_size=split * MiB if split else None)
    real = allocator_replay.run_real(ops_f, None, exp, max_split_mb=split) if cuda else None
    rows_f.append({"PYTORCH_CUDA_ALLOC_CONF": label, "reserved_MiB (simulator)": sim["reserved"] / MiB,
                   "reserved_MiB (this GPU)": real["reserved"] / MiB if real else None,
                   "allocated_MiB": sim["allocated"] / MiB})
fenced = pd.DataFrame(rows_f)
key_numbers.record("09_clinic", fenced_cycles=fenced)
display(fenced.round(0))
if cuda:
    grows = fenced.iloc[3]["reserved_MiB (this GPU)"] > 2 * fenced.iloc[:3]["reserved_MiB (this GPU)"].max()
    print(f"torch {torch.__version__}:", "the reserved memory still grows with both settings (the report holds)"
          if grows else "no growth with both settings here (the report does not reproduce on this torch)")

# %% [markdown]
# ## Case 3 — "`nvidia-smi` shows more than `memory_allocated`; `empty_cache()` freed nothing"
# *pytorch/pytorch#37250 ("Inconsistency between GPU memory usage in torch.cuda.memory_summary and
# nvidia-smi").* Four numbers, four meanings: `memory_allocated` (live tensors), `memory_reserved`
# (the allocator's cached segments), what the driver reports for **this process** (NVML by pid, the
# number `nvidia-smi` lists per process: reserved + the CUDA context + libraries' workspaces), and the
# **device's** used memory (`mem_get_info`: every process on the card — on a shared GPU, mostly other
# people's). `empty_cache()` returns only segments with **no** live block:

# %%
ec = allocator_sim.simulate(allocator_ops.empty_cache_sequence())
before = allocator_sim.simulate(allocator_ops.empty_cache_sequence()[:-1])
print(f"simulator: reserved before empty_cache {before['reserved'] / MiB:.0f} MiB, after {ec['reserved'] / MiB:.0f} MiB, "
      f"allocated {ec['allocated'] / MiB:.0f} MiB: one 64 MiB tensor keeps its whole {ec['reserved'] / MiB:.0f} MiB segment")
if cuda:
    keep = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    big = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
    del big
    v0 = measure.views()
    torch.cuda.empty_cache()
    v1 = measure.views()
    show = lambda v: "unavailable" if v is None else f"{v / MiB:.0f} MiB"
    for k, label in (("allocated", "allocated (live tensors)"), ("reserved", "reserved (this allocator)"),
                     ("process", "this process (NVML)"), ("device_used", "whole device (mem_get_info)")):
        print(f"{label:>30}: {show(v0[k])} → {show(v1[k])}")
    print("this process's memory comes from:", v1["process_source"])
    del keep
    measure.free_memory()

# %% [markdown]
# ## Case 4 — "vLLM: max_model_len is larger than the KV cache can hold"
# *vllm-project/vllm#5847 ("OutOfMemoryError when loading a small model with a huge context length").*
# A serving engine plans its KV pool at start-up (notebook 08). Llama-3.1-8B's full context (its
# config's `max_position_embeddings`, printed below; vLLM refuses a `--max-model-len` above it before it
# plans anything) on a 24 GB card with vLLM's default utilization. The card is taken at its datasheet's
# 24 × 10⁹ bytes (22.35 GiB); a real one reports a little less — `torch.cuda.mem_get_info()` tells:

# %%
print("Llama-3.1-8B max_position_embeddings:", llama8b.max_position_embeddings)
prof = engine_plan.MemoryProfile(total=24e9, utilization=0.9, weights=budget.weight_bytes(llama8b, "bf16"),
                                 activation_peak=1.3 * GiB, non_torch=0.1 * GiB)
per_token = engine_plan.kv_bytes_per_token(llama8b)
for label, p, L, kv in (("as started", prof, 131072, "auto"), ("--max-model-len 32768", prof, 32768, "auto"),
                        ("--kv-cache-dtype fp8 --max-model-len 65536", prof, 65536, "fp8"),
                        ("--kv-cache-dtype fp8 --max-model-len 131072", prof, 131072, "fp8")):
    try:
        r = engine_plan.plan(p, engine_plan.kv_bytes_per_token(llama8b, kv), L)
        print(f"{label}: starts — {r['blocks']} blocks, {r['concurrency']:.2f} sequences of {L} tokens")
    except engine_plan.EngineStartupError as e:
        print(f"{label}: refuses to start —", str(e)[:230], "…")

# %% [markdown]
# The weights are the budget's bf16 bytes for this config (the 14.96 GiB vllm-project/vllm#12330's log
# shows); the activation peak and non-torch memory are assumptions for illustration (of the order of a
# 2048-token profile; notebook 08 measures both). Three knobs: `--max-model-len` (the longest sequence you promise to serve),
# `--kv-cache-dtype fp8` (half the bytes per token), `--gpu-memory-utilization` (a bigger share of the
# card; leaves less for anything else on it) — plus a quantized checkpoint (smaller weights).
#
# ### Repair exercise 1: the KV pool
# This function should return how many 16-token blocks vLLM can make. It forgets something.

# %%
def kv_pool_blocks(usable, weights, activation_peak, non_torch, bytes_per_token, block_size=16):
    return int((usable - weights - non_torch) // (bytes_per_token * block_size))   # broken: fix me

exercises.check("kv_pool_blocks", kv_pool_blocks)

# %% [markdown]
# ## Case 5 — "Out of memory while *loading*"
# *huggingface/transformers#34743 ("High cpu memory usage as bf16 model is auto loaded as fp32").* Two
# classics. First, the dtype: transformers 4.x loaded weights in fp32 unless told otherwise — twice a
# bf16 checkpoint (huggingface/transformers#36567: "Previously (v4.46.3 …) torch_dtype in the config was
# ignored, meaning that model weights would get loaded in fp32 by default"). Transformers 5 defaults to
# `dtype="auto"`: the checkpoint's own dtype. What the installed version does, measured on the
# course's bf16 checkpoint:

# %%
import transformers
from transformers import AutoModelForCausalLM
ckpts = llm_compressor.demo_checkpoints("SmolLM2-135M", QuantSpec(4, 64))
for kw in ({}, {"dtype": torch.float32}):
    m = AutoModelForCausalLM.from_pretrained(ckpts["bf16"], **kw)
    p = next(m.parameters())
    print(f"transformers {transformers.__version__}, from_pretrained({', '.join(f'{k}={v}' for k, v in kw.items()) or 'no dtype'}):"
          f" {p.dtype}, {sum(t.numel() * t.element_size() for t in m.parameters()) / MiB:.0f} MiB of parameters")
    del m, p

# %% [markdown]
# Second, loading a state dict next to an already-built model holds two copies. Measured on the same
# checkpoint (the measurement notebook 08 made, reused — not repeated):

# %%
peaks = pd.DataFrame(loading.remembered_load_peaks(ckpts["bf16"], "cpu", torch.bfloat16))
peaks.assign(peak_MiB=peaks.peak_bytes / MiB)[["load", "device", "peak_MiB", "peak_over_params", "seconds"]].round(2)

# %% [markdown]
# Fixes: `from_pretrained(..., dtype="auto")` (or the dtype you want), safetensors checkpoints (memory-
# mapped, no second copy), `device_map="auto"` to place layers straight on the GPU (and offload what
# does not fit), and one model per process — two workers loading the same model is two copies.
#
# ## Case 6 — "My 4-bit model uses more memory than fp16"
# *vllm-project/vllm#2948 ("AWQ Quantization Memory Usage": the AWQ model used about as much GPU memory
# as the fp16 one).* Three measured reasons:

# %%
parts = []
for arch in ("SmolLM2-135M", "Llama-3.1-8B"):
    c = models.architecture_config(arch)
    parts.append({"model": arch, "bf16_GB": budget.weight_bytes(c, "bf16") / 1e9, "int4_g128_GB": budget.weight_bytes(c, "int4") / 1e9,
                  "int4/bf16": budget.weight_bytes(c, "int4") / budget.weight_bytes(c, "bf16")})
print(pd.DataFrame(parts).round(3).to_string(index=False))
w4 = engine_plan.plan(engine_plan.MemoryProfile(80 * GiB, 0.9, budget.weight_bytes(llama8b, "int4"), 1.3 * GiB, 0.5 * GiB), per_token, 8192)
bf = engine_plan.plan(engine_plan.MemoryProfile(80 * GiB, 0.9, budget.weight_bytes(llama8b, "bf16"), 1.3 * GiB, 0.5 * GiB), per_token, 8192)
print(f"vLLM on an 80 GiB card, utilization 0.9: both engines hold {0.9 * 80:.0f} GiB; the W4 one has "
      f"{w4['kv_pool'] / GiB:.1f} GiB of KV pool instead of {bf['kv_pool'] / GiB:.1f}")

# %% [markdown]
# 1. **Embeddings and the LM head stay 16-bit.** On a small model with a large vocabulary they are a
#    big share (the `int4/bf16` column: far above the 0.25 of 4 bits over 16 for SmolLM2, and still
#    above it for an 8B model, whose embedding and LM head stay 16-bit too).
# 2. **Engines pre-allocate.** vLLM takes `gpu_memory_utilization × total` whatever the weights;
#    quantization moves memory from weights to the KV pool (more concurrent sequences), it does not
#    make `nvidia-smi` smaller. Lower `--gpu-memory-utilization` for that.
# 3. **Dequantization buffers.** A fake-quant or fallback path dequantizes a layer's weight to 16-bit
#    for each call: a transient dense copy of the largest layer (`helpers.w4_linear.W4Linear` does so
#    above 16 rows — measured in notebook 08). Packed kernels avoid it.
#
# ## Case 7 — "OOM while quantizing with AWQ / GPTQ"
# *vllm-project/llm-compressor#1409 ("[AWQ] Insane memory requirement: over 900GB for 32B model").*
# What calibration holds: the activations of the calibration set at the layer being quantized. A
# quantizer that caches every layer's inputs at once multiplies that by the number of layers:

# %%
big = models.architecture_config("Llama-2-70B")
cal = []
for n, L in ((128, 512), (256, 2048)):
    for hold in ("sequential", "all_layers"):
        cal.append({"samples × tokens": f"{n} × {L}", "hold": hold,
                    "GiB (Llama-2-70B shapes, bf16)": clinic.calibration_held_bytes(big, n, L, 2, hold) / GiB})
print(pd.DataFrame(cal).round(1).to_string(index=False))
qfile = REF / "h200" / "quantizers.json"
if qfile.exists():
    q = pd.DataFrame(json.loads(qfile.read_text()))
    q = q[q.method != "baseline"]
    cols = [c for c in ("model", "method", "impl", "calib_tokens", "seconds", "peak_bytes", "measured") if c in q]
    print("\nmeasured on the course's H200 (results/h200/quantizers.json):")
    print(q[cols].assign(peak_GB=q.peak_bytes / 1e9).drop(columns="peak_bytes").round(2).to_string(index=False))

# %% [markdown]
# Fixes: a sequential pipeline (llm-compressor's default; the course's GPTQ/AWQ are sequential too),
# fewer or shorter calibration samples — the GPTQ paper calibrated on 128 random 2048-token segments
# of C4 (Frantar et al. 2023, §5 "Setup"), llm-awq's `run_awq` defaults to 512 samples of 512 tokens
# from the Pile validation set; the course calibrates on 128 × 512 — offloading cached activations to
# CPU (`AWQModifier(offload_device=...)`), one layer on the GPU at a time.
#
# ## Case 8 — "The FP8 KV cache hurts quality"
# *sgl-project/sglang#22671 (FP8 KV cache on GLM-5.1-FP8: benchmark scores fell far below bf16);
# sgl-project/sgl-cookbook#237 names the cause: those FP8 checkpoints carry no calibrated
# `k_scale`/`v_scale`, and "SGLang falls back to a scale of 1.0 (with a warning), which can cause
# noticeable accuracy degradation on reasoning-heavy tasks".* An FP8 KV cache needs a scale per tensor
# (or head); without calibrated ones, vLLM and SGLang use **1.0**. Measured teacher-forced on the text:
# calibrated per-head scales (the course's `fp8-e4m3`) against scale 1.0 (`-unit`):

# %%
n_ctx, n_cont = pick(full=(512, 128), ci=(96, 16))
ids = bench.eval_ids
prompts = torch.stack([ids[i * 1000:i * 1000 + n_ctx] for i in range(4)])
cont = torch.stack([ids[i * 1000 + n_ctx:i * 1000 + n_ctx + n_cont] for i in range(4)])
kvq = pd.DataFrame(generation.kv_quality(model, prompts.to(dev), cont.to(dev),
                                         ["baseline", "fp8-e4m3", "fp8-e4m3-unit", "fp8-e5m2", "fp8-e5m2-unit"]))
key_numbers.record("09_clinic", case8=kvq)
display(kvq.round(5))
kv_stats = clinic.kv_magnitudes(model, prompts.to(dev))
print(f"this model's K/V: max |K| = {kv_stats['max_abs_k']:.1f}, max |V| = {kv_stats['max_abs_v']:.1f} "
      f"(e4m3 saturates at 448); share below e4m3's smallest normal 2^-6: K {kv_stats['k_subnormal']:.1%}, "
      f"V {kv_stats['v_subnormal']:.1%}")
if REAL:
    unit_worse = kvq.set_index("kv_format").mean_kl["fp8-e4m3-unit"] > kvq.set_index("kv_format").mean_kl["fp8-e4m3"]
    print("scale 1.0 is", "worse" if unit_worse else "not worse", "than calibrated scales for e4m3 on this model")
else:
    print("random weights: no verdict on scale 1.0 from these numbers; the real model's, recorded on a CPU:")
    rec = REF / "cpu" / "clinic_quality.json"
    display(pd.DataFrame(json.loads(rec.read_text())["case8"]).round(5) if rec.exists() else "not recorded yet")

# %% [markdown]
# An FP8 number keeps the same *relative* precision anywhere in its normal range (e4m3: 2^-6 to 448),
# so a scale matters at the two ends only: values above 448 saturate, values below 2^-6 fall into the
# subnormals and lose precision. The printed magnitudes say where this model's K and V sit, and so
# whether scale 1.0 costs anything here — on models whose keys reach the hundreds (or whose values
# are tiny), it does, which is why reports disagree. The fix:
# calibrated scales (llm-compressor writes `k_scale`/`v_scale` into the checkpoint;
# `--calculate-kv-scales` in vLLM), or e5m2 (more range, less precision), or keep a bf16 cache for
# the layers that suffer.
#
# ## Case 9 — "My perplexity differs from the paper (or from another library)"
# *EleutherAI/lm-evaluation-harness#2301: Llama-2-7B on WikiText-2 gave 8.71 in lm-eval, papers
# report 5.47.* Same model, same text, five protocols (notebook 06 teaches why each one moves the
# number):

# %%
n_tok = pick(full=16384, ci=1024)
text_words = len(" ".join(tok.batch_decode(ids[:n_tok].reshape(-1, 256))).split()) if tok is not None else None
protocols = {"512 non-overlapping": dict(seq_len=512), "256 non-overlapping": dict(seq_len=256),
             "512, stride 256": dict(seq_len=512, stride=256),
             "512 + BOS": dict(seq_len=512, bos_token_id=getattr(tok, "bos_token_id", None) or 0)}
rows9 = []
for name, p in protocols.items():
    r = evaluate.perplexity(model, ids, max_tokens=n_tok, progress=False, **p)
    rows9.append({"protocol": name, "ppl (per token)": r["ppl"], "scored_tokens": r["scored_tokens"], "nll": r["nll"]})
if text_words:
    r0 = rows9[0]
    rows9.append({"protocol": "512, per *word* (lm-eval's word_perplexity)",
                  "ppl (per token)": float(torch.exp(torch.tensor(r0["nll"] * r0["scored_tokens"] / (text_words * r0["scored_tokens"] / n_tok)))),
                  "scored_tokens": r0["scored_tokens"], "nll": None})
table9 = pd.DataFrame(rows9)
key_numbers.record("09_clinic", case9=table9)
table9.round(3)

# %% [markdown]
# Window length, overlap (stride), a BOS token, and per-token vs per-word normalisation each change
# the number — the last one by far the most (a word is more than one token). A discrepancy is a
# protocol question first: report the window, stride, BOS, split, and the unit, and compare only like
# with like (the GPTQ and AWQ papers: WikiText-2 test, 2048-token non-overlapping windows, per token).
#
# ## Case 10 — "No FP8 on my T4" / "my MIG slice reports the whole GPU"
# *vllm-project/vllm#4327 ("The quantization method fp8 is not supported for the current GPU. Minimum
# capability: 90. Current capability: 86").* FP8 *matmuls* need FP8 tensor cores (compute capability
# ≥ 8.9); an FP8 *KV cache* does not: it is a storage format, converted to 16-bit inside the attention
# kernel — vLLM's `fp8_e5m2` cache came with vllm-project/vllm#2279, tested on an A100 (8.0), and
# vllm-project/vllm#4827 confirms it runs on an A10 ("the FP8 KV Cache just does
# compression/decompression and doesn't require any real hardware support").

# %%
cap_here = torch.cuda.get_device_capability() if cuda else None
print("this device:", clinic.fp8_support(cap_here))
for name, cc in (("T4", (7, 5)), ("A100", (8, 0)), ("L4 / RTX 4090", (8, 9)), ("H100 / H200", (9, 0))):
    print(f"{name:14s}", clinic.fp8_support(cc))
print("NVML:", device.nvml_info() or "not available here (no NVIDIA driver / nvidia-ml-py)")
if cuda:
    free, total = torch.cuda.mem_get_info()
    print(f"what this process sees: total {total / GiB:.1f} GiB, free {free / GiB:.1f} GiB")

# %% [markdown]
# On a MIG slice, `torch.cuda.mem_get_info()` and `get_device_properties().total_memory` report the
# **slice** (e.g. 40 GiB of an 80 GiB A100), while `nvidia-smi` without `-i <MIG device>` shows the
# whole card and NVML reports `mig: enabled` for the parent GPU. If a tool reports the whole card
# inside a slice, it is reading the parent device through NVML — trust what CUDA reports.
#
# ## The source document's troubleshooting, run and corrected
# ### "Garbled output after quantization"
# The seed's checklist: print `quantization_config`, assert `tokenizer.vocab_size ==
# model.config.vocab_size`, and "increase group_size (128 → 256) or the precision". First, what
# garbage looks like — the real model, round-to-nearest at 4, 3 and 2 bits (group 64), greedy:

# %%
prompt = ids[2000:2032][None]
gen_rows = []
for label, bits in (("reference (dequantized Q4_1)", None), ("W4 g64", 4), ("W3 g64", 3), ("W2 g64", 2)):
    m = copy.deepcopy(model)
    if bits:
        quant.rtn_model(m, QuantSpec(bits, 64))
    out = m.generate(prompt.to(dev), max_new_tokens=20, do_sample=False, pad_token_id=0)
    ppl = evaluate.perplexity(m, ids, seq_len=256, max_tokens=pick(full=8192, ci=512), progress=False)["ppl"]
    gen_rows.append({"model": label, "ppl": ppl,
                     "continuation": tok.decode(out[0, prompt.shape[1]:]) if tok is not None else out[0, -20:].tolist()})
    del m
garbled = pd.DataFrame(gen_rows)
key_numbers.record("09_clinic", garbled=garbled)
pd.set_option("display.max_colwidth", 90)
garbled.round(2)

# %% [markdown]
# The checks that catch it are a short generation and a perplexity jump (the table), not the seed's
# vocabulary assert. That assert fails on healthy models: embedding tables are padded (Qwen2.5-0.5B's
# config has `vocab_size` 151,936 rows, its tokenizer 151,665 entries and `tokenizer.vocab_size`
# 151,643 — Qwen2.5-0.5B `config.json` and `tokenizer_config.json` on the hub), and special tokens
# are not counted by `vocab_size`. Shown on our model, padded the way training frameworks do:

# %%
padded = copy.deepcopy(model)
padded.resize_token_embeddings(model.config.vocab_size + 64, pad_to_multiple_of=64)
same = torch.equal(padded(prompt.to(dev)).logits[..., :model.config.vocab_size].argmax(-1),
                   model(prompt.to(dev)).logits.argmax(-1))
tok_len = len(tok) if tok is not None else model.config.vocab_size
tok_vs = getattr(tok, "vocab_size", tok_len)
print(f"padded embedding rows {padded.get_input_embeddings().weight.shape[0]}; greedy tokens unchanged: {same}")
print("unpadded:", clinic.vocab_checks(tok_len, tok_vs, model.config.vocab_size, int(ids.max())))
print("padded:  ", clinic.vocab_checks(tok_len, tok_vs, padded.get_input_embeddings().weight.shape[0], int(ids.max())))
print("Qwen2.5-0.5B (hub numbers):", clinic.vocab_checks(151665, 151643, 151936, 151664))
del padded

# %% [markdown]
# ### Repair exercise 2: the right vocabulary check
# Replace the seed's equality with a check that passes on padded tables and fails only when the
# tokenizer can produce an id that has no embedding row.

# %%
def correct_vocab_check(tokenizer_len, embedding_rows):
    return tokenizer_len == embedding_rows   # the seed's check: fix me

exercises.check("correct_vocab_check", correct_vocab_check)

# %% [markdown]
# ### "Use group 256 instead of 128 if quality drops"
# Larger groups share one scale among more weights: coarser, not safer. This model's linears have
# 576 or 1536 input columns; 128 and 256 do not divide 576, so the groups measured are 32, 64, 192 and
# a whole row (per channel), RTN at 3 bits where the effect is visible:

# %%
rows_g = clinic.group_sweep(model, ids, bits=3, groups=(32, 64, 192, None), max_tokens=pick(full=8192, ci=512))
groups = pd.DataFrame(rows_g)
key_numbers.record("09_clinic", groups=groups)
display(groups.round(3))
if not REAL:
    rec = REF / "cpu" / "clinic_quality.json"
    print("random weights: the column above means nothing; the real model's, recorded on a CPU (results/cpu):")
    display(pd.DataFrame(json.loads(rec.read_text())["groups"]).round(3) if rec.exists() else "not recorded yet")

# %% [markdown]
# Bigger groups save a fraction of a bit per weight and cost quality (the perplexity column grows
# with the group on real weights). If quality drops, go to *smaller* groups, more bits, or a better
# algorithm (GPTQ/AWQ, notebooks 04–05).
#
# ### "Slow loading": see case 5 (the same measurement).
# ### "Task-specific drops"
# A task built from the text itself: show a passage, then show it again, and score next-token
# accuracy on the second copy — the model only has to copy from its context (what induction heads in
# attention do). Two W3 variants that damage different parts: only the attention projections, only
# the MLPs. Their perplexity and their copy accuracy:

# %%
task_rows = clinic.task_drops(model, ids, QuantSpec(3, 64), n=pick(full=32, ci=12), span=48,
                             max_tokens=pick(full=8192, ci=512))
task = pd.DataFrame(task_rows)
key_numbers.record("09_clinic", copy_task=task)
display(task.round(3))
if REAL:
    print(clinic.rankings(task_rows))
else:
    rec = REF / "cpu" / "clinic_quality.json"
    print("random weights: no ranking from these numbers; the real model's, recorded on a CPU (results/cpu):")
    if rec.exists():
        real_task = json.loads(rec.read_text())["copy_task"]
        display(pd.DataFrame(real_task).round(3))
        print(clinic.rankings(real_task))

# %% [markdown]
# `first_copy_acc` is ordinary next-token accuracy; `second_copy_acc` is the copy task. When the two
# rankings printed above disagree, perplexity has hidden a task-specific drop: quantizing the
# attention projections hurts copying from context (retrieval, in-context examples, long-document
# answers) more than its perplexity suggests — the seed's "evaluate on your own task" advice,
# measured (on the real model; on random weights the live columns mean nothing and the recorded ones
# are shown).
#
# ### `diagnose_oom` on real out-of-memory errors
# On a GPU, real OOMs — loading, prefill, decode, fragmentation, and a device another process has
# filled — caught and diagnosed at the moment they happen (the decision tree of notebook 02). Each
# diagnosis is given what the phase *needs* by the budget: at the instant of a load or decode OOM the
# heap can look fragmented (freed temporaries, a cache grown by copying) on the way to a wall it would
# hit anyway — without the budget's number the tree called two of three such cases "fragmentation"
# on the course's H200 (`results/h200/diagnose_without_need_2026-12-01.json`). The tree first asks
# *who refused*: this process's cap (then other processes are not the cause, however full the card),
# or the device itself (then it asks NVML how much the *other* processes hold). The course ran the
# same cases alone on an H200 and beside a second process holding 8 GiB
# (`python -m benchmarks.clinic`, `results/h200/clinic.json`); on the CPU the tree runs on the
# simulator's numbers at the failing allocation (the `diagnose_oom` column of case 2).
# The device-full case fills the card for a moment, to its last 2 GiB: on a shared card that is
# everyone's memory. Under a participant's cap (`COURSE_GPU_CAP_GIB`), or where NVML shows other
# processes holding more than 1 GiB of the card, the cell leaves it out and says why — the course's
# workshop rehearsal found it the hard way, four participants filling one H200 at once
# (docs/workshop.md).

# %%
if cuda:
    small = models.model_from_config("SmolLM2-135M", device="cuda", dtype=torch.bfloat16)
    refused = clinic.why_not_fill_the_card()     # a shared card: the device-full case would take others' memory
    if refused:
        print("the device-full case is left out:", refused)
    scenarios = clinic.real_oom_scenarios(small) + ([] if refused else [clinic.device_full_scenario()])
    diag = pd.DataFrame(clinic.diagnose_real_ooms(scenarios))
    del small
    measure.free_memory()
    key_numbers.record("09_clinic", diagnose_real=diag)
    show = diag.assign(process_GiB=diag.process_bytes / GiB, others_GiB=diag.others_bytes / GiB)
    display(show[["scenario", "oom", "verdict", "expected", "ok", "process_GiB", "others_GiB"]].round(2))
    print("per-process memory from:", diag.source.dropna().iloc[0] if diag.source.notna().any() else "n/a")
else:
    print("No CUDA device: the decision tree ran on simulated OOMs in case 2.")
rec = REF / "h200" / "clinic.json"
if rec.exists():
    ref = pd.DataFrame(json.loads(rec.read_text())["rows"])
    print("recorded on the course's H200 (results/h200/clinic.json):")
    display(ref[["run", "scenario", "verdict", "expected", "ok"]])

# %% [markdown]
# ## Sharing one GPU: MIG, MPS and per-process caps
#
# | | memory isolated | compute isolated | a fault in one kills the others | change at run time | needs admin |
# |---|---|---|---|---|---|
# | **MIG** (A100/H100/H200) | yes, hardware slices | yes (own SMs, L2 slice) | no | yes, per instance: an instance can be created or destroyed while the others run (only the one being changed must be idle); turning MIG mode on or off needs the whole GPU idle | yes |
# | **MPS** | address spaces yes (since Volta each client has its own); capacity no — a client can take all memory unless `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` caps it | a share of threads (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`); kernels of different clients run **concurrently** | yes | per client at start | no: a user can start the control daemon for their own processes |
# | **per-process allocator cap** (`helpers.device.limit_memory`) | PyTorch's allocator only (not the context, not other libraries); lifted by any `set_per_process_memory_fraction(1.0)` in the participant's own code | no | no | yes | no |
#
# Sources: NVIDIA "Multi-Instance GPU User Guide" (docs.nvidia.com/datacenter/tesla/mig-user-guide),
# NVIDIA "Multi-Process Service" documentation (docs.nvidia.com/deploy/mps), PyTorch
# `torch.cuda.set_per_process_memory_fraction`. The source document calls MIG partitions static
# ("creating/destroying instances requires terminating all GPU processes") and MPS "time-division
# multiplexing" of one shared CUDA context: both are corrected in the table — without MPS, processes
# on one GPU get time slices; MPS is what lets their kernels run side by side. What this notebook
# cannot show: turning MIG on (`sudo nvidia-smi -i 0 -mig 1`, then creating instances) needs
# administrator rights on the host — the course's machines do not grant them. From Python you can
# *detect* it (NVML `mig` above). MPS, measured on the course's H200 (`python -m benchmarks.clinic
# --mps`: two processes that each launch a stream of one-block kernels, alone, together, and together
# under an MPS daemon of their own):

# %%
rec = REF / "h200" / "clinic.json"
mps = json.loads(rec.read_text()).get("mps") if rec.exists() else None
if mps:
    for r in mps:
        procs = r.get("procs", [])
        print(f"{r['setting']:36s}", r.get("error") or ", ".join(f"{p['seconds']:.2f} s" for p in procs)
              + (f"  (wall {procs[0]['wall_seconds']:.2f} s)" if procs else ""))
else:
    print("not recorded yet: python -m benchmarks.clinic --mps on a GPU writes it")

# %% [markdown]
# The workshop recipe — N participants, one GPU, one cap each — checked by running four processes
# at once: two stay inside their caps, one asks for more than its cap, and one asks for more and
# lifts its own cap first, as a participant's code may.

# %%
if cuda:
    share = pd.DataFrame(clinic.shared_gpu_demo([(4.0, 2.0), (4.0, 3.0), (4.0, 8.0), (4.0, 8.0)], lift=(3,)))
    key_numbers.record("09_clinic", shared_gpu=share)
    display(share[["participant", "cap_gib", "wanted_gib", "lifted", "got_gib", "oom", "non_torch_bytes"]])
    nt = share.non_torch_bytes.dropna()
    if len(nt):
        n_people, card_gib = 4, torch.cuda.get_device_properties(0).total_memory / GiB
        per = card_gib / n_people - nt.max() / GiB
        print(f"measured outside each allocator: up to {nt.max() / GiB:.2f} GiB per process → on this "
              f"{card_gib:.0f} GiB card, {n_people} participants get a cap of card/N − that = {per:.1f} GiB each")
else:
    print("No CUDA device: the recipe runs only on a GPU (see README: the course's run on the H200).")

# %% [markdown]
# The process that asked for 8 GiB under a 4 GiB cap gets `OutOfMemoryError`; the others get what
# they asked for and never notice — except the last one: it set its fraction back to 1.0 and took 8
# GiB. A cap is a promise the participant's own code can break; only MIG (or a container's device
# limit) enforces memory against the participant. A cap limits PyTorch's allocator: each process still
# pays its own memory outside it (the CUDA context, loaded kernels, library handles — measured above
# per process, and in notebook 01), so a participant's cap is `card / N` minus that measured amount,
# not a guessed margin. In a workshop set it in each participant's environment, `COURSE_GPU_CAP_GIB=…`,
# before Jupyter starts: `helpers` applies it on import and no later `helpers.device.limit_memory`
# lifts it (docs/workshop.md).
#
# On Kubernetes, the NVIDIA device plugin exposes whole GPUs as `nvidia.com/gpu` and MIG slices as
# their own resources (NVIDIA k8s-device-plugin README, "MIG support"; GPU Operator docs, "GPU
# Operator with MIG"):
#
# ```yaml
# resources:
#   limits:
#     nvidia.com/gpu: 1            # a whole GPU
#     # nvidia.com/mig-3g.40gb: 1  # or one MIG slice (the "mixed" strategy)
# ```
#
# ### Repair exercise 3: the loop that frees nothing
# The seed's fragmentation loop (notebook 02) runs `for big, small in tensors: del big` — deleting the
# loop variable, while the list still holds every tensor. Make this function really free them.

# %%
def free_after_loop(tensors):
    for t in tensors:
        del t      # frees nothing: fix me

exercises.check("free_after_loop", free_after_loop)

# %% [markdown]
# ### Exercise 4: diagnose from a memory snapshot
# A memory snapshot (`torch.cuda.memory_snapshot()`, or the simulator's) lists the allocator's
# segments and their blocks, each `active_allocated` or free. Write the diagnosis: given a snapshot,
# the request and the cap, return `"fits"` (a free block holds it, or a new segment stays under the
# cap), `"fragmentation"` (it fails although the free cached bytes add up to it) or `"too-big"`. It is
# checked on six snapshots the simulator makes (holes, a full cap, room to grow).

# %%
def diagnose_snapshot(snapshot, request, cap):
    raise NotImplementedError   # your code here: sum what the segments reserve and what their blocks leave free

exercises.check("diagnose_snapshot", diagnose_snapshot)

# %% [markdown]
# ### Check yourself
# 1. A user's 4-bit model in vLLM shows the same `nvidia-smi` usage as the fp16 one. What two numbers
#    from the start-up log tell you where the saved memory went?
# 2. `reserved − allocated` is 6 GiB and a 2 GiB allocation fails. Which allocator setting might help,
#    and when will it not?
# 3. Why can a copy task drop while perplexity barely moves?
