"""Predicted against measured: the memory budget's formulas checked on real ``generate`` calls.

A :class:`Point` names one measurement (architecture, attention implementation, prompt length,
batch, new tokens); :func:`grid_points` builds a grid of them and :func:`predicted_vs_measured`
measures them on the CUDA device beside the predictions of :mod:`helpers.budget` and
:mod:`helpers.budget_replay`. Notebook 01 runs a few points on the learner's GPU;
``benchmarks/budget_accuracy.py`` runs the full grid (the reference run:
``results/h200/budget_accuracy.json``).
"""
from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from . import budget, budget_replay, generation, host_alloc, measure, models
from .budget_inputs import ATTENTIONS, choice, positive_int
from .config import read_json, write_json
from .data import random_ids
from .validate import flag

ARCHS = ["SmolLM2-135M", "Qwen2.5-0.5B", "TinyLlama-1.1B",                      # the course's first three
         "Llama-3.2-1B", "Qwen3-1.7B", "Gemma-2-2B", "Mistral-7B", "Phi-3-mini",   # dense: sliding windows, fused projections
         "Qwen1.5-MoE-A2.7B", "DeepSeek-V2-Lite",                                  # experts, latent attention
         "Gemma-3-1B", "OLMo-2-1B", "SmolLM3-3B", "Qwen3-30B-A3B", "gpt-oss-20b",  # per-layer types, post-norms, sinks,
         "Command-R7B", "Granite-3.1-2B"]                                          # fp32 rotary
GRID = [(512, 1), (2048, 1), (8192, 1), (512, 16), (2048, 8), (8192, 2)]   # 8192 × 2: past 4096-token windows
ATTENTION = ATTENTIONS
NEW_TOKENS = 32


@dataclass(frozen=True)
class Point:
    """One measurement: architecture ``arch`` (a :data:`helpers.models.ARCHITECTURES` name, random
    weights, bf16, on CUDA) with ``attention`` as its ``attn_implementation``, ``batch`` random prompts
    of ``seq_len`` tokens, ``new_tokens`` generated (dynamic cache, then static)."""
    arch: str
    attention: str
    seq_len: int
    batch: int
    new_tokens: int = NEW_TOKENS

    def __post_init__(self):
        models.architecture_config(self.arch)            # an unknown name raises with the known ones
        choice(self.attention, "attention", ATTENTIONS)
        for name in ("seq_len", "batch", "new_tokens"):
            object.__setattr__(self, name, positive_int(getattr(self, name), name))

    @classmethod
    def from_row(cls, row: dict) -> Point:
        """The point a recorded row measured (a row without an ``attention`` key is an SDPA run)."""
        return cls(row["model"], row.get("attention", "sdpa"), row["seq_len"], row["batch"], row["new_tokens"])

    def key_fields(self) -> dict:
        """The row's identifying fields: ``model``, ``attention``, ``seq_len``, ``batch``."""
        return {"model": self.arch, "attention": self.attention, "seq_len": self.seq_len, "batch": self.batch}


@dataclass(frozen=True)
class Baseline:
    """What one loaded model's points share, measured once before them: the CUDA ``context`` (this
    process before anything is allocated, :func:`helpers.measure.overhead`), the cuBLAS ``workspace``
    (:func:`helpers.measure.warmup_cublas`), the memory outside the allocator after a warm-up generate
    (``non_torch``, :func:`helpers.measure.non_torch_bytes`; None without NVML), and the weights:
    measured (the ``memory_allocated`` delta of :func:`helpers.generation.measure_weights`), replayed
    through the allocator simulator (:func:`helpers.budget_replay.weight_allocation`) and by the
    formula (:func:`helpers.budget.weight_bytes`)."""
    context: int | None
    workspace: int
    non_torch: int | None
    weights_meas: int
    weights_pred: int
    weights_formula: int

    def fields(self) -> dict:
        """The row fields of the baseline, under the names the recorded files use."""
        return {"weights_pred": self.weights_pred, "weights_meas": self.weights_meas,
                "weights_formula": self.weights_formula, "cublas_workspace": self.workspace, "context": self.context}


