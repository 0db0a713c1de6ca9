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
# # 02 · The caching allocator, fragmentation and OOM diagnosis
#
# PyTorch does not call `cudaMalloc` for every tensor: its **caching allocator** keeps freed blocks
# for reuse. That makes allocation fast — and makes "out of memory" messages confusing, because
# memory can be *reserved but unusable*. This notebook makes each effect happen for real, measures
# it, and draws it. On a CPU-only machine the same sequences run through a small, faithful
# **simulator** of the allocator (`helpers/allocator_sim.py`), checked against the real allocator on
# an H200 (`results/h200/allocator_agreement.json`).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/gpu-quant-course/gpu-quant-course/blob/main/notebooks/02_allocator_fragmentation.ipynb)

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
import json
import matplotlib.pyplot as plt
import torch
from helpers import allocator_ops, allocator_replay, allocator_sim as A, data, leaks, measure, plots, key_numbers
from helpers.config import results_path
from helpers.device import has_cuda, get_device
from helpers.units import GiB, MiB
cuda = has_cuda()
print("CUDA:", cuda)

# %% [markdown]
# ## 1. The views of memory
# `memory_allocated` (live tensors) ≤ `memory_reserved` (held by the caching allocator) ≤ what the
# driver reports for **this process** (NVML by pid, the number `nvidia-smi` lists per process), which
# also counts its **CUDA context** (`non_torch`). The device's used memory (`mem_get_info`) counts
# every process on the card: on a shared GPU, `others` is everyone else's.

# %%
if cuda:
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda"); del x   # reserved, then cached
    measure.show_views()
else:
    print("No CUDA device: the four views need one. (process RSS:", measure.fmt_bytes(measure.views()["rss"]), ")")

# %% [markdown]
# ## 2. The policy in five rules (what the simulator implements)
# The sizes are the constants of PyTorch's `c10/cuda/CUDACachingAllocator.cpp` (`kMinBlockSize` 512 B,
# `kSmallSize` 1 MiB, `kSmallBuffer` 2 MiB, `kLargeBuffer` 20 MiB, `kMinLargeAlloc` 10 MiB,
# `kRoundLarge` 2 MiB); `helpers/allocator_sim.py` names them `K_MIN_BLOCK`, `K_SMALL_SIZE`, ….
# 1. sizes round up to 512 B; ≤ 1 MiB goes to a *small pool* of 2 MiB segments, larger to the
#    *large pool* (20 MiB segments below 10 MiB, else the size rounded up to 2 MiB);
# 2. a request takes the **best-fitting** cached free block of its pool;
# 3. a block is **split** when the remainder is > 1 MiB (large pool) or ≥ 512 B (small pool);
# 4. freed blocks **coalesce** with free neighbours in the same segment;
# 5. when nothing fits, a new segment is asked from the driver; if that fails the allocator releases
#    every *wholly free* segment and retries once, then raises OOM. `empty_cache()` also releases
#    only wholly free segments.

# %% [markdown]
# ## 3. The seed's snippet, run as written
# The source document (`../shared/seeds/002_…`, section "模拟碎片化") keeps twenty pairs of (1 GiB,
# 256 MiB) tensors in a list, then "frees the big ones" with `for big, small in tensors: del big`,
# calls `empty_cache()` and asks for 2 GiB, expecting a fragmentation OOM. First, what that loop
# really does — run verbatim on small CPU tensors, counting the "freed" tensors with weak references:

# %%
alive = allocator_ops.seed_loop_keeps_tensors_alive()
print(f"after the seed's loop: {alive['alive_as_written']} of {alive['n']} big tensors still alive; "
      f"after dropping the list's references: {alive['alive_after_fix']}")
assert alive["alive_as_written"] == alive["n"] and alive["alive_after_fix"] == 0

# %% [markdown]
# `del big` deletes the loop variable, not the list's reference: **nothing is freed**. It is the
# seed's own leak #2 ("列表/字典累积 tensor", a container keeps references). So the seed's snippet as written
# holds all 25 GiB to the end, `empty_cache()` releases nothing (no segment is free), and the 2 GiB
# request simply needs a new segment. Replayed on the simulator (and on the GPU, if there is one):

