"""Perplexity, done carefully, and a label-free agreement check.

Perplexity of a token stream ``x_1 … x_N`` under a causal LM:

    PPL = exp( (1/T) · Σ_t −log p(x_t | x_<t) )      over the T tokens actually scored.

Protocol (the course's, used everywhere; see notebook 06 for what changes the number):
* windows of ``seq_len`` tokens; ``stride = seq_len`` gives non-overlapping windows (the GPTQ/AWQ
  papers' protocol), a smaller stride the sliding window of the transformers docs
  (https://huggingface.co/docs/transformers/perplexity): each window re-reads ``seq_len − stride``
  tokens of context and scores only the tokens no earlier window scored;
* without BOS, the first token of each window has no context in it and is not scored (in particular
  the stream's first token never is); with ``bos_token_id`` a BOS is prepended to each window and
  the window's first token is scored too — but no token is ever scored twice (overlapping windows
  score only tokens no earlier window scored);
* the log-likelihood is accumulated in float64 from fp32 log-softmax (``logits_dtype`` lowers it
  for the protocol lesson), and the exact count of scored tokens is returned.
"""
from __future__ import annotations

import math
import time

import torch
from tqdm.auto import tqdm

from .models import check_token_ids
from .validate import as_int, flag, non_negative_int, one_of, positive_int


def windows(n_tokens: int, seq_len: int, stride: int | None = None, bos: bool = False) -> list[tuple[int, int, int]]:
    """``(begin, end, n_scored)`` per window: window ``[begin, end)`` scores its last ``n_scored``
    tokens, and every token is scored at most once.

    A window can score positions ``begin + 1 … end − 1`` (``begin … end − 1`` with a BOS in front);
    it scores those no earlier window scored. ``stride = seq_len`` (non-overlapping, the default)
    drops a last incomplete window, as the GPTQ/AWQ evaluation scripts do."""
    n_tokens, seq_len, bos = as_int(n_tokens, "n_tokens"), as_int(seq_len, "seq_len"), flag(bos, "bos")
    if seq_len < 2:
        raise ValueError(f"seq_len must be ≥ 2, got {seq_len}")
    stride = seq_len if stride is None else as_int(stride, "stride")
    if not 0 < stride <= seq_len:
        raise ValueError(f"stride must be in 1..seq_len ({seq_len}), got {stride}")
    if n_tokens < 2:
        raise ValueError(f"need at least 2 tokens to score, got {n_tokens} (is the text empty?)")
    if stride == seq_len and n_tokens >= seq_len:
        n_tokens = n_tokens - n_tokens % seq_len      # whole windows only
    out, done = [], 0                                 # tokens [0, done) are scored
    for begin in range(0, n_tokens, stride):
        end = min(begin + seq_len, n_tokens)
        start = max(begin if bos else begin + 1, done)
        if end > start:
            out.append((begin, end, end - start))
            done = end
        if end == n_tokens:
            break
    return out


def window_nll(logits: torch.Tensor, tokens: torch.Tensor, n: int, stop: int) -> float:
    """``Σ −log p(tokens[t+1] | tokens[≤t])`` over the ``n`` positions ``t`` ending at ``stop − 1``
    (``logits[t]`` predicts token ``t + 1``): the scored part of one window, in nats, summed in fp64."""
    n, stop = positive_int(n, "n", "positions to score"), as_int(stop, "stop")
    if not n <= stop <= len(logits) or stop >= len(tokens):
        raise ValueError(f"window_nll needs n ≤ stop ≤ len(logits) = {len(logits)} and stop < len(tokens) = "
                         f"{len(tokens)}, got n={n}, stop={stop}")
    lg = logits[stop - n:stop].float()
    tgt = tokens[stop - n + 1:stop + 1]
    return -torch.log_softmax(lg, -1).gather(-1, tgt[:, None]).double().sum().item()


