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
# # 03 · Quantization fundamentals on real LLM weights
#
# Everything later in the course (GPTQ, AWQ, KV-cache formats) is built from one operation:
#
# $$x_q = \mathrm{clamp}\big(\mathrm{round}(x/\text{scale}) + \text{zero},\ q_{min}, q_{max}\big), \qquad \hat x = (x_q - \text{zero})\cdot \text{scale}$$
#
# This notebook measures what its choices cost on the weights and activations of a real model:
# bits, symmetric vs asymmetric, per-tensor / per-channel / per-group, packing, FP8, outliers and
# SmoothQuant — then a first whole-model perplexity preview.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/gpu-quant-course/gpu-quant-course/blob/main/notebooks/03_quantization_basics.ipynb)

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
import matplotlib.pyplot as plt
import pandas as pd
import torch
from helpers import calib, quant, key_numbers, course_model, variants
from helpers.models import decoder_layers, is_offline_q4_1
bench = course_model.setup()
model = bench.model
print("weights real:", bench.real_weights, "| text real:", bench.real_text, "| settings:", bench.settings)

# %% [markdown]
# ## 1. The grid, on one real weight matrix
# Take `q_proj` of block 3 (576 × 576). Error (MSE and max |error|) for 2/3/4/8 bits, symmetric and
# asymmetric, per tensor, per output channel and per group of 64 input columns:

# %%
W = decoder_layers(model)[3].self_attn.q_proj.weight.detach().float().cpu()
rows = []
for bits in (2, 3, 4, 8):
    for sym in (True, False):
        for gran, g in (("tensor", None), ("channel", None), ("group", 64)):
            e = quant.quant_error(W, bits=bits, symmetric=sym, granularity=gran, group_size=g)
            rows.append({"bits": bits, "scheme": f"{'sym' if sym else 'asym'}-{gran}", **e})
err = pd.DataFrame(rows)
ax = err.pivot(index="bits", columns="scheme", values="mse").plot(logy=True, marker="o", figsize=(7, 3.5))
ax.set_ylabel("MSE"); ax.set_title("q_proj of block 3: error vs bits and granularity"); plt.show()
err.pivot(index="bits", columns="scheme", values="max_abs").round(4)

# %% [markdown]
# **Why per-group wins**: one scale has to cover the largest value in its range. Per tensor, one
# outlier anywhere stretches the step for all 331 776 weights; per channel, one per row; per group of
# 64, only its 63 neighbours pay. The price is metadata: every group stores a scale (and a zero).
#
# ## 2. What each scale costs, in bits per weight — formula and real bytes
# `bits_per_weight = b + (scale_bits + zero_bits) / g`. Packing stores two 4-bit codes per byte
# (three 3-bit codes don't fit evenly: we pack 8 codes into 3 bytes). Measured on the same matrix:

# %%
rows = []
for bits, g in ((8, None), (4, 128), (4, 64), (4, 32), (3, 64), (2, 64)):
    gran = "channel" if g is None else "group"
    if g and W.shape[1] % g:
        rows.append({"format": f"int{bits} g{g}", "note": f"{g} does not divide {W.shape[1]}: "
                     f"allowed {quant.allowed_group_sizes(W.shape[1])}"}); continue
    q = quant.quantize_tensor(W, bits=bits, granularity=gran, group_size=g)
    sb = quant.storage_bytes(q)
    rows.append({"format": f"int{bits} {'per-channel' if g is None else f'g{g}'}",
                 "formula bits/weight": quant.bits_per_weight(bits, g or W.shape[1]),
                 "measured bits/weight": 8 * sb["total"] / W.numel(), "bytes": sb["total"],
                 "vs bf16": sb["total"] / (2 * W.numel())})
pd.DataFrame(rows)

# %%
q = quant.quantize_tensor(W, bits=4, group_size=64)
packed = quant.pack_codes(q.codes, 4)
assert torch.equal(quant.unpack_codes(packed, 4, q.codes.numel()).reshape(q.codes.shape), q.codes)
print(f"packed codes: {packed.numel():,} bytes for {W.numel():,} weights; unpack round-trips exactly")