# %%
seed_ops = allocator_ops.seed_snippet("as_written")
sim = A.simulate(seed_ops)
print(f"as written, simulator: OOM={sim['oom']}  reserved at the end {sim['reserved'] / GiB:.2f} GiB")
seed_real = None
if cuda:  # the snippet holds 27 GiB at its end: a smaller card runs out while allocating
    seed_real = allocator_replay.run_real(seed_ops)
    at = f" at op {seed_real['failed_at']}: {seed_ops[seed_real['failed_at']][:2]}" if seed_real["oom"] else ""
    capped = f" (allocator cap {seed_real['cap'] / GiB:.2f} GiB)" if seed_real["cap"] else ""
    print(f"as written, real GPU : OOM={seed_real['oom']}{at}  reserved at the end {seed_real['reserved'] / GiB:.2f} GiB{capped}")
else:
    print("(no CUDA device here; the H200 reference run is in results/h200/reference_run.json)")
t4 = A.simulate(seed_ops, cap=int(15 * GiB))
print(f"as written, simulator under a 15 GiB cap (a T4): OOM={t4['oom']} at op {t4['failed_at']}: "
      f"{seed_ops[t4['failed_at']][:2] if t4['oom'] else ''}")

# %% [markdown]
# Now the version the text meant, with the big tensors really released
# (`tensors = [(None, s) for _, s in tensors]`):

# %%
meant_ops = allocator_ops.seed_snippet("corrected")
meant = A.simulate(meant_ops)
print(f"corrected, simulator: OOM={meant['oom']}  reserved at the end {meant['reserved'] / GiB:.2f} GiB")
assert not meant["oom"] and meant["reserved"] == 20 * 256 * MiB + 2 * GiB   # the prose below, checked
assert not sim["oom"] and sim["reserved"] == 20 * (GiB + 256 * MiB) + 2 * GiB
meant_real = allocator_replay.run_real(meant_ops) if cuda else None
if meant_real:
    print(f"corrected, real GPU : OOM={meant_real['oom']}  reserved at the end {meant_real['reserved'] / GiB:.2f} GiB")
key_numbers.record("02_allocator_fragmentation", seed_snippet_as_written_sim={k: sim[k] for k in ("oom", "reserved")},
                   seed_snippet_as_written_real=seed_real and {k: seed_real[k] for k in ("oom", "failed_at", "reserved", "cap")},
                   seed_snippet_corrected_sim={k: meant[k] for k in ("oom", "reserved")},
                   seed_snippet_corrected_real=meant_real and {k: meant_real[k] for k in ("oom", "reserved")})

# %% [markdown]
# **Still no OOM.** Each tensor ≥ 10 MiB gets a segment of its own (rule 1), so freeing a 1 GiB tensor
# leaves a *wholly free* 1 GiB segment, and `empty_cache()` hands all twenty back (rule 5): what
# stays reserved is the twenty 256 MiB tensors (5 GiB) plus a fresh segment for the 2 GiB request,
# 7 GiB in all (asserted above; as written, 27 GiB). Fragmentation needs holes **inside** segments.
#
# ## 4. A sequence that really fragments
# Allocate and free one 1 GiB "arena" (one cached segment), carve 16 blocks of 64 MiB out of it
# (best-fit + splitting), free every other block, then ask for 128 MiB — under a cap of 1 GiB +
# 64 MiB (`set_per_process_memory_fraction`, deterministic on any GPU from a T4 to an H200).

# %%
frag_ops, cap = allocator_ops.fragmenting_sequence(), allocator_ops.fragmenting_cap()
sim = A.simulate(frag_ops, cap)
print(f"simulator: OOM={sim['oom']} allocated {sim['allocated'] / MiB:.0f} MiB, reserved {sim['reserved'] / MiB:.0f} MiB,"
      f" reserved − allocated = {(sim['reserved'] - sim['allocated']) / MiB:.0f} MiB ≥ request 128 MiB")
real = allocator_replay.run_real(frag_ops, cap) if cuda else None
if real:
    print(f"real GPU : OOM={real['oom']} allocated {real['allocated'] / MiB:.0f} MiB, reserved {real['reserved'] / MiB:.0f} MiB")
    print(real.get("summary", "")[:2500])
fig, axes = plt.subplots(1, 2 if real else 1, figsize=(12 if real else 7, 2.2), squeeze=False)
plots.segments(sim["snapshot"], ax=axes[0][0], title="simulator: one 1 GiB segment, 8 holes of 64 MiB")
if real:
    plots.segments(real["snapshot"], ax=axes[0][1], title="real allocator (torch.cuda.memory_snapshot)")
plt.tight_layout(); plt.show()

# %% [markdown]
# 512 MiB are free — four times the request — but no *single* free block is 128 MiB, and a new
# segment would exceed the cap. `diagnose_oom` recognises the pattern from the numbers alone:

