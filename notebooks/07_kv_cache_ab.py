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
# # 07 · Load phase vs generation phase, and the KV-cache A/B test
#
# A report from the field: *"my AWQ model OOMs — I turned on KV-cache quantization and it still
# OOMs"*. Whether that switch can help depends on **when** the memory runs out:
#
# * **load phase** — the weights do not fit. No KV cache exists yet; its format cannot matter.
# * **generation phase** — the weights fit, then the KV cache grows with every token until it does
#   not. Here the KV format moves the OOM point.
#
# This notebook measures both, then runs a controlled A/B test of KV-cache formats.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/gpu-quant-course/gpu-quant-course/blob/main/notebooks/07_kv_cache_ab.ipynb)

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
import importlib.util, platform
import matplotlib.pyplot as plt
import pandas as pd
import torch, transformers
from helpers import budget, data, engine_plan, generation, key_numbers, kvcache, llm_compressor, measure, models, plots, widgets
from helpers.qspec import QuantSpec
from helpers.config import pick, results_path
from helpers.device import has_cuda, get_device
cuda, dev = has_cuda(), get_device()
from helpers.units import GiB, MiB

# %% [markdown]
# ## 1. A stage profiler
# `stage(name)` records allocated memory at entry and exit, the peak within, and reserved memory, for
# each stage of a run. On a CPU it can only read the process RSS (PyTorch does not track CPU
# allocations), and says so.

# %%
prof = measure.StageProfiler()
with prof.stage("load"):
    model, tok, real_weights = models.load_for_memory(device=dev)
prompt = data.random_ids(model.config.vocab_size, (4, pick(full=1024, ci=128)), device=dev)
run = generation.prefill_decode(model, prompt, pick(full=64, ci=8), profiler=prof)
prof.report()
t = prof.table()
kv_after_prefill, kv_growth = run["kv_after_prefill"], run["kv_growth"]
print("KV cache after prefill:", measure.fmt_bytes(kv_after_prefill), " grown during decode:", measure.fmt_bytes(kv_growth))
if cuda:  # the numbers add up: what decode kept is the KV it appended (± the 1-token input)
    dec, req = t[-1], run["requested_growth"]
    print(f"decode kept: requested {measure.fmt_bytes(req)}, allocator blocks {measure.fmt_bytes(dec['delta'])}",
          "(blocks over 1 MiB are not split when < 1 MiB would remain: up to 1 MiB slack per tensor)")
    assert abs(req - kv_growth) < 1 * MiB and all(r["peak"] >= max(r["start"], r["end"]) for r in t)
    assert abs(dec["delta"] - kv_growth) <= 2 * model.config.num_hidden_layers * MiB  # one K and one V per layer
    plots.stages(t); plt.show()
measure.free_memory()


# %% [markdown]
# ## 2. Load-phase OOM: the KV switch cannot help
# We emulate a small GPU with `limit_memory` (a per-process cap on the caching allocator), load the
# same architecture in fp32 and in bf16 under a cap that only bf16 fits, and create the KV cache of
# each format right after the weights — what an application does at start-up. The format really
# reaches the load here (`generation.load_under_cap(..., kv=kind)`); the cell prints what each cache
# holds at that moment.

# %%
if cuda:
    del model; measure.free_memory()
    base = torch.cuda.memory_allocated()
    cap = 0.4  # GiB: SmolLM2-135M is 0.50 GiB in fp32, 0.25 GiB in bf16
    load_rows = [{"weights": str(dt).replace("torch.", ""), "kv": kv, **generation.load_under_cap(cap, dt, kv=kv)}
                 for dt in (torch.float32, torch.bfloat16) for kv in ("baseline", "fp8-e4m3", "int4", "static")]
    display(pd.DataFrame(load_rows))
    growing = [r for r in load_rows if r["kv"] != "static"]
    assert all(r["cache_bytes"] == 0 for r in growing if r["ok"])              # a growing cache holds nothing at start
    assert len({r["ok"] for r in growing if r["weights"] == "float32"}) == 1    # so the format changes nothing
    assert torch.cuda.memory_allocated() == base
    model, tok, real_weights = models.load_for_memory(device=dev)