# %% [markdown]
# Note the 128 row: SmolLM2's hidden size is 576 = 9 × 64, and **128 does not divide it**. The
# popular "W4 g128" recipe is impossible for this model; the course uses **g64** throughout.
#
# ## 3. A lesson about grids: where the offline weights came from
# The offline model ships as GGUF **Q4_1**: blocks of 32 weights, each with a float scale *and a float
# minimum* (not an integer zero point). Its "full precision" weights are those 4-bit values,
# dequantized. So RTN 4-bit g32 asymmetric **with a float minimum** should give them back exactly —
# and the usual integer zero point should not:

# %%
if is_offline_q4_1(model):
    exact = quant.quant_error(W, bits=4, group_size=32, integer_zero=False)
    integer = quant.quant_error(W, bits=4, group_size=32)
    print(f"g32, float minimum (Q4_1's grid): MSE {exact['mse']:.2e}, max {exact['max_abs']:.2e}")
    print(f"g32, integer zero point:          MSE {integer['mse']:.2e}, max {integer['max_abs']:.2e}")
    assert exact["mse"] < 1e-10 < integer["mse"]
else:
    print("Not the offline Q4_1 model (real bf16 weights): there is no hidden grid to find.")

# %% [markdown]
# The weights already *are* a 4-bit grid — so any 4-bit result on this model is partly measuring how
# well a method re-finds a grid. The hub model learners get online (`HuggingFaceTB/SmolLM2-135M`,
# bf16) has the same architecture and memory arithmetic without this quirk. Keep it in mind when
# reading W4 numbers; W3 is where methods separate.
#
# ## 4. Symmetric vs asymmetric on skewed data
# Weights are roughly centred at 0, so symmetric loses little. Post-activation values (after SiLU,
# the input of `down_proj` is `silu(gate)·up` — after SiLU alone they are ≥ −0.28) are skewed:

# %%
ids = bench.calib(2, bench.settings["seq_len"])
gate_out = calib.capture_inputs(model, decoder_layers(model)[3].mlp.act_fn, ids) if hasattr(
    decoder_layers(model)[3].mlp, "act_fn") else None
act = torch.nn.functional.silu(gate_out).cpu() if gate_out is not None else None
rows = []
for name, x in (("weights (q_proj)", W), ("SiLU outputs", act)):
    if x is None:
        continue
    for sym in (True, False):
        e = quant.quant_error(x.reshape(1, -1).float(), bits=8, symmetric=sym, granularity="tensor")
        rows.append({"tensor": name, "scheme": "symmetric" if sym else "asymmetric", "min": x.min().item(),
                     "max": x.max().item(), **e})
pd.DataFrame(rows)

# %% [markdown]
# Symmetric spends half its codes on negative values the SiLU output almost never takes: asymmetric
# halves the step on this data. On weights the two are close.
#
# ## 5. Outliers in activations
# Per-input-channel magnitudes of the activations entering `q_proj` of a block, from real text:

# %%
X = calib.capture_inputs(model, decoder_layers(model)[3].self_attn.q_proj, ids).float().cpu()
amax = X.abs().amax(0)
top = amax.topk(8)
fig, ax = plt.subplots(figsize=(9, 2.8))
ax.bar(range(len(amax)), amax.numpy(), width=1.0); ax.set_yscale("log")
ax.set_xlabel("input channel"); ax.set_ylabel("max |x|"); ax.set_title("activation outliers entering q_proj, block 3")
plt.show()
outlier_ratio = (top.values[0] / amax.median()).item()
print("largest channels:", top.indices.tolist(), "max|x|:", [round(v, 1) for v in top.values.tolist()],
      f"median channel {amax.median():.2f}; the largest is {outlier_ratio:.1f}× the median")

# %% [markdown]
# A few channels are far larger than the median (the ratio is printed above: how much larger depends
# on the model and block — measure yours). With one INT8 scale per token or per
# tensor, those channels set the step and every other channel is rounded coarsely — that is why
# W8A8 (activations quantized too) is hard for LLMs, while weight-only quantization is not.
#
# ## 6. SmoothQuant: move the outliers into the weights
# $Y = (X\,\mathrm{diag}(s)^{-1})\,(\mathrm{diag}(s)\,W^\top)$ is the same product for any $s > 0$.
# Choose $s_j = \max|X_j|^{\alpha} / \max|W_j|^{1-\alpha}$ (Xiao et al. 2023): activations become
# easier, weights harder. W8A8 output error of this real layer, before and after, for several α:

# %%
Wq = decoder_layers(model)[3].self_attn.q_proj.weight.detach().float().cpu()
rows = [{"alpha": "no smoothing", "per-tensor A8": quant.w8a8_error(X, Wq),
         "per-token A8": quant.w8a8_error(X, Wq, per_token=True)}]
for alpha in (0.25, 0.5, 0.75, 0.9):
    s = quant.smoothquant_scales(amax, Wq.abs().amax(0), alpha)
    rows.append({"alpha": alpha, "per-tensor A8": quant.w8a8_error(X, Wq, s),
                 "per-token A8": quant.w8a8_error(X, Wq, s, per_token=True)})
sq = pd.DataFrame(rows)
sq

# %% [markdown]
# Read the table: per-tensor A8 suffers most from the outliers, and some α in between usually wins
# (0.5 is SmoothQuant's default): too small leaves the activation outliers, too large pushes them
# into the weights (whose per-channel INT8 then suffers). The product is unchanged — only *where* the
# rounding happens moves.
#
# ## 7. Dynamic vs static vs QAT
#
# | approach | what it needs | activations | cost | why (not) for LLMs |
# |---|---|---|---|---|
# | dynamic PTQ | nothing | scales computed per batch at run time | cheap; run-time overhead | fine for weights+INT8 activations on CPU; no calibration |
# | static PTQ | a few hundred calibration samples | fixed scales from calibration | minutes | the default: GPTQ, AWQ, SmoothQuant are all PTQ |
# | QAT | training data + a training run | learned with fake-quant in the loop | a fine-tune of the whole model | best quality at very low bits, but training a 7–70B model is rarely affordable |
#
# PTQ dominates for LLMs because it needs no training, minutes of compute, and little data.
#
# ## 8. FP8: floating-point codes
# E4M3 has 3 mantissa bits (precision), E5M2 has 2 but a wider range. Their ranges, from `torch.finfo`:

# %%
pd.DataFrame([{"format": f, **quant.fp8_range(f)} for f in ("e4m3fn", "e5m2", "e4m3fnuz")])

# %% [markdown]
# vLLM's docs quote **±240** for E4M3: that is the *FNUZ* variant (AMD MI300), not OCP `e4m3fn`,
# whose maximum is **448**. Error on the same weight matrix, with one scale per output channel:

# %%
rows = []
for fmt in ("e4m3fn", "e5m2"):
    qf, sc = quant.to_fp8(W, fmt, dim=1)
    e = quant.from_fp8(qf, sc) - W
    rows.append({"format": fmt, "mse": e.pow(2).mean().item(), "max_abs": e.abs().max().item()})
rows.append({"format": "int8 per-channel", **quant.quant_error(W, bits=8, symmetric=True, granularity="channel")})
fp8_vs_int8 = pd.DataFrame(rows)
fp8_vs_int8

# %% [markdown]
# On these weights **INT8 per channel beats FP8** (lower MSE), although the seed calls FP8 "more
# accurate than INT8 PTQ". Both are right in their place. INT8 is a *uniform* grid: 255 equal steps
# between −max and +max, ideal for bounded, roughly Gaussian data such as a weight row with its own
# scale. FP8 spends its codes *logarithmically*: fine steps near zero, coarse ones near the maximum —
# a constant *relative* error over a wide dynamic range. That pays where one scale must cover values
# of very different magnitudes: activations with outlier channels (section 5), under one scale per
# tensor. The same comparison on the activations entering `q_proj`, one scale for the whole tensor:

# %%
act_rows = []
for fmt in ("e4m3fn", "e5m2"):
    qf, sc = quant.to_fp8(X, fmt)
    act_rows.append({"format": f"fp8 {fmt}, per tensor", "mse": (quant.from_fp8(qf, sc) - X).pow(2).mean().item()})
act_rows.append({"format": "int8, per tensor", "mse": quant.quant_error(X, bits=8, symmetric=True, granularity="tensor")["mse"]})
act_cmp = pd.DataFrame(act_rows)
winner = act_cmp.loc[act_cmp.mse.idxmin(), "format"]
print(f"lowest error on the activations: {winner}; on the weights: "
      f"{fp8_vs_int8.loc[fp8_vs_int8.mse.idxmin(), 'format']}")
act_cmp

