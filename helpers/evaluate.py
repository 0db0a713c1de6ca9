"""Perplexity, done carefully, and a cache of quantized variants so no notebook quantizes twice.

Perplexity of a token stream ``x_1 … x_N`` under a causal LM:

    PPL = exp( (1/T) · Σ_t −log p(x_t | x_<t) )      over the T tokens actually scored.

Protocol (the course's, used everywhere; see notebook 06 for what changes the number):
* windows of ``seq_len`` tokens; ``stride = seq_len`` gives non-overlapping windows (the GPTQ/AWQ
  papers' protocol), a smaller stride the sliding window of the transformers docs
  (https://huggingface.co/docs/transformers/perplexity): each window re-reads ``seq_len − stride``
  tokens of context and scores only the tokens no earlier window scored;
* the first token of the stream has no context and is never scored; without BOS the first token of
  every non-overlapping window is not scored either (it is context only); with ``bos_token_id`` a
  BOS is prepended to each window and every window token is scored;
* the log-likelihood is accumulated in float64 from fp32 log-softmax (``logits_dtype`` lowers it
  for the protocol lesson), and the exact count of scored tokens is returned.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .config import cache_dir


def windows(n_tokens: int, seq_len: int, stride: int | None = None) -> list[tuple[int, int, int]]:
    """``(begin, end, n_scored)`` per window: window ``[begin, end)`` scores its last ``n_scored``
    tokens. Every token from position 1 on is scored exactly once (non-overlapping windows: each
    window's first token is context, so token ``k·seq_len`` is not scored)."""
    if seq_len <= 1:
        raise ValueError(f"seq_len must be ≥ 2, got {seq_len}")
    stride = seq_len if stride is None else stride
    if not 0 < stride <= seq_len:
        raise ValueError(f"stride must be in 1..seq_len ({seq_len}), got {stride}")
    if n_tokens < 2:
        raise ValueError(f"need at least 2 tokens, got {n_tokens}")
    if stride == seq_len:  # non-overlapping, the last incomplete window dropped (as the papers do)
        return [(b, b + seq_len, seq_len - 1) for b in range(0, n_tokens - seq_len + 1, seq_len)] or \
            [(0, n_tokens, n_tokens - 1)]
    out, prev_end = [], 1  # token 0 is never scored
    for begin in range(0, n_tokens, stride):
        end = min(begin + seq_len, n_tokens)
        if end <= prev_end:
            break
        out.append((begin, end, end - prev_end))
        prev_end = end
        if end == n_tokens:
            break
    return out


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, seq_len: int = 512, stride: int | None = None,
               batch_size: int = 4, max_tokens: int | None = None, bos_token_id: int | None = None,
               logits_dtype: torch.dtype = torch.float32, progress: bool = True) -> dict:
    """Perplexity of ``model`` on the 1-D token stream ``ids`` (see the module docstring).

    ``max_tokens`` keeps the first ``max_tokens`` tokens of the stream (the CI profile's short run).
    Returns ``{"ppl", "nll" (mean, nats), "scored_tokens", "windows", "seconds"}``.
    """
    if ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D token stream, got shape {tuple(ids.shape)}")
    if max_tokens is not None:
        ids = ids[:max_tokens]
    spans = windows(len(ids), seq_len, stride)
    dev = next(model.parameters()).device
    total, count, t0 = 0.0, 0, time.perf_counter()
    for i in tqdm(range(0, len(spans), batch_size), desc="perplexity", disable=not progress, leave=False):
        chunk = spans[i:i + batch_size]
        width = max(e - b for b, e, _ in chunk)
        x = torch.stack([torch.nn.functional.pad(ids[b:e], (0, width - (e - b))) for b, e, _ in chunk])
        if bos_token_id is not None:
            x = torch.cat([torch.full((len(chunk), 1), bos_token_id, dtype=x.dtype), x], 1)
        logits = model(x.to(dev)).logits
        off = 1 if bos_token_id is not None else 0
        for j, (b, e, n) in enumerate(chunk):
            n_here = n + (1 if bos_token_id is not None and n == e - b - 1 else 0)
            stop = off + (e - b) - 1                 # logits[t] predicts token t + 1
            lg = logits[j, stop - n_here:stop].to(logits_dtype).float()
            tgt = x[j, stop - n_here + 1:stop + 1].to(dev)
            total += -torch.log_softmax(lg, -1).gather(-1, tgt[:, None]).double().sum().item()
            count += n_here
        del logits
    nll = total / count
    return {"ppl": math.exp(nll), "nll": nll, "scored_tokens": count, "windows": len(spans),
            "seconds": time.perf_counter() - t0}


