"""Generation experiments: what ``generate`` (and a hand-written prefill/decode loop) costs in memory
and time, how KV-cache formats change it, and where a card runs out.

This module sits above :mod:`helpers.measure` (memory views, the stage profiler) and
:mod:`helpers.kvcache` (cache formats): it runs the model with a cache and measures it.

* :func:`measure_weights`, :func:`measure_generate` — bytes of the weights and of one ``generate``
  call (prefill and decode peaks separately, by hooks on the model);
* :func:`prefill_decode` — the two phases by hand, each recorded by a :class:`StageProfiler`;
* :func:`teacher_forced_logits`, :func:`compare_logits`, :func:`kv_ab` — the KV A/B test: same
  model, prompts and continuation, only the cache format varies;
* :func:`tokens_until_oom`, :func:`load_under_cap` — where generation and loading run out of memory.
"""
from __future__ import annotations

import time
from itertools import islice
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM

from .budget import kv_bytes
from .data import random_ids
from .device import memory_limit, process_gpu_bytes
from .kvcache import available_kinds, make_cache, stored_bytes
from .measure import PeakMeter, StageProfiler, free_memory, oom_guard, requested_bytes, reset_peak, warmup_cublas
from .models import model_from_config
from .qspec import positive_int
from .units import GiB


def greedy_tokens(model, cache, token: torch.Tensor):
    """Greedy decoding, one step per item: feed ``token`` [batch, 1] through ``model`` with ``cache``
    and yield the argmax of the next-token logits, fed back at the next step (endless: bound it with
    ``zip``/``islice``). The logits are dropped each step, so only the cache grows."""
    while True:
        out = model(token, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        del out
        yield token


def prefill(model, ids: torch.Tensor, cache) -> torch.Tensor:
    """Run the prompt ``ids`` [batch, tokens] into ``cache``; return the greedy first token [batch, 1]
    (only the last position's logits are computed: ``logits_to_keep=1``)."""
    out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1:].argmax(-1)


def measure_weights(arch: str, device="cuda", dtype=torch.bfloat16, attn_implementation: str | None = None,
                    prepare=None):
    """Instantiate architecture ``arch`` on ``device``; return (model, bytes it added to allocated).
    ``prepare(model)``, if given, runs before the measurement ends (e.g. swapping in packed layers)."""
    warmup_cublas()
    free_memory()
    before = torch.cuda.memory_allocated()
    model = model_from_config(arch, device=device, dtype=dtype, attn_implementation=attn_implementation)
    if prepare is not None:
        prepare(model)
    free_memory()
    return model, torch.cuda.memory_allocated() - before


@torch.no_grad()
def measure_generate(model, seq_len: int, batch: int, new_tokens: int = 16, cache: str = "baseline",
                     seed: int = 0) -> dict:
    """Run ``generate`` on random prompts and measure the KV cache and the peak over the weights.

    Returns kv_meas (bytes the cache ``generate`` ended with stores), cache_used (whether that is the
    cache passed in: Phi-3's ``prepare_inputs_for_generation`` sets it aside at the step whose input
    reaches ``original_max_position_embeddings + 1`` tokens and the model builds its own dynamic
    cache — :func:`helpers.budget_check.sets_cache_aside` — so a static cache asked for there is not
    what ran), peak_meas (max_memory_allocated during the call
    minus allocated before it, prompt included), prefill_meas / decode_meas (the same peak restricted
    to the first forward call and to the later ones, read by hooks on the model; forward_peaks: every
    call's; prefill_requested / decode_requested: the same peaks in the bytes the tensors asked for,
    :meth:`~helpers.measure.PeakMeter.read_requested`), reserved, seconds
    and tokens/s. ``cache`` is a :data:`helpers.kvcache.KV_KINDS` name or ``"static"``.
    """
    dev = next(model.parameters()).device
    ids = random_ids(model.config.vocab_size, (batch, seq_len), seed=seed, device=dev)
    mask = torch.ones_like(ids)
    kv = make_cache(cache, model.config, max_cache_len=seq_len + new_tokens)
    free_memory()
    meter = PeakMeter(dev)
    calls, requested, between = [], [], [0]  # per-forward peaks (blocks, tensors); the peak outside forward calls

    def pre(*_):
        if meter.cuda:
            between[0] = max(between[0], meter.read())
            meter.restart()

    def post(*_):
        if meter.cuda:
            calls.append(meter.read())
            requested.append(meter.read_requested())
            meter.restart()

    hooks = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
    t0 = time.perf_counter()
    try:
        with meter:
            out = model.generate(ids, attention_mask=mask, past_key_values=kv, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, disable_compile=True,
                                 return_dict_in_generate=True)
    finally:
        for h in hooks:
            h.remove()
    secs = time.perf_counter() - t0
    used = out.past_key_values      # the cache generate ended with: a model may set the given one aside
    res = {"kv_meas": stored_bytes(used) if used is not None else 0, "cache_used": used is kv, "seconds": secs,
           "tokens_per_s": batch * new_tokens / secs, "new_tokens": out.sequences.shape[1] - seq_len}
    if meter.cuda:
        between[0] = max(between[0], meter.peak)
        res.update(prefill_meas=calls[0], decode_meas=max(calls[1:], default=0), forward_peaks=calls,
                   prefill_requested=requested[0], decode_requested=max(requested[1:], default=0),
                   peak_meas=max(calls + between), reserved=torch.cuda.memory_reserved(),
                   process_gpu_bytes=process_gpu_bytes(dev.index or 0))   # nvidia-smi's number, cache still held
    del out, kv, used
    free_memory()
    return res