# %%
d = measure.diagnose_oom({"total": cap, "allocated": sim["allocated"], "reserved": sim["reserved"],
                          "driver_used": sim["reserved"]}, request=128 * MiB)

# %% [markdown]
# ### The fix: `expandable_segments`
# With `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (set **before CUDA initialises** — hence a
# fresh subprocess) each pool is one large virtual segment into which physical pages are mapped as
# needed (20 MiB pages in the large pool, 2 MiB in the small one). Under pressure the allocator unmaps
# the whole free pages inside the holes, then maps pages at the *lowest* address where free and
# unmapped space add up to the request — the end of the segment at first, a hole once it was unmapped:

# %%
sim_x = A.simulate(frag_ops, cap, expandable=True)
print(f"simulator (expandable): OOM={sim_x['oom']}, reserved {sim_x['reserved'] / MiB:.0f} MiB")
if cuda:
    real_x = allocator_replay.run_real(frag_ops, cap, expandable=True)
    print(f"real GPU  (expandable): OOM={real_x['oom']}, reserved {real_x['reserved'] / MiB:.0f} MiB")

pick3 = lambda r: None if r is None else {k: r[k] for k in ("oom", "allocated", "reserved")}
key_numbers.record("02_allocator_fragmentation", fragmenting_sim=pick3(sim), fragmenting_real=pick3(real),
                   expandable_sim=pick3(sim_x), expandable_real=pick3(real_x) if cuda else None)

# %% [markdown]
# Reserved ends at 760 MiB, not 640: only pages lying *wholly* inside a hole can be unmapped, and a
# 64 MiB hole holds two or three 20 MiB pages depending on where it starts.
#
# ## 5. What `empty_cache()` can and cannot do

# %%
ec = A.simulate(allocator_ops.empty_cache_sequence())
print(f"after empty_cache: allocated {ec['allocated'] / MiB:.0f} MiB, reserved {ec['reserved'] / MiB:.0f} MiB")
plots.segments(ec["snapshot"], title="a 64 MiB tensor pins its whole 512 MiB segment"); plt.show()

# %% [markdown]
# It returned the wholly free segment, but a single live 64 MiB block keeps its 512 MiB segment
# reserved. `empty_cache()` never moves tensors and never fixes fragmentation inside a segment; it
# only helps *other processes* (and `nvidia-smi`) see memory your process no longer uses.
#
# ### Simulator vs the real allocator (H200 reference)

# %%
ref = results_path("h200", "allocator_agreement.json")
if ref.exists():
    rows = json.loads(ref.read_text())
    for mode in ("default", "expandable"):
        mine = [r for r in rows if r["mode"] == mode]
        print(f"{mode:>10}: {sum(r['agree'] for r in mine)}/{len(mine)} sequences agree "
              "(OOM or not, the failing op, reserved and allocated bytes)")
    for r in rows:
        if not r["agree"]:
            print(f"  differs: {r['sequence']}: reserved real {r['real_reserved'] / MiB:.0f} MiB, "
                  f"sim {r['sim_reserved'] / MiB:.0f} MiB; OOM real/sim {r['real_oom']}/{r['sim_oom']}")

# %% [markdown]
# ### Your playground
# Type allocations and frees (`name=SIZE`, `free name`, `empty_cache`, separated by `;`), set a cap,
# switch `expandable_segments`, and press **run**: the segments and blocks of the simulator — and,
# on a GPU, of the real allocator in a fresh process beside it. Try to make an OOM happen while
# reserved − allocated is larger than the request. (On a machine without CUDA the widget says it
# shows the simulator only: a prediction.)

# %%
from helpers import widgets
widgets.allocator_playground("a=300MiB; b=20MiB; c=300MiB; free a; d=310MiB")

# %% [markdown]
# ## 6. Leaks: three patterns, measured, and their fixes
# Each demo measures the growth of live tensor bytes over 8 steps, then again with the fix, and
# returns memory to where it started.

# %%
dev = get_device()
start = leaks.live_bytes(dev)
rows = []
for fn in (leaks.kept_graph, leaks.accumulated_list, leaks.global_reference):
    rows.append((fn.__name__, fn(dev), fn(dev, fix=True)))
for name, bad, good in rows:
    print(f"{name:<18} leaked {measure.fmt_bytes(bad):>12}   with the fix {measure.fmt_bytes(good):>10}")
assert all(bad > 10 * max(good, 1) for _, bad, good in rows)
assert leaks.live_bytes(dev) == start, "a demo did not return memory to its start"

