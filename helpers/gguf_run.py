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
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .evaluate import window_nll, windows
from .models import find_offline_gguf

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
    """A llama.cpp model on the CPU (all logits kept), closed when the block ends."""
    if not available():
        raise ImportError(f"llama-cpp-python is not installed (an optional extra). Install it with: {INSTALL}")
    from llama_cpp import Llama
    path = Path(path) if path else find_offline_gguf()
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                logits_all=True, verbose=False)
    try:
        yield llm
    finally:
        llm.close()


def perplexity(llm, ids: torch.Tensor, seq_len: int = 512, stride: int | None = None, max_tokens: int | None = None,
               bos_token_id: int | None = None, progress: bool = True) -> dict:
    """Perplexity from llama.cpp's logits on exactly the windows and tokens of
    :func:`helpers.evaluate.perplexity` (same arguments, same scoring)."""
    if ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D token stream, got shape {tuple(ids.shape)}")
    if seq_len + (bos_token_id is not None) > llm.n_ctx():
        raise ValueError(f"seq_len={seq_len} does not fit the llama.cpp context n_ctx={llm.n_ctx()}: "
                         "open the model with a larger n_ctx")
    if max_tokens is not None:
        ids = ids[:max_tokens]
    spans = windows(len(ids), seq_len, stride, bos=bos_token_id is not None)
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


def decode_speed(llm, prompt: list[int], new_tokens: int = 64) -> dict:
    """Greedy generation: prefill tokens/s (the prompt) and decode tokens/s (after the first token)."""
    llm.reset()
    t0 = time.perf_counter()
    stamps = []
    for _ in llm.generate(prompt, temp=0.0, reset=True):
        stamps.append(time.perf_counter())
        if len(stamps) == new_tokens:
            break
    first = stamps[0] - t0
    decode = (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)
    return {"prefill_tok_s": len(prompt) / first, "decode_tok_s": 1 / decode, "new_tokens": len(stamps)}