@torch.no_grad()
def teacher_forced_logits(model, ids: torch.Tensor, continuation: torch.Tensor, kind: str) -> torch.Tensor:
    """Prefill ``ids`` into a fresh ``kind`` cache, then feed ``continuation`` one token at a time;
    returns the next-token logits at every step, ``[batch, len(continuation)+1, vocab]`` (fp32).

    Feeding the *same* tokens to every cache isolates the cache's error from divergence of the
    generated text (a free-running comparison compounds one different token into many)."""
    cache = make_cache(kind, model.config, max_cache_len=ids.shape[1] + continuation.shape[1] + 1)
    out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    logits = [out.logits[:, -1].float()]
    for t in range(continuation.shape[1]):
        out = model(continuation[:, t:t + 1], past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1].float())
    return torch.stack(logits, 1)


def compare_logits(base: torch.Tensor, other: torch.Tensor) -> dict:
    """Top-1 agreement and mean KL(base ‖ other) of two ``[batch, steps, vocab]`` logit tensors."""
    agree = (base.argmax(-1) == other.argmax(-1)).float().mean().item()
    lp, lq = base.log_softmax(-1), other.log_softmax(-1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean().item()
    return {"top1_agreement": agree, "mean_kl": kl}


def kv_ab(model, prompts: torch.Tensor, new_tokens: int, kinds=None, measure_memory: bool = True,
          progress: bool = True) -> list[dict]:
    """The A/B test: same model, prompts, lengths and seed; only the KV-cache format varies.

    ``kinds`` defaults to every format installed here (:func:`helpers.kvcache.available_kinds`).
    For each kind: stored KV bytes, peak memory over the weights and decode tokens/s (from
    :func:`measure_generate`), and quality against the baseline cache on the baseline's own greedy
    continuation (teacher-forced top-1 agreement and KL, by :func:`kv_quality`)."""
    kinds = available_kinds() if kinds is None else kinds
    batch, ctx = prompts.shape
    base_gen = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                              disable_compile=True)
    quality = {q["kv_format"]: q for q in kv_quality(model, prompts, base_gen[:, ctx:], kinds)}
    rows, baseline_bytes = [], None
    for kind in tqdm(kinds, desc=f"KV formats at {ctx}×{batch}", disable=not progress):
        m = measure_generate(model, ctx, batch, new_tokens, cache=kind) if measure_memory else {}
        if kind == "baseline":
            baseline_bytes = m.get("kv_meas")
        rows.append({"kv_format": kind, "context": ctx, "batch": batch, "kv_bytes": m.get("kv_meas"),
                     "baseline_kv_bytes": baseline_bytes, "peak": m.get("peak_meas"),
                     "tokens_per_s": m.get("tokens_per_s"), "top1_agreement": quality[kind]["top1_agreement"],
                     "mean_kl": quality[kind]["mean_kl"]})
    return rows