else:
    c = models.architecture_config("SmolLM2-135M")
    print("No CUDA device; the arithmetic instead: weights fp32",
          measure.fmt_bytes(budget.weight_bytes(c, "fp32")), "vs bf16", measure.fmt_bytes(budget.weight_bytes(c, "bf16")),
          "— a 0.4 GiB GPU takes only the second; a growing KV cache holds 0 bytes at start, whatever its format:",
          {k: kvcache.stored_bytes(kvcache.make_cache(k, c)) for k in ("baseline", "fp8-e4m3", "int4")})

# %% [markdown]
# A growing cache (transformers' `DynamicCache`, our FP8 and INT4 layers) allocates nothing until the
# first token, so at load time its format cannot matter. The `static` row is different: a cache that
# reserves all its positions up front (here 4096) takes its bytes at start-up — and that is where the
# KV format *does* decide a start-up failure. A serving engine works that way: vLLM reserves its KV
# pool when it starts (`gpu_memory_utilization × total − weights − profiled activation peak`, cut
# into blocks of 16 tokens; vLLM docs, "Engine arguments" and its memory profiling log), and refuses to
# start when one sequence of `max_model_len` does not fit — there `--kv-cache-dtype fp8` halves the
# pool's bytes per token. Notebook 08 re-implements that plan (`helpers.engine_plan`), checks it against
# a log vLLM printed and against vLLM's own CPU engine, and shows the three knobs that fix it.
#
# ### A real quantized checkpoint at load time
# A W4 checkpoint in the compressed-tensors format (what llm-compressor saves, as in notebooks 04 and
# 05) is packed on disk. What does loading it cost? The same architecture saved dense (bf16) and as
# W4 g64 (llm-compressor, round-to-nearest: the bytes do not depend on the algorithm), each loaded
# with plain transformers:

# %%
ckpts = llm_compressor.demo_checkpoints("SmolLM2-135M", QuantSpec(4, 64))   # built once, shared with notebook 08
ckpt_rows = [{"checkpoint": name, **generation.load_checkpoint(path, dev, torch.bfloat16)}
             for name, path in ckpts.items()]
ckpt = pd.DataFrame(ckpt_rows)
disk_ratio = ckpt.disk_bytes[1] / ckpt.disk_bytes[0]
resident_ratio = ckpt.resident_param_bytes[1] / ckpt.resident_param_bytes[0]
packed = "int32" in ckpt.param_dtypes[1]
print(f"on disk the W4 checkpoint is {disk_ratio:.2f}× the bf16 one; resident after loading {resident_ratio:.2f}× "
      f"→ {'kept packed (int32 words of 4-bit codes)' if packed else 'decompressed to dense weights'} by transformers")
key_numbers.record("07_kv_cache_ab", load_phase=ckpt)
ckpt

# %% [markdown]
# With transformers 5 and compressed-tensors installed, the loaded W4 model **keeps its linears
# packed** (the `param_dtypes` column: int32 words of eight 4-bit codes, plus their scales and zero points; the int64 is each linear's
# `weight_shape`, two numbers)
# and dequantizes each layer's weight when it runs: the resident bytes follow the checkpoint, not the
# dense model (the ratios printed above; the embeddings stay 16-bit, which is why the ratio is well
# above 4/16). On a GPU, `peak_bytes` is the allocator's peak during the load. Dequantizing in every
# forward costs work (and a transient dense copy of one layer's weight) — whether it is *faster* than bf16 takes low-bit kernels
# (notebook 08 measures real int4 kernels, ours in Triton among them).

