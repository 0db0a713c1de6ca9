"""The OOM and quantization clinic (notebook 09): the small measurements its cases need.

Each function turns a symptom into numbers with the course's own tools: the budget (weights, KV,
activations), the allocator simulator, the OOM decision tree (:func:`helpers.measure.diagnose_oom`),
and a copy task that shows quality a perplexity can hide.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch

from . import allocator_sim, budget, measure
from .models import check_token_ids

GiB = 1024**3


def generation_oom_point(config, cap_bytes: float, batch: int, contexts, dtype: str = "bf16",
                         kv_dtype: str | None = None) -> list[dict]:
    """Case 1: predicted total (weights + KV + activations) per context length against a cap."""
    rows = []
    for ctx in contexts:
        b = budget.budget(config, dtype, seq_len=ctx, batch=batch, kv_dtype=kv_dtype)
        rows.append({"context": ctx, "batch": batch, "kv_dtype": kv_dtype or "bf16", "weights": b["weights"],
                     "kv_cache": b["kv_cache"], "total": b["total"], "fits": b["total"] <= cap_bytes})
    return rows


def simulated_oom(ops: list, cap: int, expandable: bool = False) -> dict:
    """Case 2 / diagnosis on CPU: replay ``ops`` under ``cap`` in the allocator simulator; at the
    failing allocation, feed the simulator's numbers to :func:`helpers.measure.diagnose_oom`."""
    r = allocator_sim.simulate(ops, cap=cap, expandable=expandable)
    out = {"oom": r["oom"], "allocated": r["allocated"], "reserved": r["reserved"], "verdict": None}
    if r["oom"]:
        request = ops[r["failed_at"]][2]
        stats = {"total": cap, "allocated": r["allocated"], "reserved": r["reserved"],
                 "driver_used": r["reserved"], "shm": None}
        out["verdict"] = measure.diagnose_oom(stats, request=request, echo=False)["branch"]
        out["request"] = request
    return out


def growth_sequence(step: int = 64 * 1024**2, n: int = 20) -> list:
    """A KV-cache-like growth: each step allocates a bigger buffer and frees the previous one
    (``torch.cat`` on a growing cache), so the live set only grows."""
    ops = []
    for i in range(1, n + 1):
        ops.append(["alloc", f"kv{i}", i * step])
        if i > 1:
            ops.append(["free", f"kv{i - 1}"])
    return ops


def vocab_checks(tokenizer_len: int, tokenizer_vocab_size: int, embedding_rows: int, max_token_id: int) -> dict:
    """The source document's garbled-output check vs the right one.

    The seed asserts ``tokenizer.vocab_size == config.vocab_size``. Healthy models pad their
    embedding table (to a multiple of 64/128 for fast matmuls) and add special tokens that
    ``vocab_size`` does not count, so the assert fails on them. What must hold: every id the
    tokenizer can produce has an embedding row."""
    return {"seed_check (vocab_size == rows)": tokenizer_vocab_size == embedding_rows,
            "right_check (len(tokenizer) <= rows)": tokenizer_len <= embedding_rows,
            "max_id_in_range": max_token_id < embedding_rows}


@torch.no_grad()
def copy_task(model, ids: torch.Tensor, n: int = 8, span: int = 48, seed: int = 0) -> dict:
    """A deterministic task from plain text: show a passage, then the same passage again, and score
    top-1 next-token accuracy on the *second* copy (teacher-forced). A model that copies from its
    context (induction heads) is near 100 %; quantization noise in attention shows up here before
    it moves the perplexity much. Also returns accuracy on the first copy (ordinary prediction)."""
    if ids.dim() != 1 or len(ids) < n * span + 1:
        raise ValueError(f"ids must be a 1-D stream of at least n·span = {n * span} tokens, got {tuple(ids.shape)}")
    check_token_ids(model, ids, "ids")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - span, (n,), generator=g)
    passages = torch.stack([ids[s:s + span] for s in starts.tolist()])
    x = torch.cat([passages, passages], 1).to(next(model.parameters()).device)
    pred = model(x).logits.argmax(-1)[:, :-1].cpu()
    target = x[:, 1:].cpu()
    first = (pred[:, :span - 1] == target[:, :span - 1]).float().mean().item()
    second = (pred[:, span:] == target[:, span:]).float().mean().item()
    return {"first_copy_acc": first, "second_copy_acc": second, "prompts": n, "span": span}


def rtn_part(model, spec, part: str) -> int:
    """Round-to-nearest only the attention projections (``part="attn"``) or only the MLP (``"mlp"``)
    of every decoder layer, in place; returns how many linears changed. Two variants with different
    damage: the task section compares their perplexity with a copy task."""
    from .quant import quantizable_linears, rtn
    key = {"attn": "self_attn", "mlp": "mlp"}.get(part)
    if key is None:
        raise ValueError(f"part must be 'attn' or 'mlp', got {part!r}")
    n = 0
    for name, lin in quantizable_linears(model).items():
        if f".{key}." in name:
            lin.weight.data.copy_(rtn(lin.weight.data.float(), spec).to(lin.weight.dtype))
            n += 1
    return n


def calibration_held_bytes(config, n_samples: int, seq_len: int, act_bytes: int = 2, hold: str = "sequential") -> int:
    """Case 7: bytes of calibration activations a quantizer keeps. ``sequential`` (GPTQ/AWQ as the
    papers run them, llm-compressor's sequential pipeline): the inputs of one decoder layer plus its
    outputs, ``2 · n · L · hidden``. ``all_layers``: every layer's inputs cached at once (old AutoAWQ /
    llm-compressor 0.5 AWQ), ``(layers + 1) · n · L · hidden``."""
    if hold not in ("sequential", "all_layers"):
        raise ValueError(f"hold must be 'sequential' or 'all_layers', got {hold!r}")
    per = n_samples * seq_len * config.hidden_size * act_bytes
    return int(per * (2 if hold == "sequential" else config.num_hidden_layers + 1))


