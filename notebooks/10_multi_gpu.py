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
# # 10 · When one GPU is not enough: tensor and pipeline parallelism
#
# A 70B model in 16 bits does not fit on one 80 GB card — notebook 01 counted its weights alone.
# Quantization is one way out (notebooks 03–05); the other is to **split the model over several
# GPUs**. The source document does both: its vLLM deployment runs the AWQ checkpoint of Llama-2-70B
# with `tensor_parallel_size=2` and `gpu_memory_utilization=0.90`, and it claims that with AWQ "a 70B
# model on 2×A100" serves batch 32 at seq_len 4096, and that INT4 takes the model "from needing 3
# H100s to 1". This notebook works out what each GPU holds under each split, checks those claims, and
# runs a real split on two processes.
#
# | split | what each GPU holds | what it costs |
# |---|---|---|
# | tensor parallel (tp) | a slice of **every** layer: `1/tp` of the heads and MLP columns | an all-reduce after every attention and MLP block |
# | pipeline parallel (pp) | **some** layers, whole | the stages wait for each other (bubbles) |
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/gpu-quant-course/gpu-quant-course/blob/main/notebooks/10_multi_gpu.ipynb)

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
import shutil
import matplotlib.pyplot as plt
import pandas as pd
import torch
from helpers import models, parallel, tp_run
from helpers.config import pick
from helpers.units import GB, GiB
c70 = models.architecture_config("Llama-2-70B")

# %% [markdown]
# ## 1. Tensor parallelism: who holds what
# Megatron-LM's split (arXiv:1909.08053 §3), which vLLM builds in
# `vllm/model_executor/layers/linear.py` and `vocab_parallel_embedding.py` (vllm-project/vllm):
#
# * **column-parallel** `q/k/v` and `gate/up`: rank *r* keeps the output rows of its heads and of its
#   `1/tp` of the MLP columns. Its attention heads are whole, so attention runs locally.
# * **row-parallel** `o` and `down`: rank *r* keeps the matching *input* columns and produces a
#   partial sum of the full output; an **all-reduce** adds the partial sums of all ranks. Two
#   all-reduces per layer, of `tokens × hidden` values each.
# * **vocab-parallel** embedding and `lm_head`: the vocabulary, padded to a multiple of 64, split in
#   `tp` row blocks (`VocabParallelEmbedding`, `ParallelLMHead`).
# * norms, and the residual stream between the blocks, are **replicated**.
#
# The KV heads are the catch. `QKVParallelLinear` splits them like the query heads while there are at
# least `tp` of them; with fewer, each rank keeps **one whole KV head** and `tp / kv_heads` ranks hold
# the same one (`num_kv_head_replicas`): the KV cache stops shrinking. And vLLM's `divide` refuses any
# tp that does not divide the heads.

# %%
rows = []
for name, tp in [("Llama-2-70B", 1), ("Llama-2-70B", 2), ("Llama-2-70B", 4), ("Llama-2-70B", 8),
                 ("TinyLlama-1.1B", 4), ("TinyLlama-1.1B", 8)]:
    r = parallel.rank_shape(name, tp)
    rows.append({"model": name, "tp": tp, "query heads / GPU": r.heads, "KV heads / GPU": r.kv_heads,
                 "copies of each KV head": r.kv_replicas, "MLP columns / GPU": r.intermediate,
                 "vocab rows / GPU": r.vocab_per_rank})
display(pd.DataFrame(rows))
try:
    parallel.rank_shape(c70, 3)
except ValueError as e:
    print("tp=3:", e)

# %% [markdown]
# So "3 H100s" is not a tensor-parallel size for Llama-2-70B at all: 3 does not divide its 64 query
# heads. vLLM would stop at start-up; three GPUs can only be used as three **pipeline stages**
# (section 3).

# %% [markdown]
# ## 2. Bytes per GPU
# Per rank, with `h` hidden, `d` head_dim, `H` query heads, `I` MLP width and `kv_r` the rank's KV
# heads: attention `h·(H/tp)·d` (q) `+ 2·h·kv_r·d` (k, v) `+ (H/tp)·d·h` (o), MLP `3·h·I/tp`, norms
# `2h`; KV per token `layers · 2 · kv_r · d · b`. `helpers.parallel` counts it by hand, and
# `tests/test_parallel.py` checks the count against the meta-device model a rank would build. The
# activations do not divide: the MLP's and attention's temporaries do, the residual stream does not.
# Below, Llama-2-70B with the KV cache of the seed's claim, 32 sequences × 4096 tokens:

