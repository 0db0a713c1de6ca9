"""Memory per GPU when one model is split over several: tensor parallelism as vLLM lays it out, and
pipeline stages.

**Tensor parallelism of degree tp** (Megatron-LM's split, Shoeybi et al. 2019, arXiv:1909.08053 §3;
what vLLM builds, read from vllm-project/vllm):

* ``q/k/v`` and ``gate/up`` are *column-parallel* (each rank holds ``1/tp`` of the output rows),
  ``o`` and ``down`` *row-parallel* (``1/tp`` of the input columns, then an all-reduce of the partial
  sums): ``ColumnParallelLinear`` / ``RowParallelLinear`` in ``vllm/model_executor/layers/linear.py``
  (``output_size_per_partition = divide(output_size, tp_size)``, ``input_size_per_partition =
  divide(input_size, tp_size)``; ``tensor_model_parallel_all_reduce`` when ``reduce_results``).
* **KV heads**: ``QKVParallelLinear`` in the same file splits the query heads with
  ``num_heads = divide(total_num_heads, tp_size)``; when ``tp_size >= total_num_kv_heads`` each rank
  keeps one KV head and ``num_kv_head_replicas = divide(tp_size, total_num_kv_heads)`` ranks hold a
  copy of it, otherwise ``num_kv_heads = divide(total_num_kv_heads, tp_size)``. ``divide`` asserts
  divisibility, so tp must divide the query heads, and divide (or be a multiple of) the KV heads.
  The KV cache per rank follows: ``max(1, kv_heads / tp)`` heads per layer, so with fewer KV heads
  than ranks the cache of a head is *replicated*, not split.
* **Embedding and lm_head**: ``VocabParallelEmbedding`` and ``ParallelLMHead`` in
  ``vllm/model_executor/layers/vocab_parallel_embedding.py`` pad the vocabulary to a multiple of 64
  (``DEFAULT_VOCAB_PADDING_SIZE``, ``pad_vocab_size``) and give each rank
  ``num_embeddings_per_partition = divide(num_embeddings_padded, tp_size)`` rows; a tied lm_head is
  the embedding itself.
* norms (and the residual stream, hence part of the activations) are replicated on every rank.

**Pipeline parallelism of degree pp**: ``get_pp_indices`` in ``vllm/distributed/utils.py`` gives
each stage ``num_hidden_layers // pp`` layers and the remainder, one each, to the stages before the
last (``partitions[-i] += 1`` for ``i = 2, 3, …``); the first stage holds the embedding, the last
the final norm and lm_head (its own copy when tied). A stage keeps the KV cache of its layers only.

Modelled: dense full-attention decoders (Llama, Mistral without a window, Qwen2, …) — the layout
vLLM's Llama code builds. Mixtures of experts (expert parallelism), latent attention and
sliding-window pools are refused rather than guessed. The weight format's bits come from
:func:`helpers.budget.format_bits` (16-bit embeddings, norms and lm_head, as :func:`helpers.budget.weight_bytes`);
the hand count per rank is checked in tests against :func:`helpers.budget.meta_param_counts` of the
rank's own config (:func:`shard_config`: the transformers model a rank would build).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

from .budget import GPUS_GB, activation_bytes, format_bits, parts_bytes
from .budget_inputs import dtype_bytes
from .budget_kv import position_bytes
from .budget_shape import Shape
from .models import architecture_config
from .units import GB
from .validate import model_config, non_negative_int, number_in, positive_int

VOCAB_PADDING = 64          # vLLM's DEFAULT_VOCAB_PADDING_SIZE (vocab_parallel_embedding.py)
SEED_CARDS_GB = {"A100-40GB": GPUS_GB["A100-40GB"], "A100-80GB": GPUS_GB["A100-80GB"], "H200": GPUS_GB["H200"]}


@dataclass(frozen=True)
class RankShape:
    """What one tensor-parallel rank holds of each layer: ``heads`` query heads, ``kv_heads`` KV heads
    (each held by ``kv_replicas`` ranks), ``intermediate`` MLP columns, ``vocab_per_rank`` embedding rows
    of the ``vocab_padded`` vocabulary; ``hidden`` and ``head_dim`` are the model's."""
    tp: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    kv_replicas: int
    head_dim: int
    intermediate: int
    vocab_padded: int
    vocab_per_rank: int
    tied: bool


