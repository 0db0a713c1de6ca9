"""The offline model as what it really is: a GGUF file, run by llama.cpp (llama-cpp-python).

The offline SmolLM2 ships as ``SmolLM2-135M-Instruct.Q4_1.gguf``; the course dequantizes it into a
transformers model. llama.cpp runs the file itself: its Q4_1 matmuls quantize the *activations* to
8 bits per block of 32 (``Q8_1``) and use integer dot products, so its logits differ slightly from
our fp32 evaluation of the same weights. Perplexity from llama.cpp's logits on the course's own
windows (:func:`helpers.evaluate.windows`, the same token ids, no re-tokenisation) is therefore an
independent check of :func:`helpers.evaluate.perplexity`.

llama-cpp-python is an optional extra (it compiles llama.cpp from source, ~5–10 min on 2 cores):
``CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" pip install
llama-cpp-python==0.3.36`` (a native build can die with "Illegal instruction" on CPUs that advertise
instructions they cannot run).
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from tqdm.auto import tqdm

from .evaluate import check_token_stream, protocol_windows, window_nll
from .models import check_token_ids, find_offline_gguf
from .validate import as_int, flag, positive_int

INSTALL = ('CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
           'pip install llama-cpp-python==0.3.36')


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def open_gguf(path: str | Path | None = None, n_ctx: int = 1024, n_threads: int = 2):
    """A llama.cpp model on the CPU (all logits kept), closed when the block ends; ``path`` defaults
    to the offline model's GGUF file."""
    n_ctx = positive_int(n_ctx, "n_ctx", "the context in tokens: seq_len (+1 with a BOS) or more")
    n_threads = positive_int(n_threads, "n_threads", "CPU threads, at most the cores you have")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be the .gguf file (str or Path) or None for the offline model, got "
                        f"{type(path).__name__}")
    path = Path(path) if path is not None else find_offline_gguf()
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}: pass the .gguf file, or None for the offline model")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (it does not start with b'GGUF'): pass a .gguf model file")
    if not available():
        raise ImportError(f"llama-cpp-python is not installed (an optional extra). Install it with: {INSTALL}")
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                logits_all=True, verbose=False)
    try:
        yield llm
    finally:
        llm.close()


def perplexity(llm, ids: torch.Tensor, seq_len: int = 512, stride: int | None = None, max_tokens: int | None = None,
               bos_token_id: int | None = None, progress: bool = True) -> dict:
    """Perplexity from llama.cpp's logits on exactly the windows and tokens of
    :func:`helpers.evaluate.perplexity` (same arguments, same checks, same scoring)."""
    _check_llm(llm)
    vocab = _vocab_of(llm)
    ids = check_token_stream(vocab, ids)
    seq_len, progress = as_int(seq_len, "seq_len"), flag(progress, "progress")
    ids, bos_token_id, spans = protocol_windows(ids, seq_len, stride, max_tokens, bos_token_id, vocab.config.vocab_size)
    if seq_len + (bos_token_id is not None) > llm.n_ctx():
        raise ValueError(f"seq_len={seq_len} does not fit the llama.cpp context n_ctx={llm.n_ctx()}: "
                         "open the model with a larger n_ctx")
    total, count, t0 = 0.0, 0, time.perf_counter()
    for b, e, n in tqdm(spans, desc="llama.cpp perplexity", disable=not progress, leave=False):
        tokens = ([bos_token_id] if bos_token_id is not None else []) + ids[b:e].tolist()
        llm.reset()
        llm.eval(tokens)
        logits = torch.from_numpy(np.array(llm.scores[:len(tokens)], dtype=np.float32))
        total += window_nll(logits, torch.tensor(tokens), n, len(tokens) - 1)
        count += n
    nll = total / count
    return {"ppl": math.exp(nll), "nll": nll, "scored_tokens": count, "windows": len(spans),
            "seconds": time.perf_counter() - t0}


def _check_llm(llm) -> None:
    if not all(hasattr(llm, a) for a in ("n_ctx", "eval", "reset")):
        raise TypeError(f"llm must be a llama.cpp model: open one with `with open_gguf() as llm:`, got "
                        f"{type(llm).__name__}")


def _vocab_of(llm):
    """The llama.cpp model as the token-id checks of :mod:`helpers.evaluate` see a model: its vocabulary."""
    return SimpleNamespace(config=SimpleNamespace(vocab_size=llm.n_vocab() if hasattr(llm, "n_vocab") else None))


def decode_speed(llm, prompt: list[int], new_tokens: int = 64) -> dict:
    """Greedy generation: prefill tokens/s (the prompt) and decode tokens/s (after the first token)."""
    _check_llm(llm)
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.tolist() if prompt.dim() == 1 and not prompt.is_floating_point() else prompt
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (list, tuple)) or not prompt:
        raise TypeError(f"prompt must be a non-empty list of token ids (ids.tolist()), got {str(prompt)[:40]!r}")
    prompt = [as_int(t, f"prompt[{i}]") for i, t in enumerate(prompt)]
    check_token_ids(_vocab_of(llm), torch.tensor(prompt), "prompt")
    new_tokens = positive_int(new_tokens, "new_tokens")
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be ≥ 2 (the decode rate is timed between tokens), got {new_tokens}")
    llm.reset()
    t0 = time.perf_counter()
    stamps = []
    for _ in llm.generate(prompt, temp=0.0, reset=True):
        stamps.append(time.perf_counter())
        if len(stamps) == new_tokens:
            break
    if len(stamps) < 2:
        raise RuntimeError(f"llama.cpp stopped after {len(stamps)} token(s) (end of text): no decode rate to "
                           "time; use another prompt")
    first = stamps[0] - t0
    decode = (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)
    return {"prefill_tok_s": len(prompt) / first, "decode_tok_s": 1 / decode, "new_tokens": len(stamps)}