# %%
BATCH, SEQ = 32, 4096
rows = []
for fmt in ("bf16", "int4"):
    for tp in (1, 2, 4, 8):
        p = parallel.per_gpu(c70, tp, 1, fmt, SEQ, BATCH)
        rows.append({"format": fmt, "tp": tp, **{f"{k}_GB": p[k] / GB for k in ("weights", "kv", "activations", "overhead", "total")}})
per = pd.DataFrame(rows)
display(per.round(1))

# %%
fig, ax = plt.subplots(figsize=(8, 3.2))
x = [i + (0.42 if f == "int4" else 0) for f in ("bf16", "int4") for i in range(4)]
bottom = [0.0] * len(per)
for part, color in [("weights_GB", "tab:blue"), ("kv_GB", "tab:orange"), ("activations_GB", "tab:green"), ("overhead_GB", "tab:gray")]:
    ax.bar(x, per[part], 0.4, bottom=bottom, color=color, label=part.removesuffix("_GB"))
    bottom = [b + v for b, v in zip(bottom, per[part])]
for card, gb in parallel.SEED_CARDS_GB.items():
    ax.axhline(0.9 * gb, ls="--", lw=1, color="k")
    ax.text(-0.45, 0.9 * gb + 2, f"{card} × 0.9", fontsize=8)
ax.set_xticks([i + 0.21 for i in range(4)], [f"tp={t}\nbf16 | int4" for t in (1, 2, 4, 8)])
ax.set_ylabel("GB per GPU"); ax.set_title("Llama-2-70B, KV of 32 × 4096 tokens: per-GPU memory vs tp")
ax.legend(fontsize=8, ncol=4); plt.tight_layout(); plt.show()

# %% [markdown]
# ## 3. The source document's claims, checked
# Every format × number of GPUs × card, with vLLM's rule from notebook 08: the usable memory is
# `gpu_memory_utilization × card` (the seed's `0.90`), and what is left after weights, activations
# and overhead is the KV pool. `max_seqs` is how many 4096-token sequences that pool holds on every
# GPU at once (vLLM's "maximum concurrency"); `headroom` is what is left after 32 of them.

# %%
fits = pd.DataFrame(parallel.fits_across(c70, formats=("bf16", "int4"), gpus=(1, 2, 4, 8), batch=BATCH, seq_len=SEQ))
table = fits.pivot_table(index=["format", "gpus"], columns="card", values=["headroom_GB", "max_seqs"], aggfunc="first")
display(table.round(1))
awq2 = fits[(fits.format == "int4") & (fits.gpus == 2)].set_index("card")
for card in ("A100-40GB", "A100-80GB"):
    r = awq2.loc[card]
    print(f"AWQ-W4 on 2×{card}: {r.total_GB:.1f} GB needed per GPU of {r.usable_GB:.1f} GB usable → fits: {r.fits}; "
          f"at most {r.max_seqs} sequences of 4096 tokens")

# %% [markdown]
# The "2×A100" claim holds on the larger A100 and not on the smaller one (the two lines printed
# above): the weights fit on two of the smaller cards, but the KV cache of 32 × 4096 tokens does not; vLLM
# would start there and serve fewer sequences at once. The throughput part of the claim needs the GPUs themselves.
#
# **"3 H100s → 1".** The seed's 162 GB is its own fp16 figure for batch 16 × 4096 (notebook 01 counts
# weights + KV of that workload at 159.4 GB and finds no breakdown of the seed's). Three GPUs
# cannot be three tensor ranks (section 1), but they can be three pipeline stages, and INT4 on one
# card is a `tp=1` row:

