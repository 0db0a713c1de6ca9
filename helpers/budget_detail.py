"""The fidelity layer of the memory budget: what transformers' code really holds, for any decoder it builds.

:mod:`helpers.budget` is the lesson of notebook 01 — four parts from a config. The terms below are
what make its numbers agree with measurement on every architecture, read once from the config and
from the model transformers builds on the meta device (no memory, no download):

* **the description** — :class:`Shape` (sizes from the config's fields, one :class:`LayerCache` per
  layer from ``layer_types``: full, sliding, chunked attention, or no cache), :class:`MoE` and
  :class:`MLA` when the config has experts or latent attention, and :class:`Layout`, what the modeling
  code builds around those sizes (extra norms, biases, fused projections, attention sinks) together
  with the exact parameter count by part;
* **parameters** the lesson's Llama formula does not cover: :func:`attention_params`,
  :func:`mlp_params`, :func:`norm_params`;
* **the KV cache as transformers stores it**: positions per layer (:func:`kv_positions`), the storage
  a sliding layer's view keeps after the prefill (:func:`kv_storage_positions`), bytes per position
  (:func:`kv_position_bytes`, latents for MLA);
* **transients of one block**: :func:`block_transients` (SDPA, eager attention's score copies, dense,
  fused and mixture-of-experts MLPs, MLA), :func:`eager_score_bytes`, and the expert weights a GPU
  decode step gathers (:func:`moe_decode_gather_bytes`);
* **the allocator replay**: :func:`weight_ops`, :func:`weight_allocation`, :func:`generation_ops`,
  :func:`device_footprint` (the allocator simulator of notebook 02 fed the ops of instantiate +
  ``generate``).

Sources: transformers 5.17 (``cache_utils.DynamicCache`` / ``DynamicSlidingWindowLayer``,
``get_layer_types_and_kwargs``, ``eager_attention_forward``, ``integrations/moe.py``,
``GenerationMixin._optimize_model_for_decode``); DeepSeek-V2 (arXiv:2405.04434 §2.1) for MLA; ATen's
``SoftMax.cpp`` for the fp32 softmax copies; PyTorch's ``CUDACachingAllocator.cpp`` through
:mod:`helpers.allocator_sim`. Every term is checked on the CPU by tests/test_budget.py and
tests/test_budget_measured.py, and on the H200 by ``benchmarks/budget_accuracy.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from . import validate
from .allocator_sim import simulate
from .models import parse_dtype, quiet_torchao_import

KV_FORMATS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
ATTENTIONS = ("sdpa", "eager")
CACHES = ("dynamic", "static")
DEVICES = ("cuda", "cpu")


# --------------------------------------------------------------------------- the door checks
# helpers.validate's meaning of each check (numpy and torch integers accepted; bools, floats where a
# count is meant, NaN and inf refused), raised here as a ValueError naming the argument
def positive_int(value, name: str) -> int:
    """``value`` as an int ≥ 1 (:func:`helpers.validate.positive_int`), else a ``ValueError`` naming ``name``."""
    try:
        return validate.positive_int(value, name)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None


def non_negative_int(value, name: str) -> int:
    """``value`` as an int ≥ 0 (:func:`helpers.validate.non_negative_int`), else a ``ValueError`` naming ``name``."""
    try:
        return validate.non_negative_int(value, name)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer ≥ 0, got {value!r}") from None


def byte_count(value, name: str, hint: str = "", unit: str = "bytes") -> float:
    """``value`` as a finite number ≥ 0 of ``unit`` (:func:`helpers.validate.non_negative_number`), else a
    ``ValueError`` naming ``name``."""
    try:
        return float(validate.non_negative_number(value, name))
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number of {unit} ≥ 0{hint}, got {value!r}") from None


def choice(value, name: str, options) -> str:
    """``value`` if it is one of ``options`` (:func:`helpers.validate.one_of`), else a ``ValueError``
    naming ``name`` and the options."""
    try:
        return validate.one_of(value, name, options)
    except ValueError:
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}") from None


def dtype_bytes(fmt) -> float:
    """Bytes per element of a KV/activation format name (:data:`KV_FORMATS`) or a torch dtype."""
    if isinstance(fmt, torch.dtype):
        return torch.empty(0, dtype=fmt).element_size()
    if isinstance(fmt, str) and fmt in KV_FORMATS:
        return KV_FORMATS[fmt] / 8
    raise ValueError(f"unknown dtype {fmt!r}; use one of {sorted(KV_FORMATS)} or a torch.dtype")


def _is_fp16(fmt) -> bool:
    return fmt in ("fp16", torch.float16)


# --------------------------------------------------------------------------- the description
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}
MODELLED = ("full", "sliding", "chunked")


@dataclass(frozen=True)
class LayerCache:
    """What one layer's KV cache holds: ``kind`` ``"full"`` (every position), ``"sliding"`` /
    ``"chunked"`` (transformers keeps both in a ``DynamicSlidingWindowLayer`` of ``window`` =
    ``sliding_window`` / ``attention_chunk_size``; only the mask differs), ``"none"`` (a layer that
    reads another layer's cache, ``num_kv_shared_layers``); any other kind is the config's own layer
    type (a recurrent or compressed state), which the KV functions refuse by name."""
    kind: str
    window: int | None = None


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 §2.1): queries through an optional
    low-rank ``q_lora_rank``, keys and values from one ``kv_lora_rank`` latent plus a shared
    ``rope_dim``-wide rotary key — which is what the cache stores (transformers caches the latents,
    ``past_key_values.update(k_nope, k_pe)``)."""
    q_lora_rank: int | None
    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    v_dim: int

    @classmethod
    def from_config(cls, config) -> MLA | None:
        if getattr(config, "kv_lora_rank", None) is None:
            return None
        return cls(getattr(config, "q_lora_rank", None) or None, int(config.kv_lora_rank),
                   int(config.qk_rope_head_dim), int(config.qk_nope_head_dim), int(config.v_head_dim))


ROUTING_IN_FP32 = frozenset({"mixtral", "deepseek_v2", "deepseek_v3"})
"""Model types whose router hands the experts fp32 routing weights (``MixtralTopKRouter``:
``softmax(router_logits.float())``; ``DeepseekV2TopkRouter``: ``softmax(dtype=float32)``), so the
weighted expert outputs are fp32 too. Other routers cast back to the model's dtype (Qwen-MoE/OLMoE:
``router_top_value.to(router_logits.dtype)``; GPT-OSS, Llama-4: the model's dtype)."""


ROTARY_IN_FP32 = frozenset({"cohere", "cohere2"})
"""Model types whose ``apply_rotary_pos_emb`` rotates q and k in fp32 (``q = q.float()``, Cohere's
interleaved rotary), so the attention stage holds fp32 copies of q and k and of the rotation's terms."""


EAGER_SOFTMAX_COPIES = {"llama4_text": 2, "llama4": 2, "gpt_oss": 3}
"""Model types whose own ``eager_attention_forward`` keeps the softmax in the model's dtype, with the
score-sized copies alive at its widest: Llama-4 (``softmax(attn_weights)``: input and output, 2),
GPT-OSS (the masked scores, the scores with the sink column, their max-subtracted copy / the
softmax: 3). Everyone else: :func:`eager_score_bytes`."""


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts MLP read from the config: ``experts`` of width ``width`` resident, ``per_token``
    of them run per token, a shared expert of ``shared_width`` (0: none), dense layers where
    ``sparse_layers`` leaves a layer out, and ``fp32_routing`` (:data:`ROUTING_IN_FP32`)."""
    experts: int
    per_token: int | None
    width: int
    shared_width: int
    sparse_layers: frozenset
    fp32_routing: bool

    @classmethod
    def from_config(cls, config, layers: int) -> MoE | None:
        experts = next((getattr(config, k) for k in ("num_local_experts", "num_experts", "n_routed_experts")
                        if getattr(config, k, None)), None)
        if not experts:
            return None
        width = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
        shared = getattr(config, "shared_expert_intermediate_size", None) or \
            (getattr(config, "n_shared_experts", None) or 0) * (getattr(config, "moe_intermediate_size", None) or 0)
        first_dense = getattr(config, "first_k_dense_replace", None) or 0
        mlp_only = set(getattr(config, "mlp_only_layers", None) or [])
        step = getattr(config, "decoder_sparse_step", None) or 1
        freq = getattr(config, "moe_layer_freq", None) or 1
        listed = getattr(config, "moe_layers", None)
        sparse = frozenset(i for i in range(layers)
                           if i >= first_dense and (i - first_dense) % freq == 0 and i not in mlp_only
                           and (i + 1) % step == 0 and (listed is None or i in listed))
        k = getattr(config, "num_experts_per_tok", None)
        return cls(int(experts), int(k) if k else None, int(width), int(shared), sparse,
                   getattr(config, "model_type", "") in ROUTING_IN_FP32)


@dataclass(frozen=True)
class Shape:
    """The numbers of a decoder config memory depends on, read once from its fields: sizes, one
    :class:`LayerCache` per layer (``caches``), and :class:`MoE` / :class:`MLA` where the config has
    them. ``intermediate`` is the dense MLP's width (Llama-4: ``intermediate_size_mlp``)."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    caches: tuple = ()
    moe: MoE | None = None
    mla: MLA | None = None
    model_type: str = ""

    @classmethod
    def from_config(cls, config) -> Shape:
        if hasattr(config, "get_text_config"):
            config = config.get_text_config()
        need = ["num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"]
        missing = [k for k in need if getattr(config, k, None) is None]
        if missing:
            raise ValueError(f"config lacks {missing}: the budget needs a decoder config with those fields "
                             "(a transformers config of a causal LM: AutoConfig.from_pretrained(...))")
        try:
            layers, heads = int(config.num_hidden_layers), int(config.num_attention_heads)
            kv = int(getattr(config, "num_key_value_heads", None) or heads)
            head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
            dense = int(getattr(config, "intermediate_size_mlp", None) or config.intermediate_size)
            sizes = (int(config.hidden_size), dense, heads, kv, head_dim, int(config.vocab_size))
        except Exception as e:   # per-layer sizes (lists), per-layer attributes (transformers raises its own errors)
            raise ValueError(f"model_type {getattr(config, 'model_type', None)!r}: its sizes are not one number per "
                             f"model ({type(e).__name__}: {str(e)[:120]}); the budget's formulas need them to be "
                             "(its exact parameter count: budget.meta_param_counts)") from None
        return cls(layers, *sizes, bool(getattr(config, "tie_word_embeddings", False)), layer_caches(config),
                   MoE.from_config(config, layers), MLA.from_config(config), getattr(config, "model_type", "") or "")

    def sparse(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a mixture of experts."""
        return self.moe is not None and layer in self.moe.sparse_layers

    @property
    def has_dense_mlp(self) -> bool:
        """Whether any layer runs a dense MLP (every layer of a dense model; DeepSeek's first
        ``first_k_dense_replace``; Qwen-MoE's ``mlp_only_layers``)."""
        return any(not self.sparse(i) for i in range(self.layers))

    @property
    def cached_layers(self) -> int:
        """Layers that keep a per-token KV cache."""
        return sum(c.kind in MODELLED for c in self.check_caches())

    def check_caches(self) -> tuple:
        """The per-layer caches, or a ``ValueError`` naming the layer types the budget does not model."""
        unknown = sorted({c.kind for c in self.caches} - set(MODELLED) - {"none"})
        if unknown:
            raise ValueError(f"layer_types {unknown} (model_type {self.model_type!r}) keep no per-token KV cache the "
                             f"budget models (it models {sorted(LAYER_TYPES)} and layers without a cache): their "
                             "recurrent or compressed state is not counted, so the KV bytes would be wrong")
        return self.caches

    def experts_per_token(self) -> int:
        """The experts each token runs (``num_experts_per_tok``), or a ``ValueError`` when the config lacks it."""
        if not self.moe.per_token:
            raise ValueError(f"model_type {self.model_type!r} has {self.moe.experts} experts but the config sets no "
                             "num_experts_per_tok: the activations depend on it; set it on the config")
        return self.moe.per_token


def layer_caches(config) -> tuple:
    """One :class:`LayerCache` per layer, as transformers' ``DynamicCache(config=...)`` builds them
    (``cache_utils.get_layer_types_and_kwargs``): ``config.layer_types`` where the config has it,
    otherwise every layer slides when ``sliding_window`` is set, is chunked when
    ``attention_chunk_size`` is, else is full; the last ``num_kv_shared_layers`` layers keep no cache.
    Other layer types (recurrent, convolutional, compressed attention) are kept under their own
    name, and the KV functions refuse them (:meth:`Shape.check_caches`)."""
    n = int(config.num_hidden_layers)
    types = getattr(config, "layer_types", None)
    if types is None:
        if getattr(config, "sliding_window", None) is not None:
            types = ["sliding_attention"] * n
        elif getattr(config, "attention_chunk_size", None) is not None:
            types = ["chunked_attention"] * n
        else:
            types = ["full_attention"] * n
    windows = {"sliding": getattr(config, "sliding_window", None), "chunked": getattr(config, "attention_chunk_size", None)}
    def cache(t):
        kind = LAYER_TYPES.get(t)
        if kind is None:
            return LayerCache(str(t))
        if kind == "full":
            return LayerCache(kind)
        if windows[kind] is None:       # a sliding layer without a window: refused by check_caches, by name
            return LayerCache(f"{t} without {'sliding_window' if kind == 'sliding' else 'attention_chunk_size'}")
        return LayerCache(kind, int(windows[kind]))
    caches = [cache(t) for t in types]
    shared = getattr(config, "num_kv_shared_layers", None) or 0
    return tuple(caches[: n - shared] + [LayerCache("none")] * shared)


def meta_model(config, dtype=None):
    """The transformers causal LM of ``config`` built on the meta device: every parameter's shape, no
    memory (what ``accelerate estimate-memory`` counts). A model type transformers cannot build as a
    causal LM raises with its name."""
    if not isinstance(config, PretrainedConfig):
        raise ValueError(f"config must be a transformers config (AutoConfig.from_pretrained(...) or model.config), "
                         f"got {type(config).__name__}")
    kw = {"dtype": parse_dtype(dtype)} if dtype is not None else {}
    quiet_torchao_import()
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, **kw)
    except Exception as e:
        raise ValueError(f"transformers cannot build model_type {getattr(config, 'model_type', None)!r} as a causal "
                         f"LM from this config ({type(e).__name__}: {str(e)[:200]}); the budget needs a decoder "
                         "config AutoModelForCausalLM.from_config accepts") from e


def _is_norm(module) -> bool:
    return "Norm" in type(module).__name__


def _decoder_layers(model, n: int):
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == n and name.endswith("layers"):
            return m
    return None


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _find(modules: dict, *names):
    """The first module of ``modules`` (``named_modules()`` as a dict) whose own name is one of ``names``."""
    return next((m for path, m in modules.items() for name in names if path.split(".")[-1] == name), None)


def _has_bias(module) -> bool:
    return isinstance(getattr(module, "bias", None), torch.nn.Parameter)


@dataclass(frozen=True)
class Layout:
    """What the modeling code builds around the config's sizes — read from the meta-device model, by
    the module names transformers' decoders share (``q_proj``, ``qkv_proj``, ``q_norm``,
    ``gate_up_proj``, ``sinks``, ``experts``, …) — and ``parts``, the model's exact parameter count by
    part (``embed``: every ``nn.Embedding``; ``lm_head``: an untied output embedding; ``norms``: the
    weights and biases of every normalisation module, q/k norms included; ``linears``: the rest —
    projections, their biases, experts, routers, sinks). The defaults are Llama's layout."""
    parts: dict
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str = ""              # "": none, "head": one head_dim vector each, "full": heads·head_dim and kv_heads·head_dim
    layer_norm_vectors: float = 2  # hidden-wide norm vectors per layer outside attention/MLP (a LayerNorm bias is one more)
    final_norm_vectors: float = 1
    sinks: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    gated_mlp: bool = True
    mlp_bias: bool = False
    expert_bias: bool = False
    router_bias: bool = False
    shared_gate: bool = False
    shared_expert: bool = False
    experts_kernel: bool = True    # the experts run through transformers' experts implementations (grouped_mm / batched_mm)
    custom_gate: bool = False      # the experts' own gate (GPT-OSS's clamped GLU) instead of ``act(gate) * up``
    pre_norm: bool = True          # the MLP reads a normed copy of the residual (False: post-norm layers, OLMo-2)

    @classmethod
    def from_config(cls, config) -> Layout:
        return cls.from_model(meta_model(config), Shape.from_config(config))

    @classmethod
    def from_model(cls, model, s: Shape) -> Layout:
        """Read from ``model`` (built from the config ``s`` describes): layer 0 for attention and norms,
        the first dense layer for the MLP, the first mixture-of-experts layer for the experts."""
        parts = parameter_parts(model)
        layers = _decoder_layers(model, s.layers)
        if layers is None:
            return cls(parts)
        first = dict(layers[0].named_modules())
        children = dict(layers[0].named_children())
        q, k, qkv = _find(first, "q_proj"), _find(first, "k_proj"), _find(first, "qkv_proj")
        q_norm = _find(first, "q_norm", "q_layernorm", "query_layernorm")
        qk_norm = "" if getattr(q_norm, "weight", None) is None else \
            "head" if q_norm.weight.numel() == s.head_dim else "full"
        attn = next((m for m in children.values() if _find(dict(m.named_modules()), "o_proj")), None)
        vectors = sum(_numel(m) for m in children.values() if _is_norm(m)) / s.hidden
        top_norms = sum(_numel(m) for name, m in model.named_modules() if _is_norm(m) and "layers" not in name.split("."))
        dense = next((layers[i] for i in range(s.layers) if not s.sparse(i)), None)
        dense_mods = dict(dense.named_modules()) if dense is not None else {}
        sparse = next((layers[i] for i in range(s.layers) if s.sparse(i)), None)
        sparse_mods = dict(sparse.named_modules()) if sparse is not None else {}
        experts = _find(sparse_mods, "experts")
        gate = getattr(type(experts), "_apply_gate", None)
        return cls(
            parts, qkv_bias=_has_bias(k) or _has_bias(qkv), o_bias=_has_bias(_find(first, "o_proj")), qk_norm=qk_norm,
            layer_norm_vectors=vectors, final_norm_vectors=top_norms / s.hidden,
            sinks=attn is not None and any(n.split(".")[-1] == "sinks" for n, _ in attn.named_parameters()),
            fused_qkv=qkv is not None and q is None, fused_gate_up=_find(dense_mods, "gate_up_proj") is not None,
            gated_mlp=dense is None or _find(dense_mods, "gate_proj", "gate_up_proj") is not None,
            mlp_bias=_has_bias(_find(dense_mods, "down_proj")),
            expert_bias=experts is not None and any(n.endswith("_bias") for n, _ in experts.named_parameters()),
            router_bias=_has_bias(_find(sparse_mods, "router", "gate")),
            shared_gate=_find(sparse_mods, "shared_expert_gate") is not None,
            shared_expert=_find(sparse_mods, "shared_expert", "shared_experts", "shared_mlp") is not None,
            experts_kernel=experts is None or hasattr(experts, "is_concatenated"),   # set by use_experts_implementation
            custom_gate=experts is not None and getattr(gate, "__qualname__", "").startswith(type(experts).__name__ + "."),
            pre_norm=_find(children, "input_layernorm", "pre_feedforward_layernorm", "operator_norm",
                           "attention_layernorm") is not None)


def parameter_parts(model) -> dict:
    """Parameters of a (meta-device) model by part — ``embed``, ``linears``, ``norms``, ``lm_head`` and
    ``total`` — each parameter counted once (a tied ``lm_head`` is the embedding)."""
    owner = {}
    for name, m in model.named_modules():
        for _, p in m.named_parameters(recurse=False):
            owner.setdefault(id(p), (name, m))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    parts = {"embed": 0, "linears": 0, "norms": 0, "lm_head": 0}
    for p in model.parameters():
        _, m = owner[id(p)]
        if id(p) in head_ids and not isinstance(m, torch.nn.Embedding):
            parts["lm_head"] += p.numel()
        elif isinstance(m, torch.nn.Embedding):
            parts["embed"] += p.numel()
        elif _is_norm(m):
            parts["norms"] += p.numel()
        else:
            parts["linears"] += p.numel()
    return {**parts, "total": sum(parts.values())}


# --------------------------------------------------------------------------- parameters the Llama formula leaves out
def attention_params(s: Shape, lay: Layout) -> int:
    """One layer's attention parameters outside its norms: ``h·H·d`` (q) + ``2·h·K·d`` (k, v) +
    ``H·d·h`` (o), the biases the layout has, ``H`` sinks (GPT-OSS); with MLA (arXiv:2405.04434
    §2.1) the query path ``h·H·(nope + rope)`` or ``h·r_q + r_q·H·(nope + rope)``, the compressed KV
    ``h·(r_kv + rope)``, its up-projection ``r_kv·H·(nope + v)`` and ``H·v·h``."""
    h, H = s.hidden, s.heads
    if s.mla:
        a = s.mla
        q = h * H * (a.nope_dim + a.rope_dim) if not a.q_lora_rank else h * a.q_lora_rank + a.q_lora_rank * H * (a.nope_dim + a.rope_dim)
        return q + h * (a.kv_lora_rank + a.rope_dim) + a.kv_lora_rank * H * (a.nope_dim + a.v_dim) + H * a.v_dim * h
    attn = h * H * s.head_dim * 2 + h * s.kv_heads * s.head_dim * 2
    if lay.qkv_bias:
        attn += (H + 2 * s.kv_heads) * s.head_dim
    if lay.o_bias:
        attn += h
    return attn + (H if lay.sinks else 0)


def mlp_params(s: Shape, lay: Layout, layer: int) -> int:
    """One layer's MLP: dense ``3·h·I`` (gated: gate, up, down; ``2·h·I`` ungated) plus its biases, or
    a mixture of experts — every expert resident (``E·3·h·I_e``, their biases), the router ``h·E``, a
    shared expert ``3·h·I_s`` and its gate ``h``; only ``per_token`` experts run per token."""
    h = s.hidden
    if not s.sparse(layer):
        n = 3 if lay.gated_mlp else 2
        return n * h * s.intermediate + ((n - 1) * s.intermediate + h if lay.mlp_bias else 0)
    m = s.moe
    experts = m.experts * (3 * h * m.width + (2 * m.width + h if lay.expert_bias else 0))
    router = h * m.experts + (m.experts if lay.router_bias else 0)
    shared = m.shared_width or (m.width if lay.shared_expert else 0)
    return experts + router + (3 * h * shared if shared else 0) + (h if lay.shared_gate else 0)


def norm_params(s: Shape, lay: Layout) -> int:
    """Every normalisation weight: per layer the layout's hidden-wide vectors (2 for Llama, 4 for
    Gemma-2/3's sandwich norms, 1 for Cohere's parallel block), q/k norms (``2·d``, or ``(H + K)·d``
    over the whole projection, OLMo-2), MLA's latent norms (``r_kv``, ``r_q``), and the final norm."""
    per_layer = lay.layer_norm_vectors * s.hidden
    if lay.qk_norm == "head":
        per_layer += 2 * s.head_dim
    elif lay.qk_norm == "full":
        per_layer += (s.heads + s.kv_heads) * s.head_dim
    if s.mla:
        per_layer += s.mla.kv_lora_rank + (s.mla.q_lora_rank or 0)
    return int(s.layers * per_layer + lay.final_norm_vectors * s.hidden)


# --------------------------------------------------------------------------- the KV cache as transformers stores it
def layer_windows(config) -> list[int | None]:
    """Each layer's attention window: ``None`` for full attention (and for a layer without a cache),
    the window of a sliding or chunked layer (:func:`layer_caches`)."""
    return [c.window for c in Shape.from_config(config).check_caches()]


def _positions(s: Shape, tokens: int, cache: str) -> list[int]:
    keep = (lambda w: w - 1) if cache == "dynamic" else (lambda w: w)
    return [0 if c.kind == "none" else tokens if c.window is None else min(tokens, keep(c.window))
            for c in s.check_caches()]


def kv_positions(config, tokens: int, cache: str = "dynamic") -> list[int]:
    """Positions each layer's KV cache holds after ``tokens`` tokens. A full-attention layer holds
    all of them; a sliding or chunked layer in transformers' ``DynamicCache`` keeps the last
    ``window − 1`` (``DynamicSlidingWindowLayer.update``: all a later query can attend to besides
    itself), a ``StaticCache`` allocates ``min(window, length)``; a layer without a cache holds none."""
    tokens = positive_int(tokens, "tokens")
    return _positions(Shape.from_config(config), tokens, choice(cache, "cache", CACHES))


def _storage_positions(s: Shape, prompt_len: int, steps: int) -> list[int]:
    return [0 if c.kind == "none" else prompt_len + steps if c.window is None or steps == 0
            else min(prompt_len + steps, c.window) for c in s.check_caches()]


def kv_storage_positions(config, prompt_len: int, steps: int = 0) -> list[int]:
    """Positions each layer's K (or V) *storage* holds in transformers' ``DynamicCache`` after the
    prefill of ``prompt_len`` tokens and ``steps`` one-token decode steps. A sliding layer keeps its
    last ``window − 1`` positions as a **view** of the tensor ``torch.cat`` just made
    (``full[:, :, -window + 1:, :]``, ``DynamicSlidingWindowLayer.update``), so after the prefill the
    whole prompt's storage stays alive; each decode step's ``torch.cat`` makes a new tensor of
    ``min(prompt_len + steps, window)`` positions and lets the old one go. Full-attention layers hold
    every position. (:func:`kv_positions` is what the cache *exposes*; this is what it *occupies*.)"""
    prompt_len = positive_int(prompt_len, "prompt_len")
    try:
        steps = non_negative_int(steps, "steps")
    except ValueError:
        raise ValueError(f"steps must be an int ≥ 0 (decode steps after the prefill), got {steps!r}") from None
    return _storage_positions(Shape.from_config(config), prompt_len, steps)


def kv_widths(s: Shape) -> tuple[int, int, int]:
    """``(heads, k_dim, v_dim)`` of one layer's cached K and V per position: ``(kv_heads, head_dim,
    head_dim)``, or with MLA the single-head latents ``(1, kv_lora_rank, rope_dim)``."""
    if s.mla:
        return 1, s.mla.kv_lora_rank, s.mla.rope_dim
    return s.kv_heads, s.head_dim, s.head_dim


def _position_bytes(s: Shape, b: float) -> float:
    heads, k, v = kv_widths(s)
    return heads * (k + v) * b


def kv_position_bytes(config, kv_dtype="bf16") -> float:
    """Bytes of one position's K and V in one layer for batch 1 (16-bit or fp32 plain formats):
    ``2 · kv_heads · head_dim · b``, or ``(kv_lora_rank + qk_rope_head_dim) · b`` with multi-head
    latent attention (DeepSeek-V2, arXiv:2405.04434 §2.1.2)."""
    return _position_bytes(Shape.from_config(config), dtype_bytes(kv_dtype))


# --------------------------------------------------------------------------- transients of one block
def eager_score_bytes(act_dtype="bf16", device: str = "cuda") -> float:
    """Bytes per element of the ``batch × heads × q × k`` score matrix at eager attention's widest point.

    transformers' ``eager_attention_forward`` computes ``softmax(q·kᵀ·s + mask, dtype=float32).to(dtype)``.
    ATen's ``softmax(x, dtype=float32)`` fuses the up-cast only for fp16 on CUDA (``half_to_float``);
    otherwise it first copies ``x`` to fp32 and then writes a new fp32 result (``SoftMax.cpp``). So at
    the softmax, live at once: the ``b``-byte scores + the fp32 copy + the fp32 output = ``b + 8``
    (bf16 anywhere, fp16 on a CPU); fused fp16 on CUDA: ``b + 4``, then ``b`` more for ``.to(dtype)``
    = 8; fp32: input and output only = 8. (Measured on CPU by :mod:`helpers.host_alloc`:
    tests/test_budget_measured.py.)"""
    b = dtype_bytes(act_dtype)
    if device not in DEVICES:
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if b == 4:
        return 8.0
    if b == 2 and device == "cuda" and _is_fp16(act_dtype):
        return 8.0
    return b + 8.0


def _score_bytes(s: Shape, act_dtype, device: str) -> float:
    copies = EAGER_SOFTMAX_COPIES.get(s.model_type)
    return copies * dtype_bytes(act_dtype) if copies else eager_score_bytes(act_dtype, device)


def moe_transients(s: Shape, lay: Layout, n: int, b: float) -> float:
    """A mixture-of-experts block at its widest over ``n`` tokens, ``k`` experts per token of width
    ``I``. Through transformers' ``grouped_mm`` experts, the larger of two stages:

    * up: the normed input ``h``, the ``k·h`` gathered token copies and the ``k·2I`` gate|up
      projection twice over (``masked_fill`` writes a new copy) — ``h + k·h + 4·k·I`` elements per
      token — plus the shared expert's ``h``-wide output where there is one (Qwen-MoE, DeepSeek);
      experts with biases (GPT-OSS) also hold each token's gathered gate|up biases ``k·2I``, and
      GPT-OSS's own gate (``_apply_gate``: clamped gate and up, ``up + 1``, the GLU, their product)
      ``3·k·I`` more than ``act(gate) · up``;
    * down: the input and shared ``h``, the gathered copies and the down projection's ``k·h`` (each
      ``b`` bytes; the gathered down biases ``k·h`` more), then the output weighted by the routing
      weights and its copy put back in token order — ``k·h`` each, in the routing weights' dtype
      (:data:`ROUTING_IN_FP32`).

    Experts that run outside those kernels (Llama-4's ``Llama4TextExperts``: every token through every
    one of ``E`` experts, ``hidden.repeat(E, 1)`` then weighted) hold per token the input ``h`` plus
    ``E·(h + 4I)`` at the product ``up · act(gate)`` (the weighted copies, gate|up, the activation,
    the product; read from ``Llama4TextMoe.forward``).

    Measured on CPU (:mod:`helpers.host_alloc`) for Mixtral, Qwen2-MoE and DeepSeek-V2 shapes; at
    DeepSeek-V2-Lite's real widths the down stage is the peak (tests/test_budget_measured.py)."""
    m = s.moe
    if m is None:
        return 0
    k, h, width = s.experts_per_token(), s.hidden, m.width
    shared = h if (m.shared_width or lay.shared_expert) else 0
    if not lay.experts_kernel:
        return n * (h + m.experts * (h + 4 * width)) * b
    w = 4 if m.fp32_routing else b       # bytes of a routing weight
    up = (h + k * h + (4 + (2 if lay.expert_bias else 0) + (3 if lay.custom_gate else 0)) * k * width + shared) * b
    down = (h + shared) * b + k * h * (3 if lay.expert_bias else 2) * b + k * h * 2 * w
    return n * max(up, down)


def _decode_gather(s: Shape, lay: Layout, batch: int, b: float) -> float:
    m = s.moe
    if m is None or not lay.experts_kernel:
        return 0
    return batch * s.experts_per_token() * (3 * m.width * s.hidden + s.hidden + 3 * m.width) * b


def moe_decode_gather_bytes(config, batch: int = 1, act_dtype="bf16") -> float:
    """Transient bytes of one mixture-of-experts layer in a GPU decode step. On a non-CPU device
    ``generate`` switches the experts from ``grouped_mm`` to ``batched_mm`` for the decoding stage
    (transformers ``GenerationMixin._optimize_model_for_decode``: "trade off a bit of memory (by
    duplicating selected experts weights) for much better speed"), which *gathers* every selected
    expert's weights per token: with ``k`` experts per token of width ``I`` over ``h``, the gate|up
    copy ``k·2I·h`` is still bound while the down copy ``k·I·h`` is made, so per token
    ``k·(3·I·h + h + 3·I)`` elements (the weights, the gathered input, the projections). 0 for a
    dense model and for experts outside transformers' experts kernels (Llama-4). About 99 MiB per
    sequence for DeepSeek-V2-Lite in bf16 — at batch 16 more than its whole KV cache at 512 tokens."""
    batch = positive_int(batch, "batch")
    s = Shape.from_config(config)
    if s.moe is None:
        return 0
    return _decode_gather(s, Layout.from_config(config), batch, dtype_bytes(act_dtype))


def block_transients(s: Shape, lay: Layout, positions: int, batch: int, act_dtype, attention: str,
                     device: str) -> dict:
    """The transient bytes of one decoder block over ``positions`` tokens (``n = batch · positions``,
    ``b`` bytes per element), as ``{"residual", "mlp", "attention"}``:

    * residual: hidden-size tensors ``3·n·hidden·b`` alive across the block (the embeddings, still
      referenced by the model's forward; the block's input, held by the caller's loop; the residual
      sum) and the rotary ``cos``/``sin`` ``2·n·rope_dim·b`` shared by all layers;
    * MLP: ``n·(3·I + h)·b`` (gate, up, their product, the normed input — none in a post-norm layer,
      OLMo-2, whose MLP reads the residual sum itself; ``4·I`` where gate and up come out of one fused
      projection, Phi-3; ``2·I`` ungated), or the experts' stage
      (:func:`moe_transients`), whichever is larger;
    * attention: SDPA (fused kernels never hold the scores) ``n·(2·H + 2·K)·d·b`` (q, k, v, output),
      plus the rotated q, k beside a fused ``qkv_proj``'s output, plus the fp32 rotation of
      :data:`ROTARY_IN_FP32` (``n·(4·H + K)·d·4`` at ``rotate_half(q)·sin``, before the attention's
      output or scores exist); MLA as transformers computes it;
      eager at its softmax: q, k, v, K and V repeated to every query head when ``K < H``
      (``repeat_kv``: ``2·n·H·d·b``), the scores ``batch·H·positions²`` × :func:`eager_score_bytes`
      (:data:`EAGER_SOFTMAX_COPIES` for the models whose softmax stays in their dtype);
      and, alive beside the MLP too, the additive masks the model built once for the whole forward
      (``batch·positions²·b`` per kind of layer: full, sliding, chunked) and the layer's returned
      attention weights (``batch·H·positions²·b``, bound to ``_`` until the layer returns)."""
    b = dtype_bytes(act_dtype)
    n = batch * positions
    rope_dim = s.mla.rope_dim if s.mla else s.head_dim
    residual = 3 * n * s.hidden * b + 2 * n * rope_dim * b
    width = (4 if lay.fused_gate_up else 3 if lay.gated_mlp else 2) * s.intermediate
    mlp = max(n * (width + (s.hidden if lay.pre_norm else 0)) * b if s.has_dense_mlp else 0,
              moe_transients(s, lay, n, b))
    if s.mla:
        a = s.mla
        qk_dim = a.nope_dim + a.rope_dim
        # per token: q_proj's output (its q_nope view keeps it), the rotated q_pe, the query cat; the
        # latent (r + rope) and its normed copy r, the rotated k_pe; kv_b_proj's per-head output
        # (k_nope, v are views of it) and the key tensor
        qkv = n * (s.heads * qk_dim + s.heads * a.rope_dim + s.heads * qk_dim + (a.kv_lora_rank + a.rope_dim)
                   + a.kv_lora_rank + a.rope_dim + s.heads * (a.nope_dim + a.v_dim) + s.heads * qk_dim) * b
        out, qk, repeated, rotation = n * s.heads * a.v_dim * b, 0, 0, 0
    else:
        qkv = n * (s.heads + 2 * s.kv_heads) * s.head_dim * b
        qk = qkv - n * s.kv_heads * s.head_dim * b if lay.fused_qkv else 0
        out = n * s.heads * s.head_dim * b
        repeated = 2 * n * s.heads * s.head_dim * b if s.kv_heads < s.heads else 0
        # q.float(), k.float(), then q·cos, rotate_half(q), rotate_half(q)·sin: before the attention itself
        rotation = n * ((s.heads + s.kv_heads) + 3 * s.heads) * s.head_dim * 4 if s.model_type in ROTARY_IN_FP32 else 0
    if attention == "sdpa":
        attn = qkv + qk + max(out, rotation)
    else:
        kinds = {c.kind for c in s.check_caches() if c.kind != "none"} or {"full"}
        residual += len(kinds) * batch * positions**2 * b
        mlp += batch * s.heads * positions**2 * b
        scores = batch * s.heads * positions**2 * _score_bytes(s, act_dtype, device)
        attn = max(qkv + rotation, qkv + qk + repeated + scores)
    return {"residual": residual, "mlp": mlp, "attention": attn}


# --------------------------------------------------------------------------- the allocator replay
def weight_ops(config, dtype=torch.bfloat16) -> list:
    """The allocations instantiating the model makes: every parameter and buffer of a meta-device
    model, in creation order, as allocator-simulator ops (``["alloc", name, bytes]``)."""
    model = meta_model(config, dtype)
    return [["alloc", name, t.numel() * t.element_size()]
            for name, t in list(model.named_parameters()) + list(model.named_buffers())]


def weight_allocation(config, dtype=torch.bfloat16) -> int:
    """Predicted ``memory_allocated`` after instantiating the model on a GPU: every parameter and
    buffer (from a meta-device model, in creation order) replayed through the caching-allocator
    simulator, which adds the block rounding the real allocator applies (a block whose remainder
    would be ≤ 1 MiB is handed out whole)."""
    return simulate(weight_ops(config, dtype))["allocated"]


def generation_ops(config, prompt_len: int, new_tokens: int, batch: int = 1, attention: str = "sdpa",
                   dtype=torch.bfloat16) -> list:
    """The allocations of one ``generate`` call with a dynamic cache, as allocator-simulator ops: the
    weights (:func:`weight_ops`), then the prefill layer by layer — the attention transients
    (eager: the score matrix's copies in the order ``eager_attention_forward`` makes them: q·kᵀ, ×
    scaling, + mask, the fp32 copy and the fp32 softmax, the ``.to(dtype)`` weights kept while the MLP
    runs), the layer's K and V (kept by the cache), the MLP transients — then every decode step's
    ``torch.cat`` of each layer's K and V one position longer (a new block, the old one freed). The
    sizes come from :func:`block_transients` and the KV storage; what the simulator adds is the
    *order*, hence which blocks the caching allocator can reuse and which make it reserve more."""
    prompt_len, new_tokens = positive_int(prompt_len, "prompt_len"), positive_int(new_tokens, "new_tokens")
    batch, attention = positive_int(batch, "batch"), choice(attention, "attention", ATTENTIONS)
    dtype = parse_dtype(dtype)
    s = Shape.from_config(config)
    model = meta_model(config, dtype)
    lay = Layout.from_model(model, s)
    b = int(dtype_bytes(dtype))
    act = block_transients(s, lay, prompt_len, batch, dtype, attention, "cuda")
    logits = batch * s.vocab * (b + 4)
    per_pos = _position_bytes(s, b) * batch / 2                          # K (or V) bytes per position
    pos0 = _storage_positions(s, prompt_len, 0)                            # the prefill's storage
    ops = [["alloc", name, t.numel() * t.element_size()]
           for name, t in list(model.named_parameters()) + list(model.named_buffers())]
    ops.append(["alloc", "residual", int(act["residual"])])
    S = batch * s.heads * prompt_len**2                                    # eager's score elements
    for l in range(s.layers):
        if attention == "eager":
            rest = int(act["attention"] - S * _score_bytes(s, dtype, "cuda"))
            ops += [["alloc", f"qkv{l}", rest],
                    ["alloc", f"qk{l}", S * b], ["alloc", f"scaled{l}", S * b], ["free", f"qk{l}"],
                    ["alloc", f"masked{l}", S * b], ["free", f"scaled{l}"],
                    ["alloc", f"fp32{l}", S * 4], ["alloc", f"softmax{l}", S * 4], ["free", f"fp32{l}"],
                    ["free", f"masked{l}"], ["alloc", f"weights{l}", S * b], ["free", f"softmax{l}"],
                    ["free", f"qkv{l}"]]
            mlp = int(act["mlp"] - S * b)
        else:
            ops += [["alloc", f"qkv{l}", int(act["attention"])], ["free", f"qkv{l}"]]
            mlp = int(act["mlp"])
        if pos0[l]:               # a layer reading another layer's cache stores nothing
            ops += [["alloc", f"K{l}_0", int(per_pos * pos0[l])], ["alloc", f"V{l}_0", int(per_pos * pos0[l])]]
        ops += [["alloc", f"mlp{l}", mlp], ["free", f"mlp{l}"]]
        if attention == "eager":
            ops.append(["free", f"weights{l}"])
    ops += [["alloc", "logits", int(logits)], ["free", "logits"], ["free", "residual"]]
    gather = int(_decode_gather(s, lay, batch, b))
    for t in range(1, new_tokens):        # the last generated token is never fed back
        pos = _storage_positions(s, prompt_len, t)
        if gather:             # batched_mm's gathered expert weights: gate|up, then down while gate|up is bound
            up = gather * 2 // 3
            ops += [["alloc", f"moe_up{t}", up], ["alloc", f"moe_down{t}", gather - up],
                    ["free", f"moe_up{t}"], ["free", f"moe_down{t}"]]
        for l in (l for l in range(s.layers) if pos[l]):
            for kv in "KV":
                ops += [["alloc", f"{kv}{l}_{t}", int(per_pos * pos[l])], ["free", f"{kv}{l}_{t - 1}"]]
    return ops


def device_footprint(config, prompt_len: int, new_tokens: int, batch: int = 1, non_torch_bytes: int = 0,
                     attention: str = "sdpa", dtype=torch.bfloat16, workspace_bytes: int = 0) -> dict:
    """What ``nvidia-smi`` should show for the process after ``generate``: the memory outside PyTorch's
    allocator (CUDA context, loaded kernels, library handles: ``non_torch_bytes``, measured once per
    process after a warm-up, :func:`helpers.measure.non_torch_bytes` — vLLM's "non-torch memory")
    plus the allocator's *reserved* memory: the cuBLAS/cuBLASLt workspaces the first matmuls took
    through the allocator (``workspace_bytes``, :func:`helpers.measure.warmup_cublas`; tens of MiB,
    most of the gap on a small model) and the replay of :func:`generation_ops` through the allocator
    simulator (the weights, the prefill's blocks, the KV cache growing by ``torch.cat``).
    Checked by ``benchmarks/budget_accuracy.py`` (``smi_pred`` vs ``smi_meas``)."""
    for name, v in (("non_torch_bytes", non_torch_bytes), ("workspace_bytes", workspace_bytes)):
        try:
            non_negative_int(v, name)
        except ValueError:
            raise ValueError(f"{name} must be bytes ≥ 0 (measured by helpers.measure."
                             f"{'non_torch_bytes' if name == 'non_torch_bytes' else 'warmup_cublas'}), "
                             f"got {v!r}") from None
    non_torch_bytes, workspace_bytes = int(non_torch_bytes), int(workspace_bytes)
    reserved = workspace_bytes + simulate(generation_ops(config, prompt_len, new_tokens, batch, attention, dtype))["reserved"]
    return {"non_torch": non_torch_bytes, "reserved": reserved, "total": non_torch_bytes + reserved}