def grid_points(archs=ARCHS, shapes=GRID, attentions=ATTENTION, new_tokens: int = NEW_TOKENS) -> list[Point]:
    """Every :class:`Point` of ``archs × attentions × shapes`` (``(seq_len, batch)`` pairs), in the order
    :func:`predicted_vs_measured` measures them: one architecture and attention at a time."""
    return [Point(arch, attention, seq, batch, new_tokens)
            for arch in archs for attention in attentions for seq, batch in shapes]


SETS_CACHE_ASIDE = frozenset({"phi3", "phimoe", "phi4_multimodal"})
"""Model types whose ``prepare_inputs_for_generation`` sets the given cache aside (``past_key_values =
None``) at the step whose input sequence reaches ``original_max_position_embeddings + 1`` tokens while
the cache holds no more than that: at the prefill of a longer prompt, or at the decode step that
crosses the limit (the whole sequence recomputed) — and the model goes on with a dynamic cache of its
own (transformers 5.17 ``modeling_phi3.py``; its comment: switching between short and long RoPE
factors invalidates a cache — the test reads only the lengths, whatever the config's RoPE)."""


def sets_cache_aside(config, prompt_len: int, new_tokens: int = 1) -> bool:
    """Whether ``generate`` of ``new_tokens`` on a ``prompt_len``-token prompt sets a given cache aside
    (:data:`SETS_CACHE_ASIDE`): the longest sequence fed is ``prompt_len + new_tokens − 1`` (the last
    token is never fed back). A static cache asked for is then not what runs to the end."""
    limit = getattr(config, "original_max_position_embeddings", None)
    return (getattr(config, "model_type", "") in SETS_CACHE_ASIDE and limit is not None
            and prompt_len + new_tokens - 1 >= limit + 1)


