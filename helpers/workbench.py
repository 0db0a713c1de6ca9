"""One call that gives notebooks 03–06 their model, text and profile-sized settings.

Where no weights or no text can be had (a GPU machine with neither internet nor the offline
package), it falls back to the architecture with random weights and random token ids, and says so
loudly: the algorithms, memory and timings are then real, the quality numbers are not.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import data, models
from .config import pick


@dataclass
class Bench:
    model: torch.nn.Module
    tokenizer: object | None
    real_weights: bool
    real_text: bool
    eval_ids: torch.Tensor
    name: str
    settings: dict = field(default_factory=dict)

    def calib(self, n_samples: int | None = None, seq_len: int | None = None, seed: int = 0) -> torch.Tensor:
        """Calibration windows [n, seq_len] from the calibration split (disjoint from eval)."""
        n = n_samples or self.settings["calib_samples"]
        L = seq_len or self.settings["seq_len"]
        if self.real_text:
            return data.calibration_batch(self.tokenizer, n, L, seed)
        g = torch.Generator().manual_seed(1000 + seed)
        return torch.randint(3, self.model.config.vocab_size - 1, (n, L), generator=g)

    @property
    def quality_meaningful(self) -> bool:
        return self.real_weights and self.real_text


def settings() -> dict:
    """Profile-sized work: the full profile is the course as a learner runs it (on a GPU the papers'
    128 × 512 calibration tokens; on a CPU 16 × 512, minutes instead of hours); CI is a smoke test."""
    full_gpu = {"calib_samples": 128, "seq_len": 512, "eval_tokens": 128 * 512, "n_grid": 20}
    full_cpu = {"calib_samples": 16, "seq_len": 512, "eval_tokens": 32 * 512, "n_grid": 20}
    return pick(full=full_gpu if torch.cuda.is_available() else full_cpu,
                ci={"calib_samples": 4, "seq_len": 128, "eval_tokens": 8 * 128, "n_grid": 4})


def setup(name: str | None = None, device=None, dtype=None) -> Bench:
    """Load the course model (hub online, offline package otherwise) and the evaluation tokens."""
    from .device import get_device

    dev = get_device(device) if device is not None else get_device()
    dtype = dtype or (torch.float32 if dev.type == "cpu" else torch.bfloat16)
    model, tok, real = models.load_for_memory(name, device=dev, dtype=dtype)
    try:
        ids = data.tokens(tok, "eval") if tok is not None else None
    except (FileNotFoundError, RuntimeError) as e:
        print(f"[text] {str(e).splitlines()[0]}")
        ids = None
    real_text = ids is not None
    if not real_text:
        print("[text] no text source → random token ids: perplexities below measure nothing.")
        ids = torch.randint(3, model.config.vocab_size - 1, (200_000,), generator=torch.Generator().manual_seed(0))
    label = getattr(model.config, "_name_or_path", "") or "random-weights"
    return Bench(model, tok, real, real_text, ids, label.rstrip("/").split("/")[-1] or "model", settings())


def perplexity(bench: Bench, model=None, key: str | None = None, **kw) -> float:
    """The course's perplexity protocol on the bench's eval tokens, profile-sized.

    Scores are remembered in the results table (:func:`helpers.evaluate.record`) under ``key`` — a
    variant's key from :func:`variant`, or the bench's baseline when ``model`` is None — so the
    notebooks that show the same variant evaluate it once. Models without a key (ablations) and
    calls with protocol overrides in ``kw`` are always evaluated."""
    from . import evaluate
    from .config import profile

    if model is None:
        key = evaluate.variant_key(bench.name, "baseline", "-", None, None, 0, profile=profile(),
                                   real=bench.quality_meaningful)
    if key is not None and not kw:
        known = evaluate.results_table().get(key, {}).get("ppl")
        if known is not None:
            return known
    kw.setdefault("max_tokens", bench.settings["eval_tokens"])
    ppl = evaluate.perplexity(model if model is not None else bench.model, bench.eval_ids,
                              bench.settings["seq_len"], **kw)["ppl"]
    if key is not None and set(kw) == {"max_tokens"}:
        evaluate.record(key, ppl=ppl)
    return ppl


def quantize(model, calib, method: str, impl: str = "ours", bits: int = 4, group_size: int | None = 64,
             **kw) -> dict:
    """Dispatch to one quantizer, in place: rtn | gptq | awq × ours | llmcompressor. GPTQ defaults to
    act-order with static groups, like llm-compressor's default, so both do the same work."""
    import time

    from . import awq, gptq, llmc
    from .quant import rtn_model

    t0 = time.perf_counter()
    if method == "rtn":
        rtn_model(model, bits, group_size)
        info = {}
    elif impl == "llmcompressor":
        info = llmc.quantize(model, calib, method, bits, group_size, **kw)
    elif method == "gptq":
        kw.setdefault("actorder", True)
        kw.setdefault("static_groups", True)
        info = gptq.gptq_model(model, calib, bits, group_size, progress=False, **kw)
    elif method == "awq":
        info = awq.awq_model(model, calib, bits, group_size, progress=False, **kw)
    else:
        raise ValueError(f"unknown method/impl {method!r}/{impl!r}")
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0, "calib_tokens": 0 if calib is None else int(calib.numel()),
            **{k: v for k, v in info.items() if k in ("alphas", "search_dtype")}}


def variant(bench: Bench, method: str, impl: str = "ours", bits: int = 4, group_size: int | None = 64,
            rebuild: bool = False, **kw):
    """``(model, meta, key)``: a quantized copy of the bench model, from the variants cache when it
    was made before (in this or an earlier notebook), else made now and cached."""
    import copy

    from . import evaluate
    from .config import profile

    calib = None if method == "rtn" else bench.calib()
    key = evaluate.variant_key(bench.name, method, impl, bits, group_size, 0 if calib is None else calib.numel(),
                               profile=profile(), real=bench.quality_meaningful, version=CACHE_VERSION, **kw)
    model = copy.deepcopy(bench.model)
    meta = evaluate.variant(model, key, lambda m: quantize(m, calib, method, impl, bits, group_size, **kw), rebuild)
    return model, meta, key


# Bump when one of our quantizers changes the weights it produces, so cached variants are rebuilt
# (2: AWQ scores α in bf16 on CPUs with bf16 units and clips with one bmm).
CACHE_VERSION = 2


FLOW = [("int8 per-channel (RTN)", "rtn", 8, None), ("int4 g64 (GPTQ)", "gptq", 4, 64), ("int3 g64 (GPTQ)", "gptq", 3, 64)]


def recommended_flow(bench: Bench, max_increase_pct: float = 3.0, steps=FLOW) -> list[dict]:
    """FP16 → INT8 → INT4 (→ INT3): quantize step by step, evaluate each, and stop at the first
    step whose perplexity grows more than ``max_increase_pct`` over the baseline. Returns the rows
    (the last one says why it stopped); call it on your own model via ``setup(name)``."""
    from .quant import quantized_model_bytes

    base = perplexity(bench)
    rows = [{"step": "baseline (16-bit)", "ppl": base, "increase %": 0.0,
             "bytes": quantized_model_bytes(bench.model, None)["total"], "accept": True}]
    for label, method, bits, g in steps:
        model, meta, key = variant(bench, method, "ours", bits, g)
        p = perplexity(bench, model, key)
        inc = 100 * (p / base - 1)
        rows.append({"step": label, "ppl": p, "increase %": inc, "accept": inc <= max_increase_pct,
                     "bytes": quantized_model_bytes(bench.model, bits, g)["total"]})
        del model
        if inc > max_increase_pct:
            break
    return rows