# %%
for label, tp, pp, fmt in [("fp16, tp=2", 2, 1, "fp16"), ("fp16, 3 pipeline stages", 1, 3, "fp16"),
                           ("fp16, tp=4", 4, 1, "fp16"), ("int4, one GPU", 1, 1, "int4")]:
    p = parallel.per_gpu(c70, tp, pp, fmt, 4096, 16)
    print(f"{label:>24}: {p['total'] / GB:6.1f} GB on the fullest GPU (stage {p['stage']}), "
          f"H100-80GB usable at 0.9: {0.9 * 80:.0f} GB → {'fits' if p['total'] <= 0.9 * 80 * GB else 'does not fit'}")
print("layers per stage at pp=3:", parallel.stage_layers(80, 3))

# %% [markdown]
# ## 4. Pipeline or tensor?
# A pipeline stage holds whole layers, so its KV cache keeps every KV head of its layers and is never
# replicated; tensor parallelism replicates KV heads once tp exceeds them. On eight GPUs, a model with
# 4 KV heads (TinyLlama here) pays for that:

# %%
tiny = models.architecture_config("TinyLlama-1.1B")
rows = []
for tp, pp in [(8, 1), (4, 2), (2, 4), (1, 8)]:
    p = parallel.per_gpu(tiny, tp, pp, "bf16", 2048, 64)
    rows.append({"tp × pp": f"{tp} × {pp}", "weights_GB": p["weights"] / GB, "kv_GB": p["kv"] / GB,
                 "KV heads / GPU": parallel.rank_shape(tiny, tp).kv_heads})
display(pd.DataFrame(rows).round(3))

# %% [markdown]
# At `8 × 1` each GPU holds one KV head of all 22 layers, and every head sits on two GPUs: twice the
# KV per GPU of `4 × 2`, where each head is held once (the table above; with pp the fullest stage has
# one layer more than the others when the layers do not divide evenly). Pipeline stages have a cost of their own — a request flows through them
# one after the other, so a single request keeps only one GPU busy at a time — which is why serving
# engines split within a node by tp and across nodes by pp.

# %% [markdown]
# ## 5. A real split, on two CPU processes
# `helpers.tp_run.run` starts two processes (`torch.multiprocessing`: on a Linux machine without a GPU they
# fork from one server process that imported transformers once; elsewhere each starts fresh) that join one
# `torch.distributed` group over **gloo**. Each builds the same Llama decoder layer (same seed), keeps
# its shards exactly as above — column-parallel q/k/v/gate/up, row-parallel o/down with an
# `all_reduce` hook, replicated norms — and runs transformers' own `LlamaDecoderLayer` code on them.
# Two cases: 2 KV heads split over the 2 ranks, and 1 KV head replicated on both. Each rank compares
# its output with the unsplit layer's, counts its parameter bytes against the prediction, and
# measures the peak of live bytes of its forward (`helpers.host_alloc`) next to the unsplit layer's.

# %%
SEQ_CPU = pick(full=256, ci=64)
res = pd.DataFrame(tp_run.run(tp=2, seq=SEQ_CPU))
res["peak rank / full"] = res.forward_peak_rank / res.forward_peak_full
cols = ["kv_heads", "rank", "kv_replicas", "param_bytes_pred", "param_bytes_meas", "full_param_bytes", "allclose",
        "max_abs_diff", "peak rank / full"]
display(res[cols].round({"max_abs_diff": 9, "peak rank / full": 2}))
print(f"every rank matches the unsplit layer: {bool(res.allclose.all())}; "
      f"parameter bytes as predicted on every rank: {bool((res.param_bytes_meas == res.param_bytes_pred).all())}")
rep = res[res.kv_replicas > 1].iloc[0]
print(f"1 KV head replicated: each rank holds {rep.param_bytes_meas / rep.full_param_bytes:.3f} of the layer's bytes, "
      f"not 0.5 (its own copy of k_proj and v_proj)")
print(f"forward peak of a rank / of the unsplit layer: {res['peak rank / full'].min():.2f} … {res['peak rank / full'].max():.2f} "
      f"(the residual stream is replicated)")

# %% [markdown]
# The output matches to float32 rounding (`max_abs_diff`, printed above): the sum the all-reduce
# forms is the same matrix product in a different order. The parameter bytes are exact on every rank.
# The forward's peak on a rank falls, but not to a clean half (the range printed above, which moves
# from run to run at these tiny sizes): the MLP's and attention's temporaries are split, the residual
# stream and the norms' outputs are not.