def predicted_vs_measured(points=None, out: Path | None = None, echo: bool = True, static: bool = True) -> list[dict]:
    """For each :class:`Point` (default: :func:`grid_points` over :data:`ARCHS`, :data:`ATTENTION`,
    :data:`GRID`): predicted and measured weights, KV cache, generation peaks (prefill, decode, whole;
    dynamic cache, and with ``static`` a second generate with a static cache) and the device-level footprint (``smi_pred`` from
    :func:`helpers.budget_replay.device_footprint`: the non-torch memory measured after a warm-up
    generate of the same model plus the simulated reserved memory ``reserved_pred``; ``smi_meas`` from
    NVML's per-process memory, beside ``reserved_meas``). Consecutive points of one architecture and
    attention share one loaded model. ``out`` is rewritten after every point, so a cut-off run keeps
    what it measured; a point that runs out of memory is recorded as such (``oom``), not raised, and
    so is an attention implementation a model does not have or weights that do not fit (``error``,
    one row for the architecture and attention)."""
    points = grid_points() if points is None else list(points)
    static = flag(static, "static")
    for p in points:
        if not isinstance(p, Point):
            raise TypeError(f"points must be budget_check.Point objects (budget_check.grid_points(...)), got {p!r}")
    rows = []

    today = datetime.date.today().isoformat()

    def record(row):
        rows.append({**row, "measured": today})
        if out:
            write_json(out, rows, indent=1)
        if echo:
            _echo(row)

    context = measure.overhead()["context"]          # before anything is allocated: the CUDA context
    workspace = measure.warmup_cublas()  # the first matmul's workspace is overhead, not activations
    for (arch, attention), group in groupby(points, key=lambda p: (p.arch, p.attention)):
        cfg = models.architecture_config(arch)
        try:
            model, w_meas = generation.measure_weights(arch, attn_implementation=attention)
            # a short generate loads the kernels this model and attention use; what the process then
            # holds outside the allocator is the non-torch part of the nvidia-smi prediction
            generation.measure_generate(model, 64, 1, 2)
        except Exception as e:  # no such attention implementation, or the weights do not fit: a row, not a stop
            model = None
            measure.free_memory()
            record({"model": arch, "attention": attention, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        base = Baseline(context, workspace, measure.non_torch_bytes(), int(w_meas),
                        int(budget_replay.weight_allocation(cfg)),    # formula bytes + simulated block rounding
                        int(budget.weight_bytes(cfg, "bf16")))
        for p in group:
            try:
                row = _point(model, p, base, static)
            except Exception as e:  # transformers itself failing at a point is a finding: record it, go on
                row = {**p.key_fields(), "error": f"{type(e).__name__}: {str(e)[:300]}"}
                measure.free_memory()
            record(row)
        del model
        measure.free_memory()
    return rows


def _predictions(cfg, p: Point) -> dict:
    """The generation predictions of a row (:func:`helpers.budget.generation_peak`, dynamic and static cache)."""
    # measure_generate forces its token count with min_new_tokens: one processor copy of the scores
    dyn = budget.generation_peak(cfg, p.seq_len, p.new_tokens, p.batch, attention=p.attention, score_copies=1)
    static = budget.generation_peak(cfg, p.seq_len, p.new_tokens, p.batch, cache="static", attention=p.attention,
                                    score_copies=1)
    return {"kv_pred": int(dyn["kv"]), "peak_pred": int(dyn["peak"]), "prefill_pred": int(dyn["prefill"]),
            "decode_pred": int(dyn["decode"]), "static_peak_pred": int(static["peak"])}


def _footprint(cfg, p: Point, non_torch: int | None, workspace: int | None) -> dict:
    """The device-level predictions of a row (:func:`helpers.budget_replay.device_footprint`): reserved,
    nvidia-smi's, and the decode forwards' peak in the allocator's blocks (``decode_blocks_pred``,
    against ``decode_meas``; the tensor-level ``decode_pred`` is checked against ``decode_requested``)."""
    foot = budget_replay.device_footprint(cfg, p.seq_len, p.new_tokens, p.batch, non_torch or 0, p.attention,
                                          workspace_bytes=workspace or 0, score_copies=1)   # min_new_tokens' copy
    return {"reserved_pred": int(foot["reserved"]), "smi_pred": int(foot["total"]) if non_torch is not None else None,
            "decode_blocks_pred": int(foot["decode_allocated"])}


def _point(model, p: Point, base: Baseline, static: bool = True) -> dict:
    cfg = models.architecture_config(p.arch)
    row = {**p.key_fields(), "new_tokens": p.new_tokens, **base.fields(),
           "given_cache_set_aside": sets_cache_aside(cfg, p.seq_len, p.new_tokens)}
    pred = _predictions(cfg, p)
    r = measure.oom_guard(generation.measure_generate, model, p.seq_len, p.batch, p.new_tokens, cache="baseline")
    if not r["ok"]:
        return {**row, "oom": True, "peak_pred": pred["peak_pred"]}
    m = r["result"]
    foot = _footprint(cfg, p, base.non_torch, base.workspace)
    row.update(kv_pred=pred["kv_pred"], kv_meas=int(m["kv_meas"]), peak_pred=pred["peak_pred"],
               peak_meas=int(m["peak_meas"]), prefill_pred=pred["prefill_pred"], decode_pred=pred["decode_pred"],
               prefill_meas=int(m["prefill_meas"]), decode_meas=int(m["decode_meas"]),
               prefill_requested=int(m["prefill_requested"]), decode_requested=int(m["decode_requested"]),
               reserved_meas=int(m["reserved"]), reserved_pred=foot["reserved_pred"], non_torch=base.non_torch,
               decode_blocks_pred=foot["decode_blocks_pred"],
               smi_pred=foot["smi_pred"], smi_meas=m.get("process_gpu_bytes"),
               new_tokens_generated=int(m["new_tokens"]))
    if not static:
        return row
    s = measure.oom_guard(generation.measure_generate, model, p.seq_len, p.batch, p.new_tokens, cache="static")
    if s["ok"] and not s["result"]["cache_used"]:
        row["static_error"] = ("generate set the static cache aside and decoded with a dynamic one "
                               "(the model's prepare_inputs_for_generation)")
    elif s["ok"]:
        row.update(static_kv_meas=int(s["result"]["kv_meas"]), static_peak_meas=int(s["result"]["peak_meas"]),
                   static_peak_pred=pred["static_peak_pred"])
    return row


def _echo(row: dict) -> None:
    head = f"{row['model']:<18}{row['attention']:>6}{row.get('seq_len', ''):>6}{row.get('batch', ''):>4}"
    if row.get("error"):
        print(f"{head}  ERROR {row['error']}", flush=True)
        return
    if row.get("oom"):
        print(f"{head}  OOM (predicted peak {row['peak_pred'] / 2**30:.1f} GiB over the weights)", flush=True)
        return
    pct = lambda a, b: f"{100 * (row[a] / row[b] - 1):+.1f}%" if row.get(a) is not None and row.get(b) else "n/a"
    print(f"{head}  w {pct('weights_pred', 'weights_meas')}  kv {row['kv_pred'] - row['kv_meas']:+d} B  "
          f"peak {pct('peak_pred', 'peak_meas')}  prefill {pct('prefill_pred', 'prefill_meas')}  "
          f"decode {pct('decode_blocks_pred', 'decode_meas')} (tensors {pct('decode_pred', 'decode_requested')})  reserved {pct('reserved_pred', 'reserved_meas')}  "
          f"smi {pct('smi_pred', 'smi_meas')}", flush=True)


def cpu_prefill_peak(model, positions: int, batch: int, seed: int = 0) -> int:
    """Measured on a CPU: the peak of live tensor bytes (:mod:`helpers.host_alloc`) during one prefill
    forward of ``batch × positions`` random token ids that keeps only the last logits, with an
    attention mask of ones, as ``generate`` does — what :func:`helpers.budget.activation_bytes`
    predicts (``device="cpu"``). Without that mask transformers builds a sliding window's boolean mask
    once and expands it over the batch (``positions²`` bytes, not ``batch · positions²``)."""
    ids = random_ids(model.config.vocab_size, (batch, positions), seed=seed)
    mask = ids.new_ones(ids.shape)
    return host_alloc.peak_bytes(lambda: model(ids, attention_mask=mask, use_cache=False, logits_to_keep=1).logits)["peak"]


def merge_rows(rows: list[dict], newer: list[dict]) -> list[dict]:
    """``rows`` with every row of ``newer`` put in place of the row of the same point (``model``,
    ``attention``, ``seq_len``, ``batch``; an architecture-level ``error`` row has no shape and keys on
    its model and attention), new points appended in their order: later measurements replace earlier
    ones, nothing else is lost."""
    def key(r):
        return r.get("model"), r.get("attention", "sdpa"), r.get("seq_len"), r.get("batch")
    merged = {key(r): r for r in rows}
    merged.update((key(r), r) for r in newer)
    return list(merged.values())


def repredict(path: Path) -> list[dict]:
    """Recompute every ``*_pred`` field of a recorded file from the current formulas (CPU only; the
    measured fields are left as they were measured) and the flag ``given_cache_set_aside``
    (:func:`sets_cache_aside`). Keeps a file honest after a formula changes."""
    rows = read_json(path)
    for r in rows:
        if "error" in r:             # nothing was measured: nothing to predict against
            continue
        p = Point.from_row(r)
        cfg = models.architecture_config(p.arch)
        r.update(weights_pred=int(budget_replay.weight_allocation(cfg)),
                 weights_formula=int(budget.weight_bytes(cfg, "bf16")), **_predictions(cfg, p),
                 given_cache_set_aside=sets_cache_aside(cfg, p.seq_len, p.new_tokens))
        if "reserved_meas" in r:
            r.update(_footprint(cfg, p, r.get("non_torch"), r.get("cublas_workspace")))
    path.write_text(json.dumps(rows, indent=1))
    return rows