# %% [markdown]
# What does help at load time: a smaller weight dtype (bf16, int8, int4), `device_map="auto"` with
# CPU/disk offload (slow but it loads), and one model copy per process (a second worker loading the
# same model doubles the weights).
#
# ## 3. Generation-phase OOM: the KV format moves the OOM point
# Same model, same batch and prompt, one cap for all three: the memory a baseline prefill reserved at
# its peak (measured, uncapped) plus the bf16 KV of `EXTRA` more tokens. Decode until OOM and compare
# how far each format gets on the same budget. The room left after the prefill (its freed activations
# plus `EXTRA` tokens of bf16 KV) is shared by the prompt's cache and the new tokens, and a compressed
# format stores both in fewer bytes — so it can decode more tokens than its byte ratio alone suggests
# (FP8 stores half the bytes; compare its ratio printed below the table with 2×). A format that
# reaches `MAX_NEW` without running out is printed "at least": its own OOM point lies further
# (raise `MAX_NEW` to find it — each token is one more decode step).

# %%
# one decode step per token: many short sequences fill the cache in fewer steps than a few long
# ones, so the hunt is short (`decode_s`: each format's hunt, the work near the cap and the OOM included)
BATCH, PROMPT, EXTRA, MAX_NEW = pick(full=(64, 128, 32, 1024), ci=(8, 256, 128, 1024))
if cuda:
    oom = generation.oom_points(model, BATCH, PROMPT, EXTRA, MAX_NEW)
    cap_gib, rows = oom["cap_gib"], oom["rows"]
    print(f"cap {cap_gib:.2f} GiB (baseline prefill peak + bf16 KV of {EXTRA} tokens), batch {BATCH}, prompt {PROMPT}")
    display(pd.DataFrame(rows))
    base_n = next(r["generated"] for r in rows if r["kv"] == "baseline")
    print("tokens decoded on the same budget, relative to bf16:",
          ", ".join(f"{r['kv']} {r['generated'] / max(1, base_n):.1f}×" + ("" if r["oom"] else " (no OOM: at least)")
                    for r in rows if r["kv"] != "baseline"))
    key_numbers.record("07_kv_cache_ab", oom_point={"cap_gib": cap_gib, "batch": BATCH, "prompt": PROMPT, "rows": rows})
else:
    c = models.architecture_config("SmolLM2-135M")
    per_tok = {k: budget.kv_bytes(c, 4096, BATCH, k) / 4096 for k in ("bf16", "fp8", "int4")}
    print(f"No CUDA device. Per generated token the KV grows by {measure.fmt_bytes(per_tok['bf16'])} at batch {BATCH}"
          f" in bf16, {per_tok['fp8'] / per_tok['bf16']:.0%} of that in FP8 and {per_tok['int4'] / per_tok['bf16']:.0%}"
          f" in INT4: the same budget lasts {per_tok['bf16'] / per_tok['fp8']:.1f}× / "
          f"{per_tok['bf16'] / per_tok['int4']:.1f}× as many tokens.")

# %% [markdown]
# ## 4. The A/B test
# **Fixed**: model, prompt tokens, prompt length, batch, new tokens, greedy decoding, seed, library
# versions. **Variable**: the KV-cache format only —
# * `baseline`: transformers' `DynamicCache` in the model's dtype;
# * `fp8-e4m3`, `fp8-e5m2`: our `FP8Layer` (a `DynamicLayer` subclass; one static scale per KV head,
#   set at prefill). transformers has no FP8 KV cache;
# * `int4`: transformers' `QuantizedLayer` (KIVI-style: the last 16 tokens stay full precision) with
#   our own 4-bit backend; `int4-hqq`: transformers' `QuantizedCache` with the HQQ backend
#   (`hqq==0.2.8.post1`; the quanto backend also runs on CPU but builds C++ extensions on a GPU).
#
# Quality is **teacher-forced**: every cache is fed the baseline's own greedy continuation, and we
# compare next-token predictions (top-1 agreement, KL) — a free-running comparison would turn one
# different token into a different text.