# %% [markdown]
# **Hardware decides the speed.** FP8 matrix instructions exist only from compute capability 8.9
# (Ada: L4, RTX 4090) and 9.0 (Hopper: H100, H200); a T4 (7.5) or an A100 (8.0) has none, so FP8
# weights there are only a storage format, dequantized before every matmul. INT8 tensor cores exist
# from 7.5 on. Your device:

# %%
if torch.cuda.is_available():
    major, minor = torch.cuda.get_device_capability()
    print(f"{torch.cuda.get_device_name()}: compute capability {major}.{minor} → FP8 matmul units: "
          f"{'yes' if (major, minor) >= (8, 9) else 'no (FP8 is storage only here)'}")
else:
    print("no CUDA device: FP8 here is a storage format only (the CPU has no FP8 matrix units)")

# %% [markdown]
# **The seed's vLLM command, corrected.** It serves FP8 with `--dtype fp8`; vLLM's `--dtype` sets the
# model's compute dtype (auto, half, bfloat16, float) and has no fp8. FP8 weights and activations are
# `--quantization fp8`, an FP8 KV cache is `--kv-cache-dtype fp8` (vLLM docs, "FP8 W8A8" and
# "Quantized KV Cache"):
#
# ```bash
# vllm serve meta-llama/Llama-3.1-8B-Instruct --quantization fp8 --kv-cache-dtype fp8
# ```


# %% [markdown]
# ## 9. RTN on the whole model: a first perplexity preview
# Round-to-nearest every linear inside the decoder blocks (embeddings and `lm_head` kept), then
# perplexity on the evaluation text (the protocol of notebook 06). The variants are cached so
# notebook 06 can reuse them.

# %%
base_ppl = variants.perplexity(bench)
rows = [{"variant": "baseline", "ppl": base_ppl}]
for bits, g in ((8, None), (4, 64), (3, 64)):
    m, meta, key = variants.variant(bench, "rtn", spec=quant.QuantSpec(bits, g))
    rows.append({"variant": f"RTN W{bits} {'per-channel' if g is None else f'g{g}'}", "ppl": variants.perplexity(bench, m, key)})
    del m
preview = pd.DataFrame(rows)
preview["Δ% vs baseline"] = 100 * (preview.ppl / base_ppl - 1)
if not bench.quality_meaningful:
    print("(random weights or random text: these perplexities are not meaningful)")
key_numbers.record("03_quantization_basics", rtn_preview=preview, quality_meaningful=bench.quality_meaningful)
preview

# %% [markdown]
# Read the Δ column: W8 per-channel should be close to free. On this 135M model RTN at 4 bits is
# far from free (the CPU reference run, `results/cpu/quantizers.json`: +33 % at W4 g64, ×3.2 at
# W3 g64) — small models are much more sensitive than 7B+ ones, where W4 RTN costs a few percent.
# Notebooks 04 and 05 try to recover that with GPTQ and AWQ, and print from their own runs whether
# they did.

# %% [markdown]
# ### Your turn: a group quantizer
# Asymmetric round-to-nearest per group of columns, dequantized back (`w` is `[rows, cols]`); checked
# against `helpers.quant.fake_quantize`.
# (Stuck? `helpers/solutions.py` has an answer; in the CI profile it is checked instead of an unwritten cell.)

# %%
from helpers import exercises
def group_fake_quant(w, bits, group):
    raise NotImplementedError   # your code here

exercises.check("group_fake_quant", group_fake_quant)

# %% [markdown]
# ### Check yourself
# 1. Bits per weight of INT4 g64 with an fp16 scale and an fp16 zero per group?
# 2. The INT4 g64 bytes of a 576 × 576 matrix stored as GPTQ does (packed codes, fp16 scales, zeros
#    packed at 4 bits)?
# 3. E4M3's largest finite value?
#
# Work them out on paper, then run the cell.

# %%
answers = {"1": quant.bits_per_weight(4, 64, zero_bits=16),
           "2": quant.storage_bytes(quant.quantize_tensor(W, bits=4, group_size=64))["total"],
           "3": quant.fp8_range("e4m3fn")["max"]}
print(f"1) {answers['1']} bits  2) {answers['2']:,} bytes  3) {answers['3']}")
assert answers["1"] == 4 + 32 / 64 and answers["3"] == 448
assert answers["2"] == 576 * 576 // 2 + 2 * 576 * 9 + 576 * 9 // 2   # codes + scales + packed zeros