@torch.no_grad()
def tokens_until_oom(model, kind: str, batch: int, prompt_len: int, max_new: int, seed: int = 0,
                     trace: list | None = None) -> dict:
    """Prefill a random prompt, then decode one token at a time until ``max_new`` tokens or an OOM.

    Returns ``{"generated": n, "oom": bool, "phase": "prefill"|"decode"|None, "decode_s"}``
    (``decode_s``: the decode loop's wall time, what the hunt costs); memory is freed before
    returning (the OOM is caught). ``trace``, a list, receives ``memory_allocated`` after the prefill
    and after every decoded token (CUDA): the memory-over-time line of a plot."""
    dev = next(model.parameters()).device
    ids = random_ids(model.config.vocab_size, (batch, prompt_len), seed=seed, device=dev)
    cache, n, phase = make_cache(kind, model.config), 0, "prefill"
    record = trace is not None and dev.type == "cuda"
    try:
        nxt = prefill(model, ids, cache)
        phase = "decode"
        if record:
            trace.append(torch.cuda.memory_allocated(dev))
        t0 = time.perf_counter()          # the hunt's cost: the decode loop only
        for _ in islice(greedy_tokens(model, cache, nxt), max_new):
            n += 1                                  # tokens decoded so far (read after an OOM)
            if record:
                trace.append(torch.cuda.memory_allocated(dev))
        result = {"generated": n, "oom": False, "phase": None}
    except torch.OutOfMemoryError:
        result = {"generated": n, "oom": True, "phase": phase}
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    result["decode_s"] = round(time.perf_counter() - t0, 3) if phase == "decode" else 0.0
    del cache, ids
    free_memory()
    return result


def oom_points(model, batch: int, prompt_len: int, extra: int, max_new: int,
               kinds=("baseline", "fp8-e4m3", "int4"), traces: bool = False) -> dict:
    """How far each KV format decodes on one budget (notebook 07 §3): the cap is the memory a baseline
    prefill reserved at its peak (measured, uncapped) plus the bf16 KV of ``extra`` more tokens; under
    it, :func:`tokens_until_oom` per format. The room left for decoding is therefore the prefill's
    transient activations plus ``extra`` tokens of bf16 KV, so the baseline runs out after more than
    ``extra`` tokens — ``max_new`` must be well above it for an OOM point. Returns
    ``{"cap_gib", "rows"}`` (each row with its ``trace`` of allocated bytes per step when ``traces``).
    CUDA only."""
    free_memory()
    reset_peak()
    tokens_until_oom(model, "baseline", batch, prompt_len, 0)          # prefill only, no cap: its peak
    cap_gib = (torch.cuda.max_memory_reserved() + kv_bytes(model.config, extra, batch)) / GiB
    rows = []
    with memory_limit(cap_gib):
        for kind in kinds:
            trace = [] if traces else None
            rows.append({"kv": kind, **tokens_until_oom(model, kind, batch, prompt_len, max_new, trace=trace)})
            if traces:
                rows[-1]["trace"] = trace
    return {"cap_gib": cap_gib, "rows": rows}


@torch.no_grad()
def prefill_decode(model, prompt: torch.Tensor, decode_steps: int, kind: str = "baseline",
                   profiler: StageProfiler | None = None) -> dict:
    """Prefill ``prompt`` [batch, tokens] into a fresh ``kind`` cache, then decode ``decode_steps``
    greedy tokens one at a time; a :class:`StageProfiler` (``profiler``, or a new one) records
    warm-up, prefill and decode.

    Returns ``{"profiler", "kv_after_prefill", "kv_growth", "requested_growth"}``: the cache's stored
    bytes after the prefill, what decoding added to it, and what the live tensors' requested bytes
    grew by over the decode (CUDA; 0 on CPU)."""
    decode_steps = positive_int(decode_steps, "decode_steps")
    prof = profiler if profiler is not None else StageProfiler()
    with prof.stage("warm-up"):
        model(prompt[:, :8])
    cache = make_cache(kind, model.config)
    with prof.stage("prefill"):
        nxt = prefill(model, prompt, cache)
    kv0, req0 = stored_bytes(cache), requested_bytes()
    with prof.stage("decode"):
        for _ in islice(greedy_tokens(model, cache, nxt), decode_steps):
            pass
    res = {"profiler": prof, "kv_after_prefill": kv0, "kv_growth": stored_bytes(cache) - kv0,
           "requested_growth": requested_bytes() - req0}
    del cache, nxt
    return res


def load_under_cap(cap_gib: float, dtype, arch: str = "SmolLM2-135M", kv: str = "baseline",
                   max_cache_len: int = 4096) -> dict:
    """Instantiate ``arch`` on the GPU under a ``cap_gib`` allocator cap **and create its KV cache of
    format ``kv``** (what an application does at start-up); the OOM, if any, is caught and everything
    freed. Returns ``{"ok", "phase" (where it failed), "cache_bytes" (what the cache object holds at
    start)}``. A growing cache (``baseline``, ``fp8-*``, ``int4``) holds nothing at start, so its
    format cannot decide a load-phase OOM; a ``static`` cache allocates ``max_cache_len`` positions
    up front — like an engine's KV pool — and there the format's bytes count at start-up."""
    result = {"ok": False, "phase": "weights", "cache_bytes": 0}
    with memory_limit(cap_gib):
        r = oom_guard(model_from_config, arch, device="cuda", dtype=dtype)
        if r["ok"]:
            model = r.pop("result")
            result["phase"] = "cache"
            c = oom_guard(make_cache, kv, model.config, max_cache_len=max_cache_len)
            if c["ok"]:
                cache = c.pop("result")
                if kv == "static":  # a static cache allocates its layers on first use: force it now
                    cfg = model.config
                    cache.early_initialization(1, cfg.num_key_value_heads,
                                               getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
                                               dtype, "cuda")
                result.update(ok=True, phase=None, cache_bytes=stored_bytes(cache))
                del cache
            del model, c
    del r
    free_memory()
    return result


