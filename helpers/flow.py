"""The recommended flow: FP16 → INT8 → INT4 (→ INT3), stopping where quality falls too far.

Quantize step by step, evaluate each step with the course's perplexity protocol, and stop at the
first step whose perplexity grows more than ``max_increase_pct`` over the 16-bit baseline. Run it on
your own model via ``course_model.setup(name)``.
"""
from __future__ import annotations

from .course_model import Bench
from .qspec import QuantSpec
from .quant import quantized_model_bytes
from .variants import perplexity, variant

FLOW = [("int8 per-channel (RTN)", "rtn", QuantSpec(8, None)),
        ("int4 g64 (GPTQ)", "gptq", QuantSpec(4, 64)),
        ("int3 g64 (GPTQ)", "gptq", QuantSpec(3, 64))]


def recommended_flow(bench: Bench, max_increase_pct: float = 3.0, steps=FLOW) -> list[dict]:
    """Rows ``{step, ppl, increase %, bytes, accept}``; the last row says why the flow stopped."""
    if not max_increase_pct >= 0:
        raise ValueError(f"max_increase_pct must be ≥ 0, got {max_increase_pct}")
    base = perplexity(bench)
    rows = [{"step": "baseline (16-bit)", "ppl": base, "increase %": 0.0,
             "bytes": quantized_model_bytes(bench.model, None)["total"], "accept": True}]
    for label, method, spec in steps:
        model, _meta, key = variant(bench, method, "ours", spec)
        p = perplexity(bench, model, key)
        inc = 100 * (p / base - 1)
        rows.append({"step": label, "ppl": p, "increase %": inc, "accept": inc <= max_increase_pct,
                     "bytes": quantized_model_bytes(bench.model, spec.bits, spec.group_size)["total"]})
        del model
        if inc > max_increase_pct:
            break
    return rows