# %% [markdown]
# ## 6. On two GPUs (NCCL)
# With two CUDA GPUs, `helpers.tp_run.measure_memory` does the same over NCCL at full size: each GPU
# builds its share of a Llama-3-70B-shaped stack (random bf16 weights, the first layers only),
# profiles a forward, allocates its KV pool, and times the all-reduce of one decode step
# (`python -m benchmarks.tp_memory` writes `results/h200x2/tp_memory.json`; not yet measured: the
# course has not had two GPUs yet). NVLink multicast stays off (`NCCL_NVLS_ENABLE=0`).

# %%
if torch.cuda.device_count() >= 2:
    gpu = pd.DataFrame(tp_run.measure_memory(layers=pick(full=4, ci=2), batch=pick(full=32, ci=4),
                                             seq=pick(full=4096, ci=1024), decode_batches=(1, 32)))
    for part in ("weights", "kv", "activations"):
        gpu[f"{part} GiB meas / pred"] = [f"{m / GiB:.3f} / {p / GiB:.3f}" for m, p in zip(gpu[f"{part}_meas"], gpu[f"{part}_pred"])]
    display(gpu[["rank", "weights GiB meas / pred", "kv GiB meas / pred", "activations GiB meas / pred", "nvml_process"]])
    print({f"batch {t['batch']}": f"{t['all_reduce_us']:.1f} µs per all-reduce" for t in gpu.all_reduce[0]})
else:
    print(f"{torch.cuda.device_count()} CUDA GPU(s) here: the NCCL measurement needs 2, skipped "
          "(python -m benchmarks.tp_memory runs it on a 2-GPU machine).")

# %% [markdown]
# vLLM does all of this from one flag. The seed's command, as `vllm serve`; it runs below only where
# vLLM is installed, two GPUs exist and `COURSE_VLLM_MODEL` names a model it can load (e.g. the AWQ
# checkpoint), and prints vLLM's own memory lines.

# %%
model = os.environ.get("COURSE_VLLM_MODEL", "TheBloke/Llama-2-70B-Chat-AWQ")
argv = tp_run.vllm_serve_argv(model, tp=2, quantization="awq" if "AWQ" in model.upper() else None)
print(" ".join(argv))
if shutil.which("vllm") and torch.cuda.device_count() >= 2 and "COURSE_VLLM_MODEL" in os.environ:
    print("\n".join(tp_run.vllm_startup_report(argv)))
else:
    print("not run here: it needs vLLM, 2 CUDA GPUs and COURSE_VLLM_MODEL "
          f"(vllm found: {shutil.which('vllm') is not None}, GPUs: {torch.cuda.device_count()})")

# %% [markdown]
# ### Your turn: the KV cache of one GPU
# Write the KV bytes one GPU holds under tensor parallelism: `layers` layers, `kv_heads` KV heads of
# `head_dim`, degree `tp`, `tokens` tokens in the cache, `bytes_per_value` bytes each. Mind the models
# with fewer KV heads than GPUs. It is checked against `helpers.parallel.rank_kv_bytes_per_token` on
# Llama-2-70B, TinyLlama and a one-KV-head variant.
# (Stuck? `helpers/solutions.py` has an answer; in the CI profile it is checked instead of an unwritten cell.)

# %%
from helpers import exercises
def tp_kv_bytes_per_rank(layers, kv_heads, head_dim, tp, tokens, bytes_per_value):
    raise NotImplementedError   # your code here

exercises.check("tp_kv_bytes_per_rank", tp_kv_bytes_per_rank)

# %% [markdown]
# ### Check yourself
# 1. Llama-2-70B at tp=8: how many query heads and KV heads does one GPU hold?
# 2. AWQ-W4 Llama-2-70B on two GPUs: weights per GPU in GB?
# 3. Can Llama-2-70B run at tp=16, and what happens to its KV heads?

# %%
r8, r16 = parallel.rank_shape(c70, 8), parallel.rank_shape(c70, 16)
print(f"1) {r8.heads} query heads, {r8.kv_heads} KV head  2) {parallel.rank_weight_bytes(c70, 2, 'int4') / GB:.1f} GB  "
      f"3) yes: {r16.heads} query heads and {r16.kv_heads} KV head per GPU, each KV head on {r16.kv_replicas} GPUs")