# %%
CTXS = pick(full=[256, 1024, 4096] if cuda else [256, 1024], ci=[128])
NEW = pick(full=64, ci=8)
BATCH_AB = pick(full=4 if cuda else 1, ci=1)
print(f"model: {'real weights' if real_weights else 'RANDOM weights (quality meaningless)'} {type(model).__name__}",
      f"dtype={model.dtype} device={dev} batch={BATCH_AB} new_tokens={NEW} seed=0",
      f"torch={torch.__version__} transformers={transformers.__version__} python={platform.python_version()}")
stream = data.tokens(tok, "eval") if tok is not None else None
missing = [k for k in kvcache.KV_KINDS if k not in kvcache.available_kinds()]
if missing:
    print(f"not installed here, so not in the table: {missing} ({kvcache.HQQ_INSTALL})")
rows = []
for ctx in CTXS:
    if stream is not None:
        prompts = torch.stack([stream[i * ctx:(i + 1) * ctx] for i in range(BATCH_AB)]).to(dev)
    else:
        prompts = data.random_ids(model.config.vocab_size, (BATCH_AB, ctx), seed=0, device=dev)
    rows += generation.kv_ab(model, prompts, NEW)
ab = pd.DataFrame(rows)
ab["kv % of baseline"] = 100 * ab.kv_bytes / ab.baseline_kv_bytes
key_numbers.record("07_kv_cache_ab", stages=t, kv_ab=ab)
ab

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
for kind, g in ab.groupby("kv_format"):
    axes[0].plot(g.context, g["kv % of baseline"], marker="o", label=kind)
    axes[1].plot(g.context, g.mean_kl, marker="o", label=kind)
axes[0].set_title("stored KV bytes, % of baseline"); axes[1].set_title("KL(baseline ‖ format), teacher-forced")
axes[1].set_yscale("symlog", linthresh=1e-5)
for a in axes: a.set_xlabel("context"); a.legend(fontsize=7)
plt.tight_layout(); plt.show()

# %% [markdown]
# Read the table honestly:
# * **bytes**: FP8 stores half of bf16 (a quarter of fp32 on a CPU); the scales cost 8 bytes per KV
#   head and layer. INT4 stores codes (½ byte) plus an fp16 scale and minimum per 64 values →
#   (0.5 + 4/64) / 2 = 28 % of bf16 (`budget.kv_bytes`, equal to the caches' stored bytes in the
#   unit tests), plus the full-precision residual tokens, which matter at short contexts.
# * **peak** falls by less than the storage: each layer's attention still receives a
#   full-precision copy of its K and V (dequantized on the fly), one layer at a time.
# * **speed**: quantize + dequantize is extra work on every step, so a quantized cache pays in memory,
#   not time (fused kernels like vLLM's avoid the copy). In the H200 reference run below every
#   quantized cache is slower than the baseline at every context; a 135M model's live tokens/s is
#   bound by kernel launches and noisy (the baseline at 1024 tokens: 180 and 106 tokens/s in two runs
#   of this notebook on one H200, `results/h200/notebooks_07_08_full_2026-12-02.json`), so one live row
#   can invert that.
# * **E4M3 vs E5M2**: same bytes; E4M3 has one more mantissa bit, so lower error — E5M2's range is not
#   needed once a scale is applied.
#
# The H200 reference run over longer contexts is in `results/h200/kv_ab.json`. It ran the SmolLM2
# architecture with **random weights** (the offline model cannot travel to that machine): its bytes,
# peaks and speeds are real, its agreement and KL are noise (nearly flat logits: a
# tiny error flips the top-1 token), so they are not shown. Quality comes from the
# real offline model on a CPU (`benchmarks/kv_quality.py` → `results/cpu/kv_quality.json`:
# teacher-forced on WikiText continuations, perplexity of the true continuation per format).

# %%
import json
ref = results_path("h200", "kv_ab.json")
if ref.exists():
    r = pd.DataFrame(json.loads(ref.read_text()))
    r["kv %"] = 100 * r.kv_bytes / r.baseline_kv_bytes
    print("H200, weights:", set(r.weights), "→ bytes, peak and speed only")
    display(r[["kv_format", "context", "batch", "kv %", "peak", "tokens_per_s"]])