@torch.no_grad()
def agreement(model, reference, prompts: torch.Tensor, new_tokens: int = 16) -> dict:
    """Task-level check that needs no labels: next-token top-1 agreement of ``model`` with
    ``reference`` over every position of ``prompts`` [batch, len], and the fraction of greedy
    continuations (``new_tokens`` long) that are identical."""
    dev = next(model.parameters()).device
    p = prompts.to(dev)
    top1 = (model(p).logits.argmax(-1) == reference(p).logits.argmax(-1)).float().mean().item()
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(p))
    a, b = model.generate(p, **kw)[:, p.shape[1]:], reference.generate(p, **kw)[:, p.shape[1]:]
    return {"top1_agreement": top1, "greedy_identical": (a == b).all(1).float().mean().item(),
            "greedy_token_agreement": (a == b).float().mean().item()}


# ------------------------------------------------------------------------------- variants cache
def variant_key(model: str, method: str, impl: str = "ours", bits: int | None = None,
                group_size: int | None = None, calib_tokens: int = 0, **extra) -> str:
    """A readable, stable key: ``model-method-impl-w{bits}g{group}-c{calib_tokens}[-hash(extra)]``."""
    name = Path(str(model)).name.replace("/", "_")
    key = f"{name}-{method}-{impl}-w{bits}g{group_size or 'ch'}-c{calib_tokens}"
    if extra:
        key += "-" + hashlib.sha256(json.dumps(extra, sort_keys=True).encode()).hexdigest()[:8]
    return key


def _variant_dir() -> Path:
    return cache_dir("variants")


def save_variant(model, key: str, meta: dict) -> Path:
    """Save the decoder linears' (fake-quantized) weights as safetensors + ``meta`` as JSON."""
    from safetensors.torch import save_file

    from .quant import quantizable_linears

    path = _variant_dir() / f"{key}.safetensors"
    save_file({f"{n}.weight": m.weight.detach().cpu().contiguous()
               for n, m in quantizable_linears(model).items()}, str(path))
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1, default=str))
    return path


def load_variant(model, key: str) -> dict | None:
    """Load a cached variant's weights into ``model`` in place; its meta, or None when not cached."""
    from safetensors.torch import load_file

    from .quant import quantizable_linears

    path = _variant_dir() / f"{key}.safetensors"
    if not path.exists():
        return None
    state = load_file(str(path))
    lins = quantizable_linears(model)
    missing = {f"{n}.weight" for n in lins} - set(state)
    if missing:
        raise KeyError(f"cached variant {key} lacks {sorted(missing)[:3]}…; delete {path} and rebuild")
    for n, m in lins.items():
        m.weight.data.copy_(state[f"{n}.weight"].to(m.weight.dtype))
    return json.loads(path.with_suffix(".json").read_text())


def variant(model, key: str, make, rebuild: bool = False) -> dict:
    """``model`` turned into the variant ``key``: loaded from the cache, or made by ``make(model)``
    (which quantizes in place and returns a dict of facts, e.g. seconds) and then cached."""
    if not rebuild:
        meta = load_variant(model, key)
        if meta is not None:
            return {**meta, "cached": True}
    t0 = time.perf_counter()
    meta = dict(make(model) or {})
    meta.setdefault("seconds", time.perf_counter() - t0)
    save_variant(model, key, meta)
    if key in results_table():  # a rebuilt variant's old scores no longer apply
        record(key, ppl=None)
    return {**meta, "cached": False}


def record(key: str, **metrics) -> dict:
    """Add ``metrics`` (ppl, seconds, bytes…) for ``key`` to the course's results table on disk."""
    path = cache_dir() / "results.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    table[key] = {**table.get(key, {}), **metrics}
    path.write_text(json.dumps(table, indent=1, default=str))
    return table[key]


def results_table() -> dict:
    """Everything :func:`record` has written so far (``{key: metrics}``)."""
    path = cache_dir() / "results.json"
    return json.loads(path.read_text()) if path.exists() else {}
