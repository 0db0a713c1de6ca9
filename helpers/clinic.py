"""The OOM and quantization clinic (notebook 09): the small measurements its cases need.

Each function turns a symptom into numbers with the course's own tools: the budget (weights, KV,
activations), the allocator simulator, the OOM decision tree (:func:`helpers.measure.diagnose_oom`),
and a copy task that shows quality a perplexity can hide.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

import torch

from . import allocator_ops, allocator_sim, budget, gpu_share, measure
from . import validate as v
from .data import random_ids
from .device import memory_limit
from .generation import greedy_tokens, prefill
from .kvcache import make_cache
from .models import architecture_config as models_config
from .models import check_token_ids, model_from_config
from .qspec import QuantSpec
from .units import GiB, KiB, MiB


def generation_oom_point(config, cap_bytes: float, batch: int, contexts, dtype: str = "bf16",
                         kv_dtype: str | None = None) -> list[dict]:
    """Case 1: predicted total (weights + KV + activations) per context length against a cap."""
    cap_bytes = v.positive_number(cap_bytes, "cap_bytes", "the card's bytes, e.g. 24e9")
    batch = v.positive_int(batch, "batch")
    if isinstance(contexts, (str, bytes)) or not hasattr(contexts, "__iter__"):
        raise TypeError(f"contexts must be a list of context lengths (tokens), got {type(contexts).__name__}")
    contexts = [v.positive_int(c, f"contexts[{i}]") for i, c in enumerate(contexts)]
    rows = []
    for ctx in contexts:
        b = budget.budget(config, dtype, seq_len=ctx, batch=batch, kv_dtype=kv_dtype)
        rows.append({"context": ctx, "batch": batch, "kv_dtype": kv_dtype or "bf16", "weights": b["weights"],
                     "kv_cache": b["kv_cache"], "total": b["total"], "fits": b["total"] <= cap_bytes})
    return rows


def simulated_oom(ops: list, cap: int, expandable: bool = False, max_split_size: int | None = None) -> dict:
    """Case 2 / diagnosis on CPU: replay ``ops`` under ``cap`` in the allocator simulator; at the
    failing allocation, feed the simulator's numbers to :func:`helpers.measure.diagnose_oom` (the cap
    is the limit: no other process is involved). ``trace`` is (allocated, reserved) after every op."""
    r = allocator_sim.simulate(ops, cap=cap, expandable=expandable, max_split_size=max_split_size)
    out = {"oom": r["oom"], "allocated": r["allocated"], "reserved": r["reserved"], "verdict": None,
           "trace": r["trace"], "peak_reserved": r["peak_reserved"]}
    if r["oom"]:
        request = ops[r["failed_at"]][2]
        stats = {"total": cap, "capped": True, "allocated": r["allocated"], "reserved": r["reserved"]}
        out["verdict"] = measure.diagnose_oom(stats, request=request, echo=False)["branch"]
        out["request"] = request
    return out


def holes_sequences() -> dict:
    """Case 2's two fragmenting workloads, ``name → (ops, cap)``: the same pattern (a cached segment
    carved into blocks, every other one freed, then a request of two blocks under a cap of the arena
    plus one block) with holes of 64 MiB and of 16 MiB. ``expandable_segments`` can unmap the whole
    20 MiB pages (``kLargeBuffer``) inside a 64 MiB hole and map them again where the request fits; a
    16 MiB hole holds no whole page, so there is nothing to unmap and it runs out in both modes."""
    out = {}
    for mib in (64, 16):
        block = mib * MiB
        out[f"{mib} MiB holes"] = (allocator_ops.fragmenting_sequence(block), allocator_ops.fragmenting_cap(block))
    return out


def vocab_checks(tokenizer_len: int, tokenizer_vocab_size: int, embedding_rows: int, max_token_id: int) -> dict:
    """The source document's garbled-output check vs the right one.

    The seed asserts ``tokenizer.vocab_size == config.vocab_size``. Healthy models pad their
    embedding table (to a multiple of 64/128 for fast matmuls) and add special tokens that
    ``vocab_size`` does not count, so the assert fails on them. What must hold: every id the
    tokenizer can produce has an embedding row."""
    tokenizer_len = v.positive_int(tokenizer_len, "tokenizer_len", "len(tokenizer)")
    tokenizer_vocab_size = v.positive_int(tokenizer_vocab_size, "tokenizer_vocab_size", "tokenizer.vocab_size")
    embedding_rows = v.positive_int(embedding_rows, "embedding_rows", "model.get_input_embeddings().weight.shape[0]")
    max_token_id = v.non_negative_int(max_token_id, "max_token_id")
    return {"seed_check (vocab_size == rows)": tokenizer_vocab_size == embedding_rows,
            "right_check (len(tokenizer) <= rows)": tokenizer_len <= embedding_rows,
            "max_id_in_range": max_token_id < embedding_rows}


@torch.no_grad()
def copy_task(model, ids: torch.Tensor, n: int = 8, span: int = 48, seed: int = 0) -> dict:
    """A deterministic task from plain text: show a passage, then the same passage again, and score
    top-1 next-token accuracy on the *second* copy (teacher-forced). A model that copies from its
    context (induction heads) is near 100 %; quantization noise in attention shows up here before
    it moves the perplexity much. Also returns accuracy on the first copy (ordinary prediction)."""
    n, span = v.positive_int(n, "n", "how many passages"), v.positive_int(span, "span", "tokens per passage")
    v.tensor(ids, "ids", kind="int")
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
    if not isinstance(spec, QuantSpec):
        raise TypeError(f"spec must be a QuantSpec (e.g. QuantSpec(3, 64)), got {type(spec).__name__}")
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
    v.model_config(config)
    n_samples, seq_len = v.positive_int(n_samples, "n_samples"), v.positive_int(seq_len, "seq_len")
    act_bytes = v.positive_int(act_bytes, "act_bytes", "bytes per activation: 2 for bf16, 4 for fp32")
    per = n_samples * seq_len * config.hidden_size * act_bytes
    return int(per * (2 if hold == "sequential" else config.num_hidden_layers + 1))


def fp8_support(capability: tuple[int, int] | None) -> str:
    """Case 10: what FP8 a GPU of this compute capability can run. FP8 *matmuls* (W8A8, e4m3 attention)
    need FP8 tensor cores, compute capability ≥ 8.9 (Ada, Hopper, Blackwell); an FP8 *KV cache* only
    stores bytes and converts them to 16-bit in the attention kernel, so vLLM's ``fp8_e5m2`` cache runs
    without FP8 units (vllm-project/vllm#2279 was tested on an A100)."""
    if capability is not None:
        if isinstance(capability, (str, bytes)) or not hasattr(capability, "__len__") or len(capability) != 2:
            raise ValueError(f"capability must be (major, minor), e.g. torch.cuda.get_device_capability(), "
                             f"got {capability!r}")
        capability = (v.non_negative_int(capability[0], "capability[0]"),
                      v.non_negative_int(capability[1], "capability[1]"))
    if capability is None:
        return "no CUDA device: FP8 tensors exist in PyTorch on CPU (storage, casts) but there are no FP8 matmul units"
    if tuple(capability) >= (8, 9):
        return (f"compute capability {capability[0]}.{capability[1]} ≥ 8.9: FP8 tensor cores "
                "(torch._scaled_mm, vLLM fp8 W8A8, FP8 KV cache in attention kernels)")
    return (f"compute capability {capability[0]}.{capability[1]} < 8.9: no FP8 tensor cores. W8A8 FP8 matmuls "
            "are refused (vLLM: 'Minimum capability: 89'); FP8 weights can still be stored and dequantized "
            "(weight-only), and an fp8_e5m2 KV cache works (a storage format, converted in the attention "
            "kernel); a T4 is 7.5, an A100 8.0")


def shared_gpu_demo(participants: list[tuple[float, float]], lift: tuple[int, ...] = ()) -> list[dict]:
    """Several processes on one GPU at once (:mod:`helpers.gpu_share`), participant ``i`` under an
    allocator cap of ``participants[i][0]`` GiB asking for ``participants[i][1]`` GiB; those whose index
    is in ``lift`` lift their own cap (``set_per_process_memory_fraction(1.0)``). Each row says what
    the process got, whether it ran out, and its own device memory outside PyTorch (NVML)."""
    for i, pw in enumerate(participants):
        if len(pw) != 2 or not all(isinstance(v, (int, float)) and 0 < v < float("inf") for v in pw):
            raise ValueError(f"participants[{i}] must be (cap GiB, wanted GiB), two positive numbers, got {pw!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("shared_gpu_demo needs a CUDA device")
    procs = []
    for i, (cap, want) in enumerate(participants):
        argv, env = gpu_share.command("participant", "--cap-gib", cap, "--want-gib", want, "--name", f"p{i}",
                                      *(["--lift"] if i in lift else []))
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    rows = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        rows.append(gpu_share.last_json(out) or {"error": err[-300:]})
    return rows


@contextlib.contextmanager
def other_process(gib: float):
    """Another process holding ``gib`` GiB on the GPU for the duration of the block (a second user of
    a shared card, :mod:`helpers.gpu_share` ``hold``). Yields the bytes it holds."""
    if not (isinstance(gib, (int, float)) and 0 < gib < float("inf")):
        raise ValueError(f"gib must be a positive, finite number of GiB, got {gib!r}")
    argv, env = gpu_share.command("hold", "--gib", gib)
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    try:
        line = p.stdout.readline()
        if not line.startswith("{"):
            raise RuntimeError(f"the holding process did not start: {p.stderr.read()[-400:]}")
        yield json.loads(line)["holding_bytes"]
    finally:
        with contextlib.suppress(Exception):
            p.stdin.close()
        p.wait(timeout=60)


def _requested_bytes(message: str) -> int | None:
    import re
    m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|B)", message)
    if not m:
        return None
    return int(float(m.group(1)) * {"GiB": GiB, "MiB": MiB, "KiB": KiB, "B": 1}[m.group(2)])


def caught_oom(fn, need: float | None = None) -> dict:
    """Run ``fn()``; if it raises a real CUDA OOM, diagnose it *at that moment* (the failing frame's
    tensors are still alive inside the ``except``) with :func:`helpers.measure.diagnose_oom` — given
    ``need``, the bytes the phase needs by :mod:`helpers.budget` — then free everything. Returns
    ``{"oom", "branch", "why", "request", "process_bytes", "others_bytes", "source"}``: this process's
    device memory and the other processes' (NVML per process) at the failure, and where they came from."""
    if not callable(fn):
        raise TypeError(f"fn must be a zero-argument callable that may run out of memory, got {type(fn).__name__}")
    if need is not None:
        need = v.non_negative_number(need, "need", "the bytes the phase needs, from helpers.budget")
    try:
        fn()
        return {"oom": False, "branch": None, "why": None, "request": None, "process_bytes": None,
                "others_bytes": None, "source": None}
    except torch.OutOfMemoryError as e:
        request = _requested_bytes(str(e))
        d = measure.diagnose_oom(request=request, need=need, echo=False)
        out = {"oom": True, "branch": d["branch"], "why": d["why"], "request": request,
               "process_bytes": d["process_bytes"], "others_bytes": d["others_bytes"], "source": d["source"]}
    measure.free_memory()
    return out


@dataclass(frozen=True)
class OOMScenario:
    """One real out-of-memory case of notebook 09: ``run`` under an allocator cap of ``cap_gib()`` GiB
    (computed just before it runs; None: no cap), ``need`` the bytes the phase needs by the budget,
    the verdict :func:`helpers.measure.diagnose_oom` must give, and ``around``: a context entered
    before the run and left after the diagnosis (e.g. another process holding memory — it must still
    hold it when the OOM is diagnosed)."""
    name: str
    expected: str
    run: Callable[[], object]
    cap_gib: Callable[[], float | None]
    need: float | None = None
    around: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


def largest_free_block() -> int:
    """The largest free block the caching allocator holds now (``torch.cuda.memory_snapshot``)."""
    return max((b["size"] for s in torch.cuda.memory_snapshot() for b in s["blocks"]
                if b["state"] == "inactive"), default=0)


def fragment_on_gpu(block: int, n: int = 16) -> None:
    """Replay :func:`helpers.allocator_ops.fragmenting_sequence` with real CUDA tensors of ``block``
    bytes (under a cap of the memory already reserved plus the arena plus one block, its last request
    runs out: the real-allocator twin of case 2)."""
    block = v.positive_int(block, "block", "bytes per block")
    n = v.positive_int(n, "n", "blocks in the arena")
    keep = {}
    for op in allocator_ops.fragmenting_sequence(block, n):
        if op[0] == "alloc":
            keep[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
        else:
            keep.pop(op[1])


def fragmentation_block() -> int:
    """A block size for :func:`fragment_on_gpu` larger than any free block already cached (so the
    sequence carves every block from its own arena, whatever ran before): at least 64 MiB."""
    return max(64 * MiB, (largest_free_block() // (2 * MiB) + 2) * 2 * MiB)


def real_oom_scenarios(model) -> list[OOMScenario]:
    """The four real OOMs the clinic diagnoses, on ``model`` (an architecture on the GPU, e.g. SmolLM2
    in bf16): a load (fp32 TinyLlama-1.1B under 2 GiB), a prefill (64 × 4096 tokens under the weights
    + 1 GiB), a decode (batch 64 growing from 256 to 4352 tokens under the weights + 0.5 GiB) — each
    needs more than its cap by :mod:`helpers.budget`, so **too-big** — and a fragmentation (holes
    between live blocks of one segment under the reserved memory + the arena + one block)."""
    tiny = models_config("TinyLlama-1.1B")
    w = torch.cuda.memory_allocated()
    dev = next(model.parameters()).device
    block = {}

    def frag_cap():
        block["b"] = fragmentation_block()
        return (torch.cuda.memory_reserved() + 17 * block["b"]) / GiB

    return [
        OOMScenario("load: fp32 TinyLlama-1.1B under 2 GiB", "too-big",
                    lambda: model_from_config("TinyLlama-1.1B", device="cuda", dtype=torch.float32),
                    lambda: 2.0, budget.weight_bytes(tiny, "fp32")),
        OOMScenario("prefill 64 × 4096 under weights + 1 GiB", "too-big",
                    lambda: model(random_ids(model.config.vocab_size, (64, 4096), device=dev), use_cache=False),
                    lambda: w / GiB + 1.0, w + budget.activation_bytes(model.config, 4096, 64)["peak"]),
        OOMScenario("decode batch 64, 256 → 4352 tokens, under weights + 0.5 GiB", "too-big",
                    lambda: decode_until_oom(model, 64, 256, 4096),
                    lambda: w / GiB + 0.5, w + budget.kv_bytes(model.config, 256 + 4096, 64)),
        OOMScenario("fragmentation: 8 holes between live blocks, a 2-block request", "fragmentation",
                    lambda: fragment_on_gpu(block["b"]), frag_cap),
    ]


def device_full_scenario(leave_gib: float = 2.0, request_gib: float = 4.0) -> OOMScenario:
    """A fifth real OOM: another process holds all of the device but ``leave_gib`` GiB, and this one
    (no cap) asks for ``request_gib`` GiB — the driver refuses, and the verdict must be other-process."""
    leave_gib = v.positive_number(leave_gib, "leave_gib")
    request_gib = v.positive_number(request_gib, "request_gib")
    if request_gib <= leave_gib:
        raise ValueError(f"request_gib ({request_gib}) must exceed leave_gib ({leave_gib}) for the device to refuse it")
    def around():
        free, _ = torch.cuda.mem_get_info()
        return other_process((free - leave_gib * GiB) / GiB)

    return OOMScenario(f"device full: another process leaves {leave_gib:g} GiB, this one asks {request_gib:g} GiB",
                       "other-process", lambda: torch.empty(int(request_gib * GiB), dtype=torch.uint8, device="cuda"),
                       lambda: None, around=around)


def why_not_fill_the_card(index: int = 0, others_gib: float = 1.0) -> str | None:
    """Why :func:`device_full_scenario` must not run here, or None where it may: it fills GPU ``index``
    to the last ``leave_gib``, which on a shared card is everyone's memory. It is refused when this
    process is one participant of a shared card (``COURSE_GPU_CAP_GIB`` set, docs/workshop.md) or when
    other processes already hold more than ``others_gib`` GiB of it (NVML's used memory minus this
    process's, :func:`helpers.measure.views`' ``others``; the driver's own reservation stays under
    1 GiB). Where the driver cannot tell this process's memory (``others`` is None), only the cap decides."""
    from . import device
    others_gib = v.positive_number(others_gib, "others_gib")
    if device.cap_gib() is not None:
        return (f"this process is one participant of a shared card (COURSE_GPU_CAP_GIB={device.cap_gib():g}): "
                "filling the card would take the other participants' memory")
    others = measure.views(index).get("others")
    if others is not None and others > others_gib * GiB:
        return (f"other processes hold {others / GiB:.1f} GiB of this card: filling it "
                "would take memory they may be about to use")
    return None


def diagnose_real_ooms(scenarios: list[OOMScenario], progress: bool = True) -> list[dict]:
    """Run each scenario under its cap with :func:`caught_oom`; one row each: ``scenario``, ``oom``,
    ``verdict``, ``expected``, ``ok`` (ran out and diagnosed as expected), this process's and the other
    processes' device memory at the failure (``process_bytes``, ``others_bytes``, NVML) and their
    ``source``, the request and the verdict's reason. CUDA only."""
    from tqdm.auto import tqdm
    if not all(isinstance(sc, OOMScenario) for sc in scenarios):
        raise TypeError("scenarios must be OOMScenario objects (real_oom_scenarios(model), device_full_scenario())")
    rows = []
    for sc in tqdm(scenarios, desc="real OOMs", disable=not v.flag(progress, "progress")):
        measure.free_memory()
        cap = sc.cap_gib()
        with sc.around(), memory_limit(cap) if cap is not None else contextlib.nullcontext():
            r = caught_oom(sc.run, need=sc.need)
        rows.append({"scenario": sc.name, "oom": r["oom"], "verdict": r["branch"], "expected": sc.expected,
                     "ok": r["oom"] and r["branch"] == sc.expected, "cap_gib": cap, "request": r["request"],
                     "process_bytes": r["process_bytes"], "others_bytes": r["others_bytes"], "source": r["source"],
                     "why": r["why"]})
    measure.free_memory()
    return rows


@torch.no_grad()
def kv_magnitudes(model, prompts: torch.Tensor) -> dict:
    """Case 8: where a model's keys and values sit on the FP8 scale: their largest magnitude and the
    share of entries below e4m3's smallest normal number (2^-6), after one prefill of ``prompts``."""
    from transformers import DynamicCache
    v.tensor(prompts, "prompts", ndim=2, kind="int", layout="[batch, tokens] of token ids")
    check_token_ids(model, prompts, "prompts")
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
    batch, prompt_len = v.positive_int(batch, "batch"), v.positive_int(prompt_len, "prompt_len")
    max_new = v.non_negative_int(max_new, "max_new")
    dev = next(model.parameters()).device
    cache = make_cache("baseline", model.config)
    nxt = prefill(model, random_ids(model.config.vocab_size, (batch, prompt_len), device=dev), cache)
    for _ in islice(greedy_tokens(model, cache, nxt), max_new):
        pass
    return max_new


def group_sweep(model, ids: torch.Tensor, bits: int = 3, groups=(32, 64, 192, None), max_tokens: int = 8192,
                seq_len: int = 256) -> list[dict]:
    """The source document's "use group 256 instead of 128" checked: round-to-nearest at ``bits`` bits
    with each group size (None: one scale per output channel) on a copy of ``model``, and its
    perplexity on ``ids`` (``seq_len`` windows, ``max_tokens`` tokens) beside the bits per weight."""
    import copy

    from .evaluate import perplexity
    from .quant import bits_per_weight, rtn_model
    max_tokens, seq_len = v.positive_int(max_tokens, "max_tokens"), v.positive_int(seq_len, "seq_len")
    rows = []
    for g in groups:
        m = copy.deepcopy(model)
        rtn_model(m, QuantSpec(bits, g))
        rows.append({"group": g or "per channel", "bits_per_weight": bits_per_weight(bits, g),
                     "ppl": perplexity(m, ids, seq_len=seq_len, max_tokens=max_tokens, progress=False)["ppl"]})
        del m
    return rows


def task_drops(model, ids: torch.Tensor, spec: QuantSpec | None = None, n: int = 32, span: int = 48,
               max_tokens: int = 8192, seq_len: int = 256) -> list[dict]:
    """Perplexity (``seq_len`` windows over the first ``max_tokens`` of ``ids``) against a copy task
    (:func:`copy_task`, ``n`` passages of ``span`` tokens) for the model and two round-to-nearest
    variants on the grid ``spec`` (a :class:`~helpers.qspec.QuantSpec`; None: ``QuantSpec(3, 64)``)
    that damage different parts: only the attention projections, only the MLPs (:func:`rtn_part`)."""
    import copy

    from .evaluate import perplexity
    spec = QuantSpec(3, 64) if spec is None else spec
    if not isinstance(spec, QuantSpec):
        raise TypeError(f"spec must be a QuantSpec (e.g. QuantSpec(3, 64): 3 bits, groups of 64), got "
                        f"{type(spec).__name__} {spec!r}")
    grid = f"W{spec.bits} {'per channel' if spec.group_size is None else f'g{spec.group_size}'}"
    rows = []
    for label, part in (("reference", None), (f"{grid}, attention only", "attn"), (f"{grid}, MLP only", "mlp")):
        m = copy.deepcopy(model)
        if part:
            rtn_part(m, spec, part)
        ppl = perplexity(m, ids, seq_len=seq_len, max_tokens=max_tokens, progress=False)["ppl"]
        rows.append({"model": label, "ppl": ppl, **copy_task(m, ids, n=n, span=span)})
        del m
    return rows


def rankings(rows: list[dict]) -> str:
    """Which of :func:`task_drops`'s two variants perplexity ranks worse, and which the copy task does."""
    if len(rows) != 3 or not all(isinstance(r, dict) and {"ppl", "second_copy_acc"} <= set(r) for r in rows):
        raise ValueError("rows must be task_drops' three rows (reference, attention only, MLP only), each with "
                         "'ppl' and 'second_copy_acc'")
    a, mlp = rows[1], rows[2]
    return (f"perplexity ranks {'MLP-only' if mlp['ppl'] > a['ppl'] else 'attention-only'} as the worse variant; "
            f"the copy task ranks {'attention-only' if a['second_copy_acc'] < mlp['second_copy_acc'] else 'MLP-only'}"
            " as the worse one")
