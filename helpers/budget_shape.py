"""The description of a decoder the memory budget reads once from its config.

:class:`Shape` holds the sizes from the config's fields, one :class:`LayerCache` per layer from
``layer_types`` (full, sliding, chunked attention, or no cache), and :class:`MoE` / :class:`MLA`
when the config has experts or latent attention. Sources: transformers 5.17
(``cache_utils.get_layer_types_and_kwargs``, ``DynamicSlidingWindowLayer``; the routers of
``modeling_mixtral.py`` / ``modeling_deepseek_v2.py``); DeepSeek-V2 (arXiv:2405.04434 §2.1) for MLA.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    them. ``intermediate`` is the dense MLP's width (Llama-4: ``intermediate_size_mlp``);
    ``rope_tables`` the rotary ``cos``/``sin`` pairs a forward computes, one per layer type when the
    config's ``rope_parameters`` are keyed by layer type (Gemma-3's local and global bases)."""
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
    rope_tables: int = 1

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
        rope = getattr(config, "rope_parameters", None)
        per_type = isinstance(rope, dict) and set(rope) <= set(LAYER_TYPES) and all(isinstance(v, dict) for v in rope.values())
        # one table per layer type present (Gemma-3: ``for layer_type in set(config.layer_types)``)
        tables = len(set(getattr(config, "layer_types", None) or rope)) if per_type and rope else 1
        return cls(layers, *sizes, bool(getattr(config, "tie_word_embeddings", False)), layer_caches(config),
                   MoE.from_config(config, layers), MLA.from_config(config), getattr(config, "model_type", "") or "",
                   tables)

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