q = results_path("cpu", "kv_quality.json")
if q.exists():
    kq = pd.DataFrame(json.loads(q.read_text()))
    print("CPU, weights:", set(kq.weights), "→ quality")
    display(kq[["kv_format", "context", "batch", "continuation", "top1_agreement", "mean_kl", "ppl"]])

# %% [markdown]
# ## 5. Move seq_len and batch
# KV bytes for each format, predicted from the formula — and on a CUDA GPU, measured with this
# notebook's model for the context and batch you pick: each format's peak, and how many tokens it
# decodes before running out under one cap (the §3 rule: the baseline prefill's reserved peak plus
# the bf16 KV of 64 tokens). The measurement is one decode step per token — three generates and three
# OOM hunts of up to `seq_len + 64` tokens each, from seconds at short contexts to minutes at long
# ones — so it runs only while **measure** is ticked. Without CUDA the widget says it predicts only.

# %%
widgets.kv_widget(("SmolLM2-135M",), model=model)

# %% [markdown]
# ## 6. The production path: vLLM `--kv-cache-dtype fp8`
# vLLM pre-allocates the KV cache: after loading weights it reserves
# `gpu_memory_utilization × total − weights − activation peak` for KV blocks. FP8 halves bytes per
# token, so the same reservation holds twice the tokens (vLLM's layout, `engine_plan.kv_bytes_per_token`).
# The course's FP8 cache (§4) stores the same byte per value plus two fp32 scales (one for K, one for V) per layer and KV head:
# a constant, not a cost per token — both printed:

# %%
c8 = models.architecture_config("Llama-3.1-8B")
total, util = 24e9, 0.90
free_for_kv = util * total - budget.weight_bytes(c8, "bf16") - 1.0e9  # ~1 GB activation/overhead
for fmt, b in [("auto (bf16)", "bf16"), ("fp8 (e4m3 / e5m2)", "fp8")]:
    per_tok = engine_plan.kv_bytes_per_token(c8, "auto" if b == "bf16" else "fp8")   # vLLM's layout
    print(f"vLLM {fmt:<18} {per_tok / 1024:6.0f} KiB/token → {free_for_kv / per_tok:>9,.0f} tokens in {free_for_kv / 1e9:.1f} GB")
per_tok = (budget.kv_bytes(c8, 2048, 1, "fp8") - budget.kv_bytes(c8, 1024, 1, "fp8")) / 1024
print(f"the course's fp8 cache: {per_tok / 1024:.0f} KiB/token + {(budget.kv_bytes(c8, 1, 1, 'fp8') - per_tok) / 1024:.0f} "
      "KiB of scales in all")
if importlib.util.find_spec("vllm"):
    print("vLLM is installed: try  vllm serve <model> --kv-cache-dtype fp8_e4m3 --calculate-kv-scales")
else:
    print("vLLM not installed here: shown, not executed. `--kv-cache-dtype fp8` (= fp8_e4m3) or fp8_e5m2;",
          "scales default to 1.0 unless the checkpoint carries k/v scales or --calculate-kv-scales is given.")

# %% [markdown]
# ### Your turn: the INT4 cache's real bytes
# Bytes per token of the INT4 KV cache (codes, plus an fp16 scale and minimum per group); checked
# against `helpers.budget.kv_bytes`.
# (Stuck? `helpers/solutions.py` has an answer; in the CI profile it is checked instead of an unwritten cell.)

# %%
from helpers import exercises
def int4_kv_bytes_per_token(layers, kv_heads, head_dim, group):
    raise NotImplementedError   # your code here

exercises.check("int4_kv_bytes_per_token", int4_kv_bytes_per_token)

# %% [markdown]
# ### Check yourself
# Llama-3.1-8B at 32k context, batch 4: how many GiB of KV in bf16, and in FP8?

# %%
a = budget.kv_bytes(c8, 32768, 4, "bf16") / GiB
print(f"bf16 {a:.0f} GiB, fp8 {a / 2:.0f} GiB")
assert a == 16.0