def _dense_shape(config) -> Shape:
    config = architecture_config(config) if isinstance(config, str) else model_config(config)
    s = Shape.from_config(config)
    if s.moe is not None:
        raise ValueError(f"model_type {s.model_type!r} is a mixture of experts: vLLM splits experts by expert "
                         "parallelism, which helpers.parallel does not model; use a dense decoder config")
    if s.mla is not None:
        raise ValueError(f"model_type {s.model_type!r} uses latent attention (MLA), whose split helpers.parallel "
                         "does not model; use a dense decoder config")
    if any(c.kind != "full" for c in s.check_caches()):
        raise ValueError(f"model_type {s.model_type!r} has sliding-window, chunked or cache-less layers: vLLM gives "
                         "them separate KV pools, which helpers.parallel does not model; use a full-attention config")
    return s


def rank_shape(config, tp: int = 1) -> RankShape:
    """One rank's share of every layer at tensor-parallel degree ``tp`` (vLLM's rules, module docstring).
    ``config``: a transformers config or a :data:`helpers.models.ARCHITECTURES` name. Raises a
    ``ValueError`` naming ``tp`` and the field it must divide where vLLM's ``divide`` would fail."""
    s = _dense_shape(config)
    tp = positive_int(tp, "tp", "the tensor-parallel size (vLLM's --tensor-parallel-size)")
    if s.heads % tp:
        raise ValueError(f"tp={tp} must divide num_attention_heads={s.heads} (QKVParallelLinear splits the query "
                         f"heads evenly); sizes that do: {[d for d in range(1, s.heads + 1) if s.heads % d == 0]}")
    if tp >= s.kv_heads:
        if tp % s.kv_heads:
            raise ValueError(f"tp={tp} ≥ num_key_value_heads={s.kv_heads} must be a multiple of it (each KV head is "
                             "replicated on tp / num_key_value_heads ranks)")
        kv, replicas = 1, tp // s.kv_heads
    else:
        if s.kv_heads % tp:
            raise ValueError(f"tp={tp} < num_key_value_heads={s.kv_heads} must divide it (the KV heads are split "
                             "evenly)")
        kv, replicas = s.kv_heads // tp, 1
    if s.intermediate % tp:
        raise ValueError(f"tp={tp} must divide intermediate_size={s.intermediate} (gate/up are column-parallel)")
    padded = math.ceil(s.vocab / VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp:
        raise ValueError(f"tp={tp} must divide the padded vocabulary {padded} (vocab_size={s.vocab} rounded up to a "
                         f"multiple of {VOCAB_PADDING})")
    return RankShape(tp, s.layers, s.hidden, s.heads // tp, kv, replicas, s.head_dim, s.intermediate // tp,
                     padded, padded // tp, s.tied)


def shard_config(config, tp: int = 1, layers: int | None = None):
    """The config of the model one rank builds: query and KV heads, MLP width and vocabulary cut to the
    rank's share (:func:`rank_shape`), ``hidden_size`` and ``head_dim`` unchanged; ``layers`` (default
    all) sets ``num_hidden_layers``, e.g. one pipeline stage's. Its transformers model has exactly the
    rank's parameters (checked in tests with :func:`helpers.budget.meta_param_counts`)."""
    r = rank_shape(config, tp)
    c = copy.deepcopy(architecture_config(config) if isinstance(config, str) else config)
    c.num_attention_heads, c.num_key_value_heads = r.heads, r.kv_heads
    c.head_dim, c.intermediate_size, c.vocab_size = r.head_dim, r.intermediate, r.vocab_per_rank
    if layers is not None:
        c.num_hidden_layers = positive_int(layers, "layers")
    return c


def layer_param_counts(config, tp: int = 1) -> dict:
    """Parameters one rank holds of one decoder layer: ``q`` ``h·(H/tp)·d``, ``kv`` ``2·h·kv_r·d`` (``kv_r``
    the rank's KV heads, :func:`rank_shape`), ``o`` ``(H/tp)·d·h``, ``mlp`` ``3·h·I/tp``, ``norms`` ``2h``
    (replicated), and ``total``. Biases are not modelled (Llama has none)."""
    r = rank_shape(config, tp)
    h, d = r.hidden, r.head_dim
    parts = {"q": h * r.heads * d, "kv": 2 * h * r.kv_heads * d, "o": r.heads * d * h,
             "mlp": 3 * h * r.intermediate, "norms": 2 * h}
    return {**parts, "total": sum(parts.values())}


def stage_layers(num_layers: int, pp: int = 1) -> list[int]:
    """Decoder layers per pipeline stage, as vLLM's ``get_pp_indices`` splits them: ``num_layers // pp``
    each, the remainder one each to the stages before the last (from the second-to-last backwards)."""
    num_layers = positive_int(num_layers, "num_layers")
    pp = positive_int(pp, "pp", "the pipeline-parallel size (vLLM's --pipeline-parallel-size)")
    if pp > num_layers:
        raise ValueError(f"pp={pp} stages for {num_layers} layers: every stage needs at least one layer")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def rank_param_counts(config, tp: int = 1, pp: int = 1, stage: int = 0) -> dict:
    """Parameters of one GPU (tensor rank × pipeline ``stage``) by part: ``embed``, ``linears``, ``norms``,
    ``lm_head``, ``total`` — the parts :func:`helpers.budget.param_counts` names, so the bytes follow
    :func:`helpers.budget.weight_bytes`' rule."""
    r = rank_shape(config, tp)
    stages = stage_layers(r.layers, pp)
    stage = _stage(stage, pp)
    first, last = stage == 0, stage == pp - 1
    per = layer_param_counts(config, tp)
    n = stages[stage]
    rows = r.vocab_per_rank * r.hidden
    head = rows if (not r.tied or pp > 1) and last else 0     # tied: the embedding itself, unless on another stage
    parts = {"embed": rows if first else 0, "linears": n * (per["total"] - per["norms"]),
             "norms": n * per["norms"] + (r.hidden if last else 0), "lm_head": head}
    return {**parts, "total": sum(parts.values())}


def _stage(stage, pp) -> int:
    stage = non_negative_int(stage, "stage", "a pipeline stage, 0 … pp − 1")
    if stage >= pp:
        raise ValueError(f"stage must be in [0, pp={pp}), got {stage}")
    return stage


def rank_weight_bytes(config, tp: int = 1, fmt: str = "bf16", pp: int = 1, stage: int = 0) -> float:
    """Weight bytes on one GPU: the rank's linears at ``fmt`` (:func:`helpers.budget.format_bits`), the rest
    at 16 bits (32 for fp32), as :func:`helpers.budget.weight_bytes` counts a whole model."""
    return parts_bytes(rank_param_counts(config, tp, pp, stage), fmt)


def rank_kv_bytes_per_token(config, tp: int = 1, kv_dtype="bf16", pp: int = 1, stage: int = 0) -> float:
    """KV bytes one token costs on one GPU: the stage's layers × ``2 · kv_r · head_dim · b`` with ``kv_r``
    the rank's KV heads (``max(1, kv_heads/tp)``: replicated, not split, below one head per rank)."""
    r = rank_shape(config, tp)
    n = stage_layers(r.layers, pp)[_stage(stage, pp)]
    s = replace(_dense_shape(config), kv_heads=r.kv_heads)
    return n * position_bytes(s, dtype_bytes(kv_dtype))


def per_gpu(config, tp: int = 1, pp: int = 1, fmt: str = "bf16", seq_len: int = 4096, batch: int = 1,
            kv_dtype="bf16", activation_tokens: int = 2048, overhead_gb: float = 1.0) -> dict:
    """Bytes on the fullest GPU of a ``tp × pp`` split: ``weights``, ``kv`` (``batch`` sequences of
    ``seq_len`` tokens), ``activations`` (an estimate: :func:`helpers.budget.activation_bytes` of the
    rank's own model over one prefill chunk of ``activation_tokens`` — vLLM's ``--max-num-batched-tokens``,
    the forward it profiles at start-up), ``overhead`` (CUDA context, NCCL buffers: ``overhead_gb``, to be
    measured), ``total``, and ``stage`` (which pipeline stage is the fullest)."""
    seq_len, batch = positive_int(seq_len, "seq_len"), positive_int(batch, "batch")
    activation_tokens = positive_int(activation_tokens, "activation_tokens", "vLLM's --max-num-batched-tokens")
    overhead = number_in(overhead_gb, "overhead_gb", 0, 1e6, hint="GB per GPU, measured (measure.overhead)") * GB
    rows = []
    for st in range(len(stage_layers(rank_shape(config, tp).layers, pp))):
        w = rank_weight_bytes(config, tp, fmt, pp, st)
        kv = rank_kv_bytes_per_token(config, tp, kv_dtype, pp, st) * seq_len * batch
        rows.append({"stage": st, "weights": w, "kv": kv})
    act_dtype = "fp32" if fmt == "fp32" else "bf16"
    act = activation_bytes(shard_config(config, tp, layers=1), activation_tokens, 1, act_dtype)["peak"]
    top = max(rows, key=lambda x: x["weights"] + x["kv"])
    return {**top, "activations": act, "overhead": overhead,
            "total": top["weights"] + top["kv"] + act + overhead}


def fits_across(config="Llama-2-70B", formats=("bf16", "int4"), gpus=(1, 2, 4, 8), cards=SEED_CARDS_GB,
                seq_len: int = 4096, batch: int = 32, kv_dtype="bf16", utilization: float = 0.9,
                overhead_gb: float = 1.0, activation_tokens: int = 2048) -> list[dict]:
    """For every weight format × number of GPUs (tensor parallelism over all of them) × card: GB per GPU
    (weights, KV of ``batch × seq_len``, activations, overhead), vLLM's usable memory
    (``utilization × card``, ``--gpu-memory-utilization``), the ``headroom`` left (negative: does not fit),
    ``fits``, and ``max_seqs``: how many ``seq_len``-token sequences the KV room holds (vLLM's concurrency).
    A GPU count tp cannot take (it must divide the heads) gets ``fits = "tp invalid"`` and the reason."""
    if isinstance(formats, str) or not formats:
        raise ValueError(f"formats must be a non-empty list of weight formats, got {formats!r}")
    if not isinstance(cards, dict) or not cards:
        raise ValueError(f"cards must be a non-empty dict of card name → GB, got {cards!r}")
    utilization = number_in(utilization, "utilization", 0, 1, low_open=True, hint="vLLM's default is 0.9")
    seq_len, batch = positive_int(seq_len, "seq_len"), positive_int(batch, "batch")
    _dense_shape(config)                               # a config the split cannot model fails here, not per row
    rows = []
    for fmt in formats:
        format_bits(fmt)
        for n in gpus:
            n = positive_int(n, "gpus[...]")
            try:
                rank_shape(config, n)
            except ValueError as e:
                rows += [{"format": fmt, "gpus": n, "card": card, "fits": "tp invalid", "why": str(e)}
                         for card in cards]
                continue
            p = per_gpu(config, n, 1, fmt, seq_len, batch, kv_dtype, activation_tokens, overhead_gb)
            per_seq = p["kv"] / batch
            for card, gb in cards.items():
                usable = utilization * gb * GB
                room = usable - p["weights"] - p["activations"] - p["overhead"]
                rows.append({"format": fmt, "gpus": n, "card": card, "weights_GB": p["weights"] / GB,
                             "kv_GB": p["kv"] / GB, "act_GB": p["activations"] / GB, "total_GB": p["total"] / GB,
                             "usable_GB": usable / GB, "headroom_GB": (usable - p["total"]) / GB,
                             "fits": "yes" if p["total"] <= usable else "no",
                             "max_seqs": max(0, int(room // per_seq))})
    return rows