def load_checkpoint(path, device, dtype=torch.bfloat16) -> dict:
    """Load a checkpoint directory with plain transformers (``from_pretrained``, safetensors) and
    measure: bytes on disk, bytes resident as parameters, and on CUDA the allocator's peak during
    the load. A compressed-tensors checkpoint is packed on disk (INT4 codes + scales); transformers 5
    with compressed-tensors keeps its linears packed after loading (``param_dtypes`` shows the int32
    words) and dequantizes each weight when its layer runs, so the resident bytes follow the checkpoint."""
    path = Path(path)
    disk = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    if not disk:
        raise FileNotFoundError(f"{path} holds no .safetensors files: not a checkpoint directory")
    free_memory()
    t0 = time.perf_counter()
    with PeakMeter(device) as meter:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=str(device), use_safetensors=True,
                                                     trust_remote_code=False)
    secs = time.perf_counter() - t0
    resident = sum(p.numel() * p.element_size() for p in model.parameters())
    out = {"disk_bytes": disk, "resident_param_bytes": resident, "seconds": secs, "peak_bytes": meter.peak,
           "param_dtypes": sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})}
    del model
    free_memory()
    return out


@torch.no_grad()
def kv_quality(model, prompts: torch.Tensor, continuation: torch.Tensor, kinds=None) -> list[dict]:
    """Quality of each KV-cache format, teacher-forced: every format is fed the same prompt and the
    same next tokens (``continuation`` [batch, n]: the text's own continuation, or the baseline's
    greedy output as :func:`kv_ab` passes), and
    compared with the baseline cache's next-token distributions (top-1 agreement, mean KL) and by the
    perplexity of the continuation. Meaningful only with real weights on real text: with random
    weights the logits are nearly flat and these numbers are noise."""
    kinds = available_kinds() if kinds is None else kinds
    if continuation.dim() != 2 or continuation.shape[0] != prompts.shape[0] or continuation.shape[1] < 1:
        raise ValueError(f"continuation must be [batch={prompts.shape[0]}, n ≥ 1] token ids, got {tuple(continuation.shape)}")
    base = teacher_forced_logits(model, prompts, continuation[:, :-1], "baseline")
    rows = []
    for kind in kinds:
        # the baseline is run again too: its KL against the first run is the noise floor (≈ 0 on a CPU,
        # 1e-6–1e-5 on a GPU, where reductions are not bitwise reproducible)
        logits = teacher_forced_logits(model, prompts, continuation[:, :-1], kind)
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                                                continuation.reshape(-1).to(logits.device), reduction="mean")
        q = compare_logits(base, logits)
        rows.append({"kv_format": kind, "context": prompts.shape[1], "batch": prompts.shape[0],
                     "continuation": continuation.shape[1], "top1_agreement": q["top1_agreement"],
                     "mean_kl": q["mean_kl"], "ppl": float(torch.exp(nll))})
    return rows


@torch.no_grad()
def decode_speed(model, prompt: torch.Tensor, new_tokens: int = 64) -> dict:
    """Greedy decode of one sequence with transformers' growing cache: prefill tokens/s (the 1-D
    ``prompt``) and decode tokens/s (the ``new_tokens − 1`` steps after the first token)."""
    if prompt.dim() != 1 or len(prompt) < 1:
        raise ValueError(f"prompt must be a non-empty 1-D tensor of token ids, got shape {tuple(prompt.shape)}")
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be ≥ 2 (one step after the first token), got {new_tokens}")
    dev = next(model.parameters()).device
    cache = make_cache("baseline", model.config)
    t0 = time.perf_counter()
    tok = prefill(model, prompt[None].to(dev), cache)
    t1 = time.perf_counter()
    for _ in islice(greedy_tokens(model, cache, tok), new_tokens - 1):
        pass
    t2 = time.perf_counter()
    return {"prefill_tok_s": len(prompt) / (t1 - t0), "decode_tok_s": (new_tokens - 1) / (t2 - t1),
            "new_tokens": new_tokens}