# %% [markdown]
# **A fourth suspect that is not a leak.** The source document's OOM checklist ("Step 4") asks
# whether `optimizer.zero_grad()` was forgotten, saying the gradients then "accumulate, one more copy
# of memory every step". Measured over 8 steps without `zero_grad`:

# %%
zg = leaks.missing_zero_grad(dev)
print(f"live bytes after the 1st backward {measure.fmt_bytes(zg['bytes_after_first'])}, after the 8th "
      f"{measure.fmt_bytes(zg['bytes_after_last'])}; same .grad storages: {zg['same_storages']}; "
      f"gradient norm ×{zg['grad_norm_growth']:.1f}")
assert zg["same_storages"] and zg["bytes_after_last"] == zg["bytes_after_first"]

# %% [markdown]
# `backward` adds into the existing `.grad` tensors in place: the memory is flat, the *values* grow
# (×8 after 8 identical steps). A forgotten `zero_grad` is a correctness bug — every update uses the
# sum of all past gradients — not a memory leak; look elsewhere for the OOM.
#
# ## 7. Who holds the memory? `top_tensors`
# The seed's gc walk, made robust: one row per *storage* (views of the same storage are counted
# once), parameters told apart from everything else.

# %%
keep = torch.nn.Linear(1024, 1024).to(dev)
view_a = torch.zeros(2048, 1024, device=dev); view_b = view_a[:1024]
for r in measure.top_tensors(4, device=dev.type):
    print(r)
del keep, view_a, view_b

# %% [markdown]
# ## 8. `diagnose_oom()`: the decision tree with numbers
# It reads the live device (or takes numbers) and names the branch: another process, fragmentation,
# genuinely too big (load-phase weights vs generation-phase activations/KV), or `/dev/shm`.

# %%
cases = {
    "fragmentation": dict(total=16 * GiB, allocated=10 * GiB, reserved=15 * GiB, driver_used=15.5 * GiB),
    "too big (weights)": dict(total=16 * GiB, allocated=15.5 * GiB, reserved=15.6 * GiB, driver_used=16 * GiB,
                              top=[{"bytes": 14 * GiB, "parameter": True}]),
    "other process": dict(total=80 * GiB, allocated=10 * GiB, reserved=11 * GiB, driver_used=70 * GiB),
}
for name, st in cases.items():
    measure.diagnose_oom(st, request=2 * GiB)
if cuda:
    measure.diagnose_oom(request=1 * GiB)

# %% [markdown]
# ## 9. A memory timeline
# `torch.cuda.memory._record_memory_history()` records every allocation with its stack. Here around
# one forward + backward of a small model; the pickle can be dropped onto
# <https://pytorch.org/memory_viz> for the interactive view.

# %%
if cuda:
    from helpers.models import model_from_config
    m = model_from_config("SmolLM2-135M", device="cuda", dtype=torch.bfloat16).train()
    ids = data.random_ids(m.config.vocab_size, (4, 512), device="cuda")
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    m(ids, labels=ids).loss.backward()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    plots.timeline(snap, title="SmolLM2-135M: forward then backward (batch 4 × 512)"); plt.show()
    import pickle; pickle.dump(snap, open("/tmp/memory_snapshot.pickle", "wb"))
    print("snapshot written to /tmp/memory_snapshot.pickle → open it at https://pytorch.org/memory_viz")
    del m, ids, snap; measure.free_memory()
else:
    print("The memory history needs CUDA. On a GPU this cell plots the forward/backward timeline.")

# %% [markdown]
# ### Your turn: the allocator's rounding rule
# Every request is rounded up before the allocator looks for a block. Write the rule; it is checked
# against the simulator's `round_size`.
# (Stuck? `helpers/solutions.py` has an answer; in the CI profile it is checked instead of an unwritten cell.)

# %%
from helpers import exercises
def round_alloc(size):
    raise NotImplementedError   # your code here

exercises.check("round_alloc", round_alloc)

# %% [markdown]
# ### Check yourself
# Under the simulator: allocate 30 MiB, free it, allocate 12 MiB then 17 MiB. How many segments and
# how many reserved MiB? (Answer: the 12 MiB block is carved from the cached 30 MiB segment, the
# remaining 18 MiB block then serves the 17 MiB request: one segment, 30 MiB.)

# %%
s = A.CachingAllocatorSim()
s.malloc(30 * MiB, "a"); s.free("a"); s.malloc(12 * MiB, "b"); s.malloc(17 * MiB, "c")
print(len(s.segments), s.reserved / MiB)
assert (len(s.segments), s.reserved) == (1, 30 * MiB)
