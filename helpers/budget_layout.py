"""What the modeling code builds around a config's sizes, and the parameters it implies.

:func:`meta_model` builds the transformers causal LM on the meta device (every parameter's shape, no
memory: what ``accelerate estimate-memory`` counts); :class:`Layout` reads from it what the lesson's
Llama layout leaves out (extra norms, biases, fused projections, attention sinks, experts) together
with the exact parameter count by part (:func:`parameter_parts`); :func:`attention_params`,
:func:`mlp_params` and :func:`norm_params` are the per-layer formulas over a :class:`Shape` and its
:class:`Layout`. Sources: the module names transformers 5.17's decoders share (``q_proj``,
``qkv_proj``, ``gate_up_proj``, ``sinks``, ``experts``, ...); DeepSeek-V2 (arXiv:2405.04434 §2.1)
for MLA's projections.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from .budget_shape import Shape
from .models import parse_dtype, quiet_torchao_import


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