def check_token_stream(model, ids) -> torch.Tensor:
    """``ids`` must be a 1-D integer tensor of the model's token ids: checked here, so a wrong input
    fails with its shape or range instead of "index out of range in self" deep in the embedding."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"ids must be a 1-D torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D token stream, got shape {tuple(ids.shape)}")
    check_token_ids(model, ids, "ids")
    return ids


def protocol_windows(ids: torch.Tensor, seq_len: int, stride: int | None = None, max_tokens: int | None = None,
             bos_token_id: int | None = None, vocab: int | None = None):
    """The checked protocol shared by every perplexity of the course (ours, llama.cpp's):
    ``(ids[:max_tokens], bos_token_id, windows)`` with the windows of :func:`windows`; the BOS id
    must be a token of the vocabulary ``[0, vocab)``."""
    if max_tokens is not None:
        ids = ids[:positive_int(max_tokens, "max_tokens", "the first tokens of the stream to score, or None")]
    if bos_token_id is not None:
        bos_token_id = non_negative_int(bos_token_id, "bos_token_id", "the tokenizer's bos_token_id, or None")
        if vocab is not None and bos_token_id >= vocab:
            raise ValueError(f"bos_token_id={bos_token_id} is outside the vocabulary [0, {vocab}): use the "
                             "tokenizer's bos_token_id")
    return ids, bos_token_id, windows(len(ids), seq_len, stride, bos=bos_token_id is not None)


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, seq_len: int = 512, stride: int | None = None,
               batch_size: int = 4, max_tokens: int | None = None, bos_token_id: int | None = None,
               logits_dtype: torch.dtype = torch.float32, progress: bool = True) -> dict:
    """Perplexity of ``model`` on the 1-D token stream ``ids`` (see the module docstring).

    ``max_tokens`` keeps the first ``max_tokens`` tokens of the stream (the CI profile's short run).
    Returns ``{"ppl", "nll" (mean, nats), "scored_tokens", "windows", "seconds"}``.
    """
    ids = check_token_stream(model, ids)
    batch_size = positive_int(batch_size, "batch_size")
    ids, bos_token_id, spans = protocol_windows(ids, seq_len, stride, max_tokens, bos_token_id, model.config.vocab_size)
    if not isinstance(logits_dtype, torch.dtype) or not logits_dtype.is_floating_point:
        raise TypeError(f"logits_dtype must be a floating torch.dtype (torch.float32, torch.bfloat16, …), got "
                        f"{logits_dtype!r}")
    progress = flag(progress, "progress")
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
            total += window_nll(logits[j].to(logits_dtype), x[j].to(dev), n, off + (e - b) - 1)
            count += n
        del logits
    nll = total / count
    return {"ppl": math.exp(nll), "nll": nll, "scored_tokens": count, "windows": len(spans),
            "seconds": time.perf_counter() - t0}


@torch.no_grad()
def agreement(model, reference, prompts: torch.Tensor, new_tokens: int = 16) -> dict:
    """Task-level check that needs no labels: next-token top-1 agreement of ``model`` with
    ``reference`` over every position of ``prompts`` [batch, len], and the fraction of greedy
    continuations (``new_tokens`` long) that are identical."""
    if not isinstance(prompts, torch.Tensor) or prompts.dim() != 2 or 0 in prompts.shape:
        raise ValueError(f"prompts must be token ids [batch, len], got {getattr(prompts, 'shape', prompts)!r}")
    check_token_ids(model, prompts, "prompts")
    check_token_ids(reference, prompts, "prompts")
    new_tokens = positive_int(new_tokens, "new_tokens")
    dev = next(model.parameters()).device
    p = prompts.to(dev)
    top1 = (model(p).logits.argmax(-1) == reference(p).logits.argmax(-1)).float().mean().item()
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(p))
    a, b = model.generate(p, **kw)[:, p.shape[1]:], reference.generate(p, **kw)[:, p.shape[1]:]
    return {"top1_agreement": top1, "greedy_identical": (a == b).all(1).float().mean().item(),
            "greedy_token_agreement": (a == b).float().mean().item()}


class UniformModel(torch.nn.Module):
    """A reference "model" that predicts the uniform distribution over ``vocab`` tokens (all logits
    zero): its perplexity is exactly ``vocab``, a check of any perplexity loop."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = positive_int(vocab, "vocab")
        self.config = type("Config", (), {"vocab_size": self.vocab})()
        self.p = torch.nn.Parameter(torch.zeros(1))  # so next(model.parameters()) finds a device

    def forward(self, x):
        return type("Out", (), {"logits": torch.zeros(*x.shape, self.vocab)})()


@torch.no_grad()
def seed_perplexity(model, tokenizer, texts: list[str], max_length: int = 2048, weighting: str = "as_written") -> dict:
    """The source document's ``compute_perplexity`` (``../shared/seeds/002…``, "困惑度"), reproduced:
    each text scored **on its own** (truncated to ``max_length``, no context from the texts before it),
    ``loss`` = transformers' mean over the ``n − 1`` predicted tokens, accumulated as ``loss · n`` and
    divided by ``Σ n``.

    ``weighting="as_written"`` keeps that ``n`` weighting, which gives every text one token too many
    (a short text's loss counts for more than it scored); ``"per_token"`` weights by the ``n − 1``
    tokens really scored, i.e. the exact mean over tokens (texts of one token score nothing and are
    skipped). Returns ``{"ppl", "texts", "tokens"}`` (tokens summed the way the weighting counts)."""
    one_of(weighting, "weighting", ("as_written", "per_token"))
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts \
            or not all(isinstance(t, str) for t in texts):
        raise TypeError(f"texts must be a non-empty list of strings (one text: [text]), got {str(texts)[:60]!r}")
    max_length = positive_int(max_length, "max_length", "tokens kept of each text")
    dev = next(model.parameters()).device
    total_loss, total_tokens, used = 0.0, 0, 0
    for i, text in enumerate(texts):
        ids = tokenizer(text, return_tensors="pt", max_length=max_length, truncation=True)["input_ids"].to(dev)
        n = ids.shape[1]
        if weighting == "per_token" and n < 2:
            continue
        if n < 2:
            raise ValueError(f"texts[{i}] has {n} token: its loss (a mean over no token) is NaN; drop texts of "
                             "fewer than 2 tokens or use weighting='per_token'")
        loss = model(ids, labels=ids).loss.float().item()
        weight = n if weighting == "as_written" else n - 1
        total_loss += loss * weight
        total_tokens += weight
        used += 1
    if total_tokens == 0:
        raise ValueError("no text of texts has a token to score (each needs 2 tokens or more): give longer texts")
    return {"ppl": math.exp(total_loss / total_tokens), "texts": used, "tokens": total_tokens}