def fp8_support(capability: tuple[int, int] | None) -> str:
    """Case 10: what FP8 a GPU of this compute capability can run natively."""
    if capability is None:
        return "no CUDA device: FP8 tensors exist in PyTorch on CPU (storage, casts) but there are no FP8 matmul units"
    if tuple(capability) >= (8, 9):
        return (f"compute capability {capability[0]}.{capability[1]} ≥ 8.9: FP8 tensor cores "
                "(torch._scaled_mm, vLLM fp8 W8A8, FP8 KV cache in attention kernels)")
    return (f"compute capability {capability[0]}.{capability[1]} < 8.9: no FP8 tensor cores. FP8 weights can be "
            "stored and dequantized (weight-only, e.g. vLLM's Marlin FP8 path on Ampere), but W8A8 FP8 "
            "matmuls are refused (vLLM: 'Minimum capability: 89/90'); a T4 is 7.5")


_SHARE_SCRIPT = textwrap.dedent(r"""
    import json, sys, time, torch
    cap_gib, want_gib, name = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    torch.cuda.set_per_process_memory_fraction(cap_gib * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    got, err = 0, None
    chunks = []
    try:
        for _ in range(int(want_gib * 4)):
            chunks.append(torch.empty(2**28, dtype=torch.uint8, device="cuda"))   # 256 MiB each
            got += 0.25
            time.sleep(0.05)
    except torch.OutOfMemoryError as e:
        err = str(e).splitlines()[0][:160]
    print(json.dumps({"participant": name, "cap_gib": cap_gib, "wanted_gib": want_gib, "got_gib": got,
                      "oom": err is not None, "error": err}))
""")


def shared_gpu_demo(caps_and_wants: list[tuple[float, float]]) -> list[dict]:
    """Several processes on one GPU at once, each under its own allocator cap
    (``torch.cuda.set_per_process_memory_fraction``, what :func:`helpers.device.limit_memory` sets):
    the one that asks for more than its cap gets an OOM, the others get what they asked for."""
    if not torch.cuda.is_available():
        raise RuntimeError("shared_gpu_demo needs a CUDA device")
    procs = [subprocess.Popen([sys.executable, "-c", _SHARE_SCRIPT, str(cap), str(want), f"p{i}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, (cap, want) in enumerate(caps_and_wants)]
    rows = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        line = [ln for ln in out.splitlines() if ln.startswith("{")]
        rows.append(json.loads(line[-1]) if line else {"error": err[-300:]})
    return rows


def _requested_bytes(message: str) -> int | None:
    import re
    m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|B)", message)
    if not m:
        return None
    return int(float(m.group(1)) * {"GiB": GiB, "MiB": 2**20, "KiB": 2**10, "B": 1}[m.group(2)])


def caught_oom(fn, need: float | None = None) -> dict:
    """Run ``fn()``; if it raises a real CUDA OOM, diagnose it *at that moment* (the failing frame's
    tensors are still alive inside the ``except``) with :func:`helpers.measure.diagnose_oom` — given
    ``need``, the bytes the phase needs by :mod:`helpers.budget` — then free everything.
    Returns ``{"oom", "branch", "why", "request"}``."""
    try:
        fn()
        return {"oom": False, "branch": None, "why": None, "request": None}
    except torch.OutOfMemoryError as e:
        request = _requested_bytes(str(e))
        d = measure.diagnose_oom(request=request, need=need, echo=False)
        out = {"oom": True, "branch": d["branch"], "why": d["why"], "request": request}
    measure.free_memory()
    return out


@torch.no_grad()
def kv_magnitudes(model, prompts: torch.Tensor) -> dict:
    """Case 8: where a model's keys and values sit on the FP8 scale: their largest magnitude and the
    share of entries below e4m3's smallest normal number (2^-6), after one prefill of ``prompts``."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    model(prompts, past_key_values=cache, use_cache=True)
    ks = torch.cat([layer.keys.flatten().float() for layer in cache.layers])
    vs = torch.cat([layer.values.flatten().float() for layer in cache.layers])
    tiny = 2.0 ** -6
    return {"max_abs_k": ks.abs().max().item(), "max_abs_v": vs.abs().max().item(),
            "k_subnormal": (ks.abs() < tiny).float().mean().item(), "v_subnormal": (vs.abs() < tiny).float().mean().item()}


@torch.no_grad()
def decode_until_oom(model, batch: int, prompt_len: int, max_new: int = 4096) -> int:
    """Prefill, then decode with a growing cache until CUDA runs out (the OOM is *not* caught here, so
    :func:`caught_oom` can diagnose it); returns the tokens generated if ``max_new`` is reached first."""
    dev = next(model.parameters()).device
    ids = torch.randint(3, model.config.vocab_size - 1, (batch, prompt_len), device=dev)
    out = model(ids, use_cache=True, logits_to_keep=1)
    cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    for _ in range(max_new):
        out = model(nxt, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
    return max_new


def fragment_on_gpu(block: int = 16 * 2**20, n: int = 16) -> None:
    """Replay :func:`helpers.allocator_sim.fragmenting_sequence` with real CUDA tensors (under a cap of
    the arena plus one block, its last request runs out: the real-allocator twin of case 2)."""
    keep = {}
    for op in allocator_sim.fragmenting_sequence(block, n):
        if op[0] == "alloc":
            keep[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
        else:
            keep.pop(op[1])
