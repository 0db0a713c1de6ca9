import pytest
import torch
from transformers import AutoConfig, LlamaConfig

from helpers import budget as B
from helpers import models
from helpers.budget_activations import eager_score_bytes, moe_decode_gather_bytes
from helpers.budget_kv import kv_position_bytes, kv_positions, kv_storage_positions, kv_tensor_bytes, layer_windows
from helpers.budget_layout import Layout
from helpers.budget_replay import device_footprint, eager_ops, generation_ops, weight_allocation, weight_ops
from helpers.budget_shape import MLA, LayerCache, MoE, Shape

GiB = 2**30


def test_70b_kv_example():
    c = models.architecture_config("Llama-2-70B")
    assert B.kv_bytes(c, 4096, 16, "fp16") == 20 * GiB
    assert B.kv_bytes(c, 8192, 16, "fp16") == 40 * GiB


def test_gqa_and_mqa_by_hand():
    gqa = LlamaConfig(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=100)
    assert B.kv_bytes(gqa, 10, 3, "bf16") == 2 * 2 * 2 * 32 * 10 * 3 * 2
    mqa = LlamaConfig(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                      num_key_value_heads=1, vocab_size=100)
    assert B.kv_bytes(mqa, 10, 3, "fp8") == 2 * 2 * 1 * 32 * 10 * 3 * 1 + 2 * 2 * 1 * 4   # codes + fp32 scales


@pytest.mark.parametrize("name", sorted(set(models.ARCHITECTURES) - {"Llama-2-70B", "Llama-3-70B"}))
def test_param_counts_match_meta_models(name):
    """Every full-size architecture the course builds (from tied Llamas to mixtures of experts and latent
    attention), counted from its config, equals the real transformers model built on the meta device."""
    c = models.architecture_config(name)
    assert B.param_counts(c)["total"] == B.meta_param_count(c)


def test_weight_formats():
    c = models.architecture_config("SmolLM2-135M")
    assert B.weight_bytes(c, "bf16") == 134_515_008 * 2
    assert B.format_bits("int4") == pytest.approx(4 + 20 / 128)
    assert B.weight_bytes(c, "int4") < B.weight_bytes(c, "int8") < B.weight_bytes(c, "bf16")


def test_weight_allocation_adds_allocator_rounding():
    c = models.architecture_config("Qwen2.5-0.5B")
    extra = weight_allocation(c) - B.weight_bytes(c, "bf16")
    assert extra == 8_256_512 + 256  # measured on an H200: 8,256,768 B above the formula


def test_activation_terms():
    c = models.architecture_config("SmolLM2-135M")
    a = B.activation_bytes(c, 100, 2, keep_all_logits=True)
    assert a["logits"] == 2 * 100 * 49152 * 6
    e = B.activation_bytes(c, 100, 2, attention="eager")
    n, heads, hd = 200, 9, 64
    repeated_kv, scores, mask = 2 * n * heads * hd * 2, 2 * heads * 100**2 * 10, 2 * 100**2 * 2
    sdpa_output = n * heads * hd * 2       # SDPA's output is counted; eager peaks before its output exists
    assert e["attention"] - a["attention"] == repeated_kv + scores - sdpa_output
    assert e["residual"] - a["residual"] == mask                            # alive through the forward
    assert e["mlp"] - a["mlp"] == 2 * heads * 100**2 * 2                    # the kept attention weights


def test_generation_peak_kv_lengths():
    c = models.architecture_config("SmolLM2-135M")
    dyn = B.generation_peak(c, 64, 8, 2)
    st = B.generation_peak(c, 64, 8, 2, cache="static")
    assert dyn["kv"] == B.kv_bytes(c, 71, 2) and st["kv"] == B.kv_bytes(c, 72, 2)


def test_budget_parts_are_the_formulas():
    """Each part of budget() is the formula it names, computed independently here."""
    c = models.architecture_config("SmolLM2-135M")
    b = B.budget(c, "bf16", 1024, 4, overhead=1e9, new_tokens=8)
    assert b["weights"] == B.weight_bytes(c, "bf16")
    assert b["kv_cache"] == 2 * 30 * 3 * 64 * (1024 + 8 - 1) * 4 * 2       # layers·kv_heads·head_dim·tokens·batch·2 B
    gen = B.generation_peak(c, 1024, 8, 4)
    assert b["activations"] == gen["peak"] - gen["kv"] and b["overhead"] == 1e9
    # weight-only int4 keeps a 16-bit KV cache (the KV dtype is not the weight format)
    assert B.budget(c, "int4", 1024, 4)["kv_cache"] == B.budget(c, "bf16", 1024, 4)["kv_cache"]
    assert B.budget(c, "int4", 1024, 4, kv_dtype="fp8")["kv_cache"] < b["kv_cache"]


def test_bad_inputs():
    c = models.architecture_config("SmolLM2-135M")
    with pytest.raises(ValueError, match="seq_len must be a positive"):
        B.kv_bytes(c, 0)
    with pytest.raises(ValueError, match="unknown dtype"):
        B.kv_bytes(c, 10, 1, "fp7")
    with pytest.raises(ValueError, match="unknown weight format"):
        B.weight_bytes(c, "int5")
    from types import SimpleNamespace
    bad = SimpleNamespace(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=10)
    with pytest.raises(ValueError, match="config lacks"):
        B.kv_bytes(bad, 10)


def test_fits_table_has_every_gpu():
    rows = B.fits_table(models.architecture_config("Llama-2-70B"), 4096, 16)
    assert [r["format"] for r in rows] == ["fp16", "int8", "int4"]
    assert rows[0]["H200"] == "no" and rows[2]["A100-80GB"] == "yes" and rows[2]["T4"] == "no"


def test_decode_counts_generates_carried_fp32_logits():
    from helpers import budget as B
    from helpers.models import architecture_config

    cfg = architecture_config("Qwen2.5-0.5B")
    g = B.generation_peak(cfg, 512, 32, 16)
    s = B.Shape.from_config(cfg)
    kv_full = B.kv_bytes(cfg, 512 + 32 - 1, 16)
    one = B.activation_bytes(cfg, 1, 16)
    # the step's widest phase: the attention beside one layer's torch.cat, the MLP, or the logits
    phase = one["residual"] + max(one["attention"] + kv_full / s.layers / 2, one["mlp"], one["logits"])
    assert g["decode"] - kv_full - phase == 16 * cfg.vocab_size * 4


def test_eager_decode_counts_repeat_kv_of_the_whole_cache():
    # transformers' eager attention repeats K and V to every query head at each decode step: on a GQA
    # model (Qwen2.5-0.5B: 14 heads, 2 KV heads) at a long context that outgrows the rest of the step
    from helpers import budget as B
    from helpers.models import architecture_config

    cfg = architecture_config("Qwen2.5-0.5B")
    s = B.Shape.from_config(cfg)
    sdpa, eager = (B.generation_peak(cfg, 8192, 32, 1, attention=a)["decode"] for a in ("sdpa", "eager"))
    repeated = 2 * s.heads * (8192 + 31) * s.head_dim * 2
    one = B.activation_bytes(cfg, 1, 1, cached=True)
    kv_full = B.kv_bytes(cfg, 8192 + 31, 1)
    assert eager == kv_full + 1 * cfg.vocab_size * 4 + one["residual"] + one["attention"] + repeated
    assert eager > sdpa
    # no repeat without grouped heads (MHA: TinyLlama has 32/4 — use a config with kv_heads == heads)
    mha = architecture_config("Qwen2.5-0.5B")
    mha.num_key_value_heads = mha.num_attention_heads
    assert B.generation_peak(mha, 8192, 32, 1, attention="eager")["decode"] == B.generation_peak(mha, 8192, 32, 1)["decode"]


def test_one_kv_head_repeats_as_a_view_and_matmul_copies_one_operand_at_a_time():
    """With one KV head (Gemma-3-1B) repeat_kv's expand + reshape is a zero-stride view of the cache;
    each matmul copies its operand, so eager holds one repeated tensor at a time, not K's and V's."""
    from transformers.models.gemma3.modeling_gemma3 import repeat_kv

    from helpers.budget_activations import repeat_kv_bytes
    for kv, copies in ((1, 1), (2, 2)):
        x = torch.randn(2, kv, 16, 8)
        assert (repeat_kv(x, 8 // kv).data_ptr() == x.data_ptr()) == (kv == 1)
        cfg = AutoConfig.for_model("gemma3_text", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=kv, head_dim=8, vocab_size=100)
        assert repeat_kv_bytes(Shape.from_config(cfg), 10, 2) == copies * 10 * 8 * 8 * 2


@pytest.mark.parametrize("kind,fmt", [("baseline", "fp32"), ("fp8-e4m3", "fp8"), ("int4", "int4")])
@pytest.mark.parametrize("decode_steps", [0, 5, 16, 21])
def test_kv_bytes_equal_the_real_caches(kind, fmt, decode_steps):
    """budget.kv_bytes, scales, minimums and the int4 residual included, equals what the course's
    caches store after a prefill and decode steps (fp32 model on CPU: baseline stores fp32)."""
    from helpers import kvcache
    from helpers.models import model_from_config

    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    model = model_from_config(cfg, dtype=torch.float32)
    ids = torch.randint(3, 120, (2, 24), generator=torch.Generator().manual_seed(0))
    cache = kvcache.make_cache(kind, model.config)
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        for _ in range(decode_steps):
            nxt = model(nxt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    tokens = 24 + decode_steps
    layout = B.KVLayout(residual_dtype=torch.float32)       # the cache's defaults; the model's dtype
    assert B.kv_bytes(cfg, tokens, 2, fmt, layout, decode_steps) == kvcache.stored_bytes(cache)


@pytest.mark.parametrize("residual_length", [0, 1, 2, 5])
def test_int4_residual_follows_the_cache_for_any_residual_length(residual_length):
    """KVLayout.residual_tokens is the residual transformers' QuantizedLayer holds step by step, short
    residual lengths included (0 and 1 still alternate: the step after a re-quantization appends)."""
    from helpers import kvcache
    from helpers.models import model_from_config

    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    model = model_from_config(cfg, dtype=torch.float32)
    layout = B.KVLayout(group_size=16, residual_length=residual_length, residual_dtype="fp32")
    cache = kvcache.make_cache("int4", model.config, q_group_size=16, residual_length=residual_length)
    nxt = torch.randint(3, 60, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for step in range(8):
            nxt = model(nxt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            assert B.kv_bytes(cfg, 8 + step, 1, "int4", layout, step) == kvcache.stored_bytes(cache), step


TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, pad_token_id=0, eos_token_id=1, bos_token_id=1)
FAMILY_CASES = {
    "llama": ("llama", {}), "llama+biases": ("llama", dict(attention_bias=True, mlp_bias=True)),
    "mistral (sliding)": ("mistral", dict(sliding_window=8)), "qwen2": ("qwen2", {}),
    "qwen2 (max_window_layers)": ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=2)),
    "qwen3 (q/k norms)": ("qwen3", dict(head_dim=16)), "phi3 (fused qkv)": ("phi3", {}),
    "gemma": ("gemma", dict(head_dim=16)), "gemma2 (4 norms, local/global)": ("gemma2", dict(head_dim=16, sliding_window=8)),
    "gemma3": ("gemma3_text", dict(head_dim=16, sliding_window=8)),
    "mixtral (MoE)": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe (shared expert, sparse step)": ("qwen2_moe", dict(num_experts=4, moe_intermediate_size=24,
                                                               shared_expert_intermediate_size=40, num_experts_per_tok=2,
                                                               decoder_sparse_step=2)),
    "qwen3_moe": ("qwen3_moe", dict(num_experts=4, moe_intermediate_size=24, num_experts_per_tok=2, head_dim=16)),
    "deepseek_v2 (MLA)": ("deepseek_v2", dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                              v_head_dim=12, n_routed_experts=4, n_shared_experts=1,
                                              moe_intermediate_size=24, first_k_dense_replace=1, num_experts_per_tok=2)),
    "deepseek_v2 (q LoRA)": ("deepseek_v2", dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=20, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                                 v_head_dim=12, n_routed_experts=4, n_shared_experts=2,
                                                 moe_intermediate_size=24, first_k_dense_replace=2, num_experts_per_tok=2)),
    # the families people bring today, and decoders the course never listed: read from their configs
    "gemma3 (5:1 local/global)": ("gemma3_text", dict(head_dim=16, sliding_window=8, sliding_window_pattern=6,
                                                      num_hidden_layers=12)),
    "olmo2 (post-norms, full-width q/k norms)": ("olmo2", {}),
    "smollm3 (NoPE layers)": ("smollm3", dict(no_rope_layer_interval=2)),
    "qwen3_moe (a dense layer)": ("qwen3_moe", dict(num_experts=8, moe_intermediate_size=24, num_experts_per_tok=2,
                                                    head_dim=16, mlp_only_layers=[0])),
    "gpt_oss (sliding + sinks + MoE)": ("gpt_oss", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                                        sliding_window=8)),
    "llama4_text (chunked attention, MoE)": ("llama4_text", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=1,
                                                                 attention_chunk_size=8, intermediate_size_mlp=128)),
    "cohere2 (parallel block, 3:1 sliding)": ("cohere2", dict(sliding_window=8, sliding_window_pattern=4)),
    "granite (μP multipliers)": ("granite", {}),
    "olmo": ("olmo", {}), "olmoe": ("olmoe", dict(num_experts=4, num_experts_per_tok=2)),
    "granitemoe": ("granitemoe", dict(num_local_experts=4, num_experts_per_tok=2)),
    "cohere": ("cohere", {}), "helium": ("helium", dict(head_dim=16)), "glm4 (fused gate|up, 4 norms)": ("glm4", {}),
    "exaone4 (post-norms, 3:1 sliding)": ("exaone4", dict(sliding_window=8)),
    "ministral": ("ministral", dict(head_dim=16, sliding_window=8)), "seed_oss (q/k/v biases)": ("seed_oss", {}),
    "stablelm (LayerNorm biases)": ("stablelm", {}), "nemotron (ungated MLP)": ("nemotron", {}),
    "phimoe": ("phimoe", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
    "hunyuan_v1_dense": ("hunyuan_v1_dense", dict(head_dim=16)), "vaultgemma": ("vaultgemma", dict(head_dim=16, sliding_window=8)),
    "deepseek_v3 (MLA, q LoRA)": ("deepseek_v3", dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=20,
                                                      qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12,
                                                      n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=24,
                                                      first_k_dense_replace=1, num_experts_per_tok=2)),
    "minicpm3 (MLA, dense)": ("minicpm3", dict(kv_lora_rank=16, q_lora_rank=12, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                               v_head_dim=12)),
}
NEW_FAMILIES = ["gemma3 (5:1 local/global)", "olmo2 (post-norms, full-width q/k norms)", "smollm3 (NoPE layers)",
                "qwen3_moe (a dense layer)", "gpt_oss (sliding + sinks + MoE)", "llama4_text (chunked attention, MoE)",
                "cohere2 (parallel block, 3:1 sliding)", "granite (μP multipliers)", "exaone4 (post-norms, 3:1 sliding)"]


def family_config(name):
    from transformers import AutoConfig

    mt, kw = FAMILY_CASES[name]
    return AutoConfig.for_model(mt, **{**TINY, **kw})


def test_the_cases_cover_twenty_model_types():
    assert len({mt for mt, _ in FAMILY_CASES.values()}) >= 20


@pytest.mark.parametrize("name", list(FAMILY_CASES))
def test_param_counts_equal_the_meta_model(name):
    """Every family's count (extra norms, q/k norms, biases, sinks, experts, MLA factors), part by part,
    against the real transformers class built on the meta device; the bytes use the meta count."""
    cfg = family_config(name)
    check = B.param_check(cfg)
    assert check["matches"] and check["note"] is None, check["note"]
    assert B.param_counts(cfg) == B.meta_param_counts(cfg)
    assert B.weight_bytes(cfg, "bf16") == 2 * B.meta_param_count(cfg)


def test_a_layout_the_formula_misses_is_said_and_the_bytes_stay_exact():
    """StarCoder2 names its MLP c_fc/c_proj, so the layout reader does not see their biases: the
    mismatch is returned, naming the part and the count, and the weight bytes come from the meta model."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("starcoder2", **{**TINY, "head_dim": 16})
    check = B.param_check(cfg)
    assert not check["matches"] and check["difference"]["linears"] == 4 * (96 + 64)     # c_fc's and c_proj's biases
    assert "'starcoder2'" in check["note"] and "linears +640" in check["note"]
    assert B.weight_bytes(cfg, "bf16") == 2 * B.meta_param_count(cfg)


def test_a_decoder_without_llama_fields_gets_exact_weights_and_a_clear_refusal_of_the_formula():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=4)
    with pytest.raises(ValueError, match="does not know model_type 'gpt2'.*intermediate_size.*meta_param_counts"):
        B.param_counts(cfg)
    meta = B.meta_param_counts(cfg)          # GPT-2's Conv1D projections are its linears, wte/wpe its embeddings
    assert meta["total"] == B.meta_param_count(cfg) and meta["embed"] == (cfg.vocab_size + cfg.n_positions) * 64
    assert B.weight_bytes(cfg, "fp32") == 4 * meta["total"]


def test_an_unknown_to_the_course_model_type_is_predicted_not_refused():
    """EXAONE-4 is in no table of the course: parameters, KV and the generation peak come from its
    config (3:1 sliding/full layers, post-norms, q/k norms) like any family's."""
    cfg = family_config("exaone4 (post-norms, 3:1 sliding)")
    assert cfg.model_type not in {a["model_type"] for a in models.ARCHITECTURES.values()}
    b = B.budget(cfg, "int4", 64, 2, new_tokens=4)
    assert all(v > 0 for k, v in b.items() if k != "overhead")
    assert B.param_check(cfg)["matches"]
    assert [c.kind for c in Shape.from_config(cfg).caches] == ["sliding", "sliding", "sliding", "full"]
    # K+V · kv_heads · head_dim · batch · positions (3 sliding layers keep window − 1, the full one 64 + 4 − 1) · 2 B
    assert b["kv_cache"] == 2 * 2 * 16 * 2 * (3 * 7 + 67) * 2


def test_typed_descriptions_of_experts_latents_and_layers():
    """The config read once: MoE and MLA as dataclasses, one LayerCache per layer."""
    s = Shape.from_config(models.architecture_config("Qwen3-30B-A3B"))
    assert s.moe == MoE(experts=128, per_token=8, width=768, shared_width=0, sparse_layers=frozenset(range(48)),
                          fp32_routing=False) and s.mla is None
    ds = Shape.from_config(models.architecture_config("DeepSeek-V2-Lite"))
    assert ds.mla == MLA(q_lora_rank=None, kv_lora_rank=512, rope_dim=64, nope_dim=128, v_dim=128)
    assert ds.moe.sparse_layers == frozenset(range(1, 27)) and ds.moe.shared_width == 2 * 1408 and ds.moe.fp32_routing
    oss = Shape.from_config(models.architecture_config("gpt-oss-20b"))
    assert oss.caches[:2] == (LayerCache("sliding", 128), LayerCache("full")) and len(oss.caches) == 24
    gemma3 = Shape.from_config(models.architecture_config("Gemma-3-1B"))
    assert [c.kind for c in gemma3.caches[:6]] == ["sliding"] * 5 + ["full"]
    llama4 = Shape.from_config(family_config("llama4_text (chunked attention, MoE)"))
    assert [c.kind for c in llama4.caches] == ["chunked"] * 3 + ["full"] and llama4.caches[0].window == 8
    assert llama4.intermediate == 128 and llama4.moe.width == 96           # intermediate_size_mlp vs the experts'
    lay = Layout.from_config(family_config("gpt_oss (sliding + sinks + MoE)"))
    assert lay.sinks and lay.qkv_bias and lay.o_bias and lay.expert_bias and lay.router_bias
    assert Layout.from_config(models.architecture_config("Phi-3-mini")).fused_qkv
    assert Layout.from_config(family_config("olmo2 (post-norms, full-width q/k norms)")).qk_norm == "full"


@pytest.mark.parametrize("name", list(FAMILY_CASES))
def test_layer_caches_follow_transformers(name):
    """One LayerCache per layer, as transformers' DynamicCache(config=...) builds its layers: full
    layers a DynamicLayer, sliding and chunked ones a DynamicSlidingWindowLayer of that window."""
    from transformers.cache_utils import DynamicCache

    cfg = family_config(name)
    layers = DynamicCache(config=cfg).layers
    caches = Shape.from_config(cfg).caches
    assert len(layers) == len(caches)
    assert [getattr(layer, "sliding_window", None) for layer in layers] == [c.window for c in caches]


def test_layers_without_a_cache_hold_no_kv():
    """Layers that read an earlier layer's cache (``num_kv_shared_layers``, Gemma-3n) get no cache layer
    in transformers' DynamicCache, and no KV bytes here."""
    from transformers.cache_utils import DynamicCache

    cfg = LlamaConfig(**{**TINY, "head_dim": 16})
    full = B.kv_bytes(cfg, 10, 1)
    cfg.num_kv_shared_layers = 1
    assert len(DynamicCache(config=cfg).layers) == 3 == Shape.from_config(cfg).cached_layers
    assert B.kv_bytes(cfg, 10, 1) == full * 3 / 4
    assert kv_storage_positions(cfg, 10) == [10, 10, 10, 0]


def test_layer_types_without_a_kv_cache_are_refused_by_name_but_weigh_exactly():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("qwen3_next", **{**TINY, "num_experts": 4, "num_experts_per_tok": 2,
                                                "moe_intermediate_size": 24, "shared_expert_intermediate_size": 24})
    with pytest.raises(ValueError, match="linear_attention.*qwen3_next"):
        B.kv_bytes(cfg, 10)
    assert B.weight_bytes(cfg, "bf16") == 2 * B.meta_param_count(cfg)


def test_mla_latents_are_refused_by_the_course_quantized_caches():
    with pytest.raises(ValueError, match="kv_lora_rank 512, qk_rope_head_dim 64"):
        B.kv_bytes(models.architecture_config("DeepSeek-V2-Lite"), 512, 1, "fp8")


@pytest.mark.parametrize("name", ["mistral (sliding)", "qwen2 (max_window_layers)", "gemma2 (4 norms, local/global)",
                                  "gemma3", "deepseek_v2 (MLA)", "llama", *NEW_FAMILIES])
@pytest.mark.parametrize("prompt,decode", [(20, 0), (20, 5), (5, 0), (5, 10)])
def test_kv_bytes_follow_windows_and_latents(name, prompt, decode):
    """budget.kv_bytes equals what transformers' DynamicCache stores, sliding windows (w − 1 kept) and
    DeepSeek-V2's compressed latents (kv_lora_rank + qk_rope_head_dim per position) included."""
    from transformers import AutoModelForCausalLM
    from transformers.cache_utils import DynamicCache

    from helpers import kvcache

    cfg = family_config(name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        nxt = model(torch.randint(3, 120, (2, prompt)), past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        for _ in range(decode):
            nxt = model(nxt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    assert B.kv_bytes(cfg, prompt + decode, 2, "fp32") == kvcache.stored_bytes(cache)


@pytest.mark.parametrize("name", ["mistral (sliding)", "gemma2 (4 norms, local/global)"])
def test_static_cache_allocates_the_window(name):
    from transformers import AutoModelForCausalLM
    from transformers.cache_utils import StaticCache

    from helpers import kvcache

    cfg = family_config(name)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    cache = StaticCache(config=cfg, max_cache_len=30)
    with torch.no_grad():
        model(torch.randint(3, 120, (2, 20)), past_key_values=cache, use_cache=True)
    assert B.kv_bytes(cfg, 30, 2, "fp32", cache="static") == kvcache.stored_bytes(cache)


def test_sliding_window_past_the_window_is_flat():
    """Mistral-style: past the window the KV stops growing (the +100 % error of the old formula)."""
    from transformers import MistralConfig

    cfg = MistralConfig()  # transformers' default: sliding_window=4096, 32 layers, 8 KV heads of 128
    assert B.kv_bytes(cfg, 8192, 2) == B.kv_bytes(cfg, 4095, 2) == 2 * 32 * 8 * 128 * 4095 * 2 * 2
    assert layer_windows(cfg) == [4096] * 32


def test_generation_ops_by_hand():
    """The op sequence of a generate: weights, the prefill layer by layer (transients freed, K and V
    kept), then one torch.cat per layer, K and V, and decode step; what stays allocated at the end is
    the weights and the final KV cache."""
    from helpers.allocator_sim import simulate
    c = models.architecture_config("SmolLM2-135M")
    for attention in ("sdpa", "eager"):
        ops = generation_ops(c, 256, 5, 2, attention)
        w = len(weight_ops(c))
        cats = [op for op in ops[w:] if op[0] == "alloc" and op[1].startswith(("K", "V"))]
        assert len(cats) == c.num_hidden_layers * 2 * 5            # prefill + 4 fed-back tokens
        end = simulate(ops)
        kv = B.kv_bytes(c, 256 + 4, 2)
        assert end["allocated"] == pytest.approx(weight_allocation(c) + kv, rel=1e-3)
        assert end["reserved"] >= end["allocated"]
    sdpa, eager = (device_footprint(c, 2048, 8, 4, 700 * 2**20, a) for a in ("sdpa", "eager"))
    assert eager["reserved"] > sdpa["reserved"] and sdpa["total"] == sdpa["reserved"] + 700 * 2**20


def test_eager_ops_follow_the_score_copies():
    """Eager attention's score-sized blocks, in order: q·kᵀ, ×scaling (q·kᵀ freed), +mask, fp32 copy,
    fp32 softmax, weights in the model dtype — 2, 2, 2, 4, 4, 2 bytes per score (bf16)."""
    c = models.architecture_config("SmolLM2-135M")
    ops = generation_ops(c, 128, 1, 1, "eager")
    S = 9 * 128 * 128
    sizes = [op[2] // S for op in ops if op[0] == "alloc" and op[1].endswith("0")
             and op[1][:-1] in ("qk", "scaled", "masked", "fp32", "softmax", "weights")]
    assert sizes == [2, 2, 2, 4, 4, 2]



def test_fused_gate_up_mlp_ops_are_one_double_block():
    """Phi-3's MLP (modeling_phi3.py Phi3MLP: gate_up_proj, chunk, up * act(gate)) as the replay makes
    it: after the norm, one 2·I block (gate_up), then act(gate) and the product (I each), down's output;
    the unfused MLP of a Llama-layout model (SmolLM2) is four I blocks. Both peak at the tensor-level
    MLP transient (block_transients) and leave nothing alive."""
    from helpers.budget_activations import block_transients
    from helpers.budget_shape import Shape
    n, b = 2 * 64, 2
    for arch, sizes in (("Phi-3-mini", [2, 1, 1]), ("SmolLM2-135M", [1, 1, 1, 1])):
        c = models.architecture_config(arch)
        s, lay = Shape.from_config(c), Layout.from_config(c)
        assert lay.fused_gate_up == (arch == "Phi-3-mini")
        ops = generation_ops(c, 64, 1, 2, "sdpa")
        mlp = [op for op in ops if op[1].startswith("mlp0.") and not op[1].startswith("mlp0.normed")]
        I_b = n * s.intermediate * b
        assert [op[2] // I_b for op in mlp if op[0] == "alloc" and op[2] >= I_b] == sizes
        tensors = [op for op in ops if op[1].startswith("mlp0.") and ".normed." not in op[1]]   # not the norm's fp32 copies
        live, peak = {}, 0
        for kind, name, *size in tensors:
            if kind == "alloc":
                live[name] = size[0]
            else:
                del live[name]
            peak = max(peak, sum(live.values()))
        assert peak == block_transients(s, lay, 64, 2, torch.bfloat16, "sdpa", "cuda")["mlp"] and not live


def _live_peak(ops):
    from helpers.allocator_sim import simulate
    return max(a for a, _ in simulate(ops)["trace"])


def test_gpt_oss_eager_ops_keep_the_dtype_and_the_sink_column():
    """GPT-OSS's eager_attention_forward (modeling_gpt_oss.py): no fp32 score block; the scores with the
    sink column (torch.cat), their max-subtracted copy and the softmax are batch·heads·q·(k+1), in bf16,
    and the softmax is what the layer keeps (its [..., :-1] view is the returned weights)."""
    c = family_config("gpt_oss (sliding + sinks + MoE)")
    q, heads = 64, c.num_attention_heads
    ops = generation_ops(c, q, 1, 2, "eager")
    rows = 2 * heads * q
    score = {op[1]: op[2] for op in ops if op[0] == "alloc" and op[1].endswith("0") and op[2] >= rows * q
             and not op[1].startswith(("qkv", "mlp"))}
    assert score == {"qk0": rows * q * 2, "scaled0": rows * q * 2, "masked0": rows * q * 2,
                     "cat0": rows * (q + 1) * 2, "shifted0": rows * (q + 1) * 2, "weights0": rows * (q + 1) * 2}
    mlp = next(i for i, op in enumerate(ops) if op[1].startswith("mlp0"))
    assert ops.index(["free", "weights0"]) > mlp                        # kept while the MLP runs


@pytest.mark.parametrize("model_type, dtype, per_score", [
    ("llama", torch.bfloat16, 10), ("llama", torch.float16, 8), ("llama", torch.float32, 8),
    ("gemma2", torch.bfloat16, 10), ("llama4_text", torch.bfloat16, 4), ("gpt_oss", torch.bfloat16, 6)])
def test_eager_ops_peak_is_the_tensor_level_score_bytes(model_type, dtype, per_score):
    """Each model type's eager sequence (budget_replay.eager_ops) peaks at the score bytes the tensor-level
    budget counts (budget_activations.score_bytes: eager_score_bytes, or EAGER_SOFTMAX_COPIES × b),
    and leaves only the returned weights alive."""
    from types import SimpleNamespace

    from helpers.budget_activations import score_bytes
    rows, k = 4 * 128, 128
    cfg = SimpleNamespace(model_type=model_type, attn_logit_softcapping=50.0 if model_type == "gemma2" else None)
    ops = eager_ops(cfg, 0, rows, k, dtype)
    sink = (k + 1) / k if model_type == "gpt_oss" else 1
    assert _live_peak(ops) == pytest.approx(rows * k * per_score * sink, rel=1e-3)
    assert per_score == score_bytes(SimpleNamespace(model_type=model_type), dtype, "cuda")
    alive = {op[1] for op in ops if op[0] == "alloc"} - {op[1] for op in ops if op[0] == "free"}
    assert alive == {"weights0"}
    fp32 = [op for op in ops if op[0] == "alloc" and op[2] >= rows * k * 4]
    assert bool(fp32) == (model_type in ("llama", "gemma2"))


def test_eager_softcap_only_where_the_attention_passes_it():
    """Gemma-2 passes softcap=attn_logit_softcapping to eager_attention_forward: three more score-sized
    steps (/ cap, tanh, × cap); Gemma-3's attention does not pass it, so its sequence is Llama's."""
    from types import SimpleNamespace
    steps = {mt: [op[1] for op in eager_ops(SimpleNamespace(model_type=mt, attn_logit_softcapping=30.0), 0, 8, 8)
                  if op[0] == "alloc"] for mt in ("gemma2", "gemma3_text", "llama")}
    assert steps["gemma2"][:6] == ["qk0", "scaled0", "capdiv0", "tanh0", "capped0", "masked0"]
    assert steps["gemma3_text"] == steps["llama"] == ["qk0", "scaled0", "masked0", "fp320", "softmax0", "weights0"]

def test_device_footprint_bad_input():
    c = models.architecture_config("SmolLM2-135M")
    with pytest.raises(ValueError, match="non_torch_bytes"):
        device_footprint(c, 128, 4, 1, -1)
    with pytest.raises(ValueError, match="attention"):
        device_footprint(c, 128, 4, 1, 0, "flash")
    with pytest.raises(ValueError, match="workspace_bytes"):
        device_footprint(c, 128, 4, 1, 0, workspace_bytes=-5)


def test_device_footprint_counts_the_cublas_workspace_in_reserved():
    """The workspaces the first matmuls take through the caching allocator are reserved memory (65 MiB
    in the H200 run: most of the gap on SmolLM2-size models)."""
    c = models.architecture_config("SmolLM2-135M")
    base = device_footprint(c, 256, 4, 2, 500 * 2**20)
    with_ws = device_footprint(c, 256, 4, 2, 500 * 2**20, workspace_bytes=65 * 2**20)
    assert with_ws["reserved"] - base["reserved"] == 65 * 2**20
    assert with_ws["total"] == with_ws["reserved"] + 500 * 2**20


def test_kv_storage_after_the_prefill_is_the_whole_prompt():
    """transformers keeps a sliding layer's window as a view of the prefill's K/V: the whole prompt's
    storage stays alive until the first decode step copies the window out (the −28 % peak error on
    Mistral-7B at 8192 tokens on the H200). Hand-computed for Mistral's default (window 4096)."""
    from transformers import MistralConfig

    cfg = MistralConfig()
    assert kv_storage_positions(cfg, 8192) == [8192] * 32                  # after the prefill
    assert kv_storage_positions(cfg, 8192, 1) == [4096] * 32               # cat(window − 1, new)
    assert kv_storage_positions(cfg, 100, 5) == [105] * 32                 # inside the window
    per = 2 * 8 * 128 * 2                                                    # K+V, one position, bf16
    g = B.generation_peak(cfg, 8192, 16, 1)
    assert g["kv"] == 32 * 4095 * per                                        # what the cache exposes
    assert g["prefill"] - B.activation_bytes(cfg, 8192, 1)["peak"] == 32 * 8192 * per
    with pytest.raises(ValueError, match="steps"):
        kv_storage_positions(cfg, 10, -1)


@pytest.mark.parametrize("name", ["mistral (sliding)", "gemma2 (4 norms, local/global)"])
def test_kv_storage_matches_the_cache_tensors_storage(name):
    """Measured: the bytes of the storages behind the dynamic cache's K and V tensors, after a prefill
    past the window and after one decode step."""
    from transformers import AutoModelForCausalLM, DynamicCache

    cfg = family_config(name)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    prompt = 3 * max(w for w in layer_windows(cfg) if w) + 5
    cache = DynamicCache(config=cfg)

    def storage_bytes():
        return sum(t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values))

    per = kv_position_bytes(cfg, "fp32") * 2
    with torch.no_grad():
        model(torch.randint(3, 120, (2, prompt)), past_key_values=cache, use_cache=True)
        assert storage_bytes() == sum(kv_storage_positions(cfg, prompt)) * per
        model(torch.randint(3, 120, (2, 1)), past_key_values=cache, use_cache=True)
        assert storage_bytes() == sum(kv_storage_positions(cfg, prompt, 1)) * per


def test_moe_decode_term_only_for_moe_and_only_on_the_gpu():
    c = models.architecture_config("DeepSeek-V2-Lite")
    assert moe_decode_gather_bytes(c, 16) == 16 * 6 * (3 * 1408 * 2048 + 2048 + 3 * 1408) * 2
    assert moe_decode_gather_bytes(models.architecture_config("Llama-3.2-1B"), 16) == 0
    gpu, cpu = (B.generation_peak(c, 512, 8, 16, device=d)["decode"] for d in ("cuda", "cpu"))
    one, kv_full = B.activation_bytes(c, 1, 16), B.kv_bytes(c, 512 + 8 - 1, 16)
    # on the GPU the gathered experts make the MLP the decode step's widest phase
    assert gpu == kv_full + 16 * c.vocab_size * 4 + one["residual"] + one["mlp"] + moe_decode_gather_bytes(c, 16)
    assert cpu < gpu


# ------------------------------------------------------------------------------ bad input, at the door
SMOL = "SmolLM2-135M"
BAD_INPUT = [
    (lambda c: B.kv_bytes(c, 10, True), "batch must be a positive integer"),
    (lambda c: B.kv_bytes(c, 10.0, 1), "seq_len must be a positive integer"),
    (lambda c: B.kv_bytes(c, 10, 1, "int4", B.KVLayout(group_size=0)), "group_size must be a positive integer"),
    (lambda c: B.kv_bytes(c, 10, 1, "int4", decode_steps=-1), "decode_steps must be an integer ≥ 0"),
    (lambda c: B.kv_bytes(c, 10, 1, "int4", decode_steps=10), r"decode_steps must be below seq_len=10"),
    (lambda c: B.KVLayout(residual_dtype="fp7"), r"residual_dtype must be one of \['fp32', 'bf16', 'fp16'\] or a floating"),
    (lambda c: B.KVLayout(residual_dtype="int4"), r"residual_dtype must be one of .*the residual holds its K and V"),
    (lambda c: B.KVLayout(residual_dtype=torch.int8), r"residual_dtype must be one of .*floating torch.dtype"),
    (lambda c: B.KVLayout(residual_length=-1), "residual_length must be an integer ≥ 0"),
    (lambda c: B.KVLayout(group_size=True), "group_size must be a positive integer"),
    (lambda c: B.kv_bytes(c, 10, 1, cache="paged"), "cache must be one of"),
    (lambda c: B.kv_bytes(c, 10, 1, kv_dtype=None), "unknown dtype None"),
    (lambda c: B.weight_bytes(c, None), "unknown weight format None"),
    (lambda c: B.activation_bytes(c, 0), "positions must be a positive integer"),
    (lambda c: B.activation_bytes(c, 16, device="tpu"), "device must be one of"),
    (lambda c: B.activation_bytes(c, 16, keep_all_logits="yes"), "keep_all_logits must be True or False"),
    (lambda c: B.activation_bytes(c, 16, act_dtype="int3"), "unknown dtype 'int3'"),
    (lambda c: B.generation_peak(c, 16, 0), "new_tokens must be a positive integer"),
    (lambda c: B.generation_peak(c, 16, 4, batch=-2), "batch must be a positive integer"),
    (lambda c: B.generation_peak(c, 16, 4, attention="flash"), "attention must be 'sdpa' or 'eager'"),
    (lambda c: B.budget(c, "bf16", 128, overhead=float("nan")), "overhead must be a finite number of bytes"),
    (lambda c: B.budget(c, "bf16", 128, overhead=float("inf")), "overhead must be a finite number of bytes"),
    (lambda c: B.budget(c, "bf16", 128, overhead="1 GB"), "overhead must be a finite number of bytes"),
    (lambda c: B.budget(c, "bf16", 128, new_tokens=1.5), "new_tokens must be a positive integer"),
    (lambda c: B.budget(c, "bf16", 128.0), "seq_len is the prompt's length: prompt_len must be a positive"),
    (lambda c: B.fits_table(c, 128, 1, formats="int4"), "formats must be a non-empty list"),
    (lambda c: B.fits_table(c, 128, 1, formats=("int4", "int5")), "unknown weight format 'int5'"),
    (lambda c: B.fits_table(c, 128, 1, gpus={"T4": -16}), r"gpus\['T4'\] must be a finite number"),
    (lambda c: B.fits_table(c, 128, 1, gpus={}), "gpus must be a non-empty dict"),
    (lambda c: B.fits_table(c, 128, 1, overhead_gb=float("nan")), "overhead_gb must be a finite number"),
    (lambda c: B.KVLayout().residual_tokens(-1), "decode_steps must be an integer ≥ 0"),
    (lambda c: B.meta_param_counts({"model_type": "llama"}), "config must be a transformers config"),
    (lambda c: B.weight_bytes("HuggingFaceTB/SmolLM2-135M"), "config must be a transformers config"),
    (lambda c: kv_positions(c, 0), "tokens must be a positive integer"),
    (lambda c: kv_positions(c, 8, cache="rolling"), "cache must be one of"),
    (lambda c: kv_storage_positions(c, 8, 1.0), "steps must be an int ≥ 0"),
    (lambda c: kv_position_bytes(c, "fp6"), "unknown dtype 'fp6'"),
    (lambda c: eager_score_bytes("bf8"), "unknown dtype 'bf8'"),
    (lambda c: moe_decode_gather_bytes(c, 0), "batch must be a positive integer"),
    (lambda c: weight_ops(c, "float12"), "unknown dtype 'float12'"),
    (lambda c: generation_ops(c, 16, 2, 1, "flash"), "attention must be one of"),
    (lambda c: generation_ops(c, 16, 0), "new_tokens must be a positive integer"),
    (lambda c: device_footprint(c, 16, 2, 1, non_torch_bytes=1.5), "non_torch_bytes must be bytes ≥ 0"),
    (lambda c: device_footprint(c, 16, 2, 1, workspace_bytes=True), "workspace_bytes must be bytes ≥ 0"),
]


@pytest.mark.parametrize("call,message", BAD_INPUT, ids=[m[:40] for _, m in BAD_INPUT])
def test_bad_input_is_refused_at_the_door_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call(models.architecture_config(SMOL))


def test_kv_layout_is_a_kvlayout_and_the_caches_defaults():
    from helpers import kvcache

    c = models.architecture_config(SMOL)
    with pytest.raises(TypeError, match=r"layout must be a KVLayout \(e.g. KVLayout\(group_size=64\).*got int 64"):
        B.kv_bytes(c, 10, 1, "int4", 64)
    assert B.kv_bytes(c, 10, 1, "int4") == B.kv_bytes(c, 10, 1, "int4", B.KVLayout())
    layer = kvcache.Int4Layer()
    assert (layer.q_group_size, layer.residual_length) == (B.KVLayout().group_size, B.KVLayout().residual_length)
    assert B.KVLayout(residual_length=16).residual_tokens(21) == 5


def test_integers_of_any_library_are_integers():
    """numpy and 0-d torch integers are counts like Python ints; the number does not change."""
    import numpy as np

    c = models.architecture_config(SMOL)
    want = B.kv_bytes(c, 100, 3)
    assert B.kv_bytes(c, np.int64(100), torch.tensor(3)) == want
    assert B.generation_peak(c, np.int32(64), torch.tensor(4), np.int64(2)) == B.generation_peak(c, 64, 4, 2)
    assert B.budget(c, "bf16", np.int64(128), overhead=np.float32(1e9))["overhead"] == 1e9


def test_a_config_that_transformers_cannot_build_is_named():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("t5", d_model=64, num_layers=2, num_heads=4, d_ff=96, d_kv=16)  # an encoder-decoder
    with pytest.raises(ValueError, match="cannot build model_type 't5' as a causal LM"):
        B.meta_param_count(cfg)


def test_sdpa_window_mask_from_the_window_on_and_rope_tables_per_present_type():
    # transformers keeps SDPA's mask once kv_length >= the window (masking_utils._ignore_causal_mask_sdpa)
    from helpers.budget_activations import block_transients
    from helpers.budget_layout import Layout
    cfg = models.architecture_config("Gemma-3-1B")
    s, lay = B.Shape.from_config(cfg), Layout.from_config(cfg)
    w = next(c.window for c in s.caches if c.window)
    below, at = (block_transients(s, lay, n, 1, "bf16", "sdpa", "cuda")["residual"] for n in (w - 1, w))
    no_mask = lambda n: 3 * n * s.hidden * 2 + 2 * n * s.head_dim * 2 * s.rope_tables  # noqa: E731
    assert below == no_mask(w - 1) and at == no_mask(w) + w * w
    assert s.rope_tables == 2
    one_type = models.architecture_config("Gemma-3-1B")
    one_type.layer_types = ["full_attention"] * one_type.num_hidden_layers
    assert B.Shape.from_config(one_type).rope_tables == 1


def test_score_copies_are_held_through_the_next_forward_not_at_the_logits():
    """A logits processor's copy of the scores (min_new_tokens: ``torch.where(eos, −inf, scores)``)
    is alive through the next step's forward: an eager decode step whose peak is its repeated K and V
    grows by ``batch·vocab·4`` per copy; a step whose widest point is the logits does not."""
    from helpers import budget as B
    from helpers.models import architecture_config

    cfg = architecture_config("Qwen2.5-0.5B")
    plain, forced = (B.generation_peak(cfg, 8192, 32, 2, attention="eager", score_copies=c)["decode"] for c in (0, 1))
    assert forced - plain == 2 * cfg.vocab_size * 4
    tiny_ctx = [B.generation_peak(cfg, 8, 4, 1, score_copies=c)["decode"] for c in (0, 1)]
    assert tiny_ctx[0] == tiny_ctx[1]          # 8 positions: the 151,936-entry logits are the widest point
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="score_copies must be an int"):
            B.generation_peak(cfg, 512, 4, 1, score_copies=bad)


def test_decode_ops_hold_generate_scores_across_steps_and_free_them_at_the_end():
    """Each decode step: its residual, per layer the attention's transients with K's and V's torch.cat,
    the MLP's, then the logits with generate's fp32 copy (and each processor copy) rebound — the
    previous step's freed only once the new one exists; after the last step nothing of them is left."""
    from helpers.budget_replay import generation_phases
    c = models.architecture_config("SmolLM2-135M")
    w, pre, dec = generation_phases(c, 64, 4, 2, "sdpa", score_copies=1)
    names = [op[1] for op in dec if op[0] == "alloc"]
    assert names.count("res1") == 1 and sum(n.startswith("att1.") for n in names) == c.num_hidden_layers
    assert [op for op in pre if op[1].startswith(("carried", "processed"))] == [
        ["alloc", "carried0", 2 * c.vocab_size * 4], ["alloc", "processed0.0", 2 * c.vocab_size * 4]]
    assert dec.index(["alloc", "carried1", 2 * c.vocab_size * 4]) < dec.index(["free", "carried0"])
    alive = {}
    for kind, name, *size in w + pre + dec:
        if kind == "alloc":
            alive[name] = size[0]
        else:
            del alive[name]
    assert not any(n.startswith(("carried", "processed", "logits", "res", "att", "mlp")) for n in alive)


def test_decode_kv_cats_follow_the_cache_layer_kind():
    """transformers 5.17's DynamicLayer.update rebinds self.keys before V's torch.cat (the old K is free
    when the new V is placed); DynamicSlidingWindowLayer.update makes both cats first. The replay keeps
    each order, and with it the recorded decode peak of Mistral-7B (every layer sliding, K and V of
    1.002 MiB) on the H200: the interleaved order alone was 14 % short."""
    from helpers.budget_replay import decode_allocated, generation_phases
    from helpers.config import read_json, results_path
    base = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=1000)
    for window, order in ((None, ["+K0_1", "-K0_0", "+V0_1", "-V0_0"]), (64, ["+K0_1", "+V0_1", "-K0_0", "-V0_0"])):
        cfg = AutoConfig.for_model("mistral", **base, sliding_window=window)
        _, _, dec = generation_phases(cfg, 32, 3, 1)
        kv = [("+" if op[0] == "alloc" else "-") + op[1] for op in dec if op[1][:2] in ("K0", "V0")]
        assert kv[:4] == order, (window, kv[:4])
    row = next(r for r in read_json(results_path("h200", "budget_accuracy.json"))
               if (r["model"], r.get("attention"), r["seq_len"], r["batch"]) == ("Mistral-7B", "sdpa", 512, 1))
    pred = decode_allocated(models.architecture_config("Mistral-7B"), 512, row["new_tokens"], 1)
    assert pred == pytest.approx(row["decode_meas"], rel=0.01)


def test_decode_allocated_sees_the_blocks_the_tensor_budget_does_not():
    """A layer's K and V just over 1 MiB (8 KV heads × 128 × 512 positions in bf16, as Mistral-7B): the
    allocator hands out blocks with their remainders, so the replay's decode peak exceeds the tensors'
    bytes of budget.generation_peak; with small K and V (SmolLM2 at 64 positions) the two agree."""
    from helpers.budget_replay import decode_allocated
    big = LlamaConfig(hidden_size=1024, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=8, head_dim=128, vocab_size=32000)
    tensors = B.generation_peak(big, 512, 8, 1, score_copies=1)["decode"]
    assert decode_allocated(big, 512, 8, 1, score_copies=1) > 1.05 * tensors
    small = models.architecture_config("SmolLM2-135M")
    assert decode_allocated(small, 64, 4, 2, score_copies=1) == pytest.approx(
        B.generation_peak(small, 64, 4, 2, score_copies=1)["decode"], rel=0.05)
    with pytest.raises(ValueError, match="score_copies"):
        decode_allocated(small, 64, 4, 2, score_copies=-1)


def test_mla_decode_counts_the_latents_expanded_at_the_last_step():
    """DeepSeek-V2-Lite at 8192 × 1: the last step fed expands 8192 + 31 cached latents into 16 heads'
    keys (128 + 64) and values' source (kv_b_proj's 128 + 128), which outgrows the MoE gather there;
    with eager at batch 2 the values are copied too."""
    from helpers.budget_activations import mla_expand_bytes
    cfg = models.architecture_config("DeepSeek-V2-Lite")
    s = Shape.from_config(cfg)
    positions = 8192 + 32 - 1
    assert mla_expand_bytes(s, 1, positions, 2, "sdpa") == (positions * 16 * 256 * 2, positions * 16 * 192 * 2, 0)
    assert mla_expand_bytes(s, 2, positions, 2, "eager")[2] == 2 * positions * 16 * 128 * 2
    g = B.generation_peak(cfg, 8192, 32, 1)
    assert g["decode"] >= g["kv"] + positions * 16 * 448 * 2
    short = B.generation_peak(cfg, 512, 32, 1)      # there the gathered experts are the step's widest stage
    assert short["decode"] - short["kv"] < positions * 16 * 448 * 2


def test_replay_places_mla_latents_as_two_tensors_of_their_own_sizes():
    """The cache's two MLA latents are separate tensors of different widths (kv_lora_rank = 512 and the
    rotary key's 64 per position for DeepSeek-V2-Lite): the replay allocates each at its own size —
    the rotary one below 1 MiB goes to the small pool — not two halves of their sum."""
    from helpers.budget_replay import generation_phases
    cfg = models.architecture_config("DeepSeek-V2-Lite")
    _, pre, dec = generation_phases(cfg, 2048, 4, 1, "sdpa", torch.bfloat16)
    sizes = {op[1]: op[2] for op in pre + dec if op[0] == "alloc"}
    assert kv_tensor_bytes(Shape.from_config(cfg), 2) == (512 * 2, 64 * 2)
    assert (sizes["K0_0"], sizes["V0_0"]) == (2048 * 512 * 2, 2048 * 64 * 2)
    assert (sizes["K3_1"], sizes["V3_1"]) == (2049 * 512 * 2, 2049 * 64 * 2)
    llama = generation_phases(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=100),
                              16, 2, 1, "sdpa", torch.bfloat16)[1]
    k, v = ({op[1]: op[2] for op in llama if op[0] == "alloc"}[n] for n in ("K0_0", "V0_0"))
    assert k == v == 16 * 2 * 16 * 2


TINY_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=100)


def _prefill(cfg, q, batch, attention):
    from helpers.budget_replay import generation_phases
    return generation_phases(cfg, q, 2, batch, attention, torch.bfloat16)[1]


def test_llama_eager_prefill_is_replayed_op_by_op_by_hand():
    """A tiny Llama (4 heads of 16, 2 KV heads, h 64, I 128), eager, 8 positions × batch 2 (n = 16, bf16),
    as transformers 5.17's LlamaModel / LlamaDecoderLayer / LlamaAttention / eager_attention_forward
    make and drop each tensor: q 2048 B, k and v 1024 B each; each rotated through q·cos, rotate_half's
    −x2 (half) and cat, ·sin, the sum; q and k dropped; the cache's K and V copies (8 positions × 2 × 2
    heads × 16 × 2 B = 1024 B) before repeat_kv (K and V to 4 heads, 2048 B each); matmul's copy of q
    (batch > 1), dropped once q·kᵀ exists; the scores (2·4·8·8 = 512: 1024 B bf16, 2048 B fp32);
    weights·v and its contiguous transpose; o_proj; the rotated q on return."""
    ops = [tuple(op) for op in _prefill(LlamaConfig(**TINY_LLAMA), 8, 2, "eager")]
    a = lambda name, size: ("alloc", name, size)      # noqa: E731
    f = lambda name: ("free", name)                   # noqa: E731

    def rot(x, size):
        return [a(f"{x}.cos", size), a(f"{x}.neg", size // 2), a(f"{x}.half", size), f(f"{x}.neg"),
                a(f"{x}.sin", size), f(f"{x}.half"), a(f"{x}.rot", size), f(f"{x}.cos"), f(f"{x}.sin")]

    attention = [a("q0", 2048), a("k0", 1024), a("v0", 1024), *rot("q0", 2048), *rot("k0", 1024),
                 f("q0"), f("k0"), a("K0_0", 1024), a("V0_0", 1024), f("k0.rot"), f("v0"),
                 a("rk0", 2048), a("rv0", 2048), a("qc0", 2048), a("qk0", 1024), f("qc0"),
                 a("scaled0", 1024), f("qk0"), a("masked0", 1024), f("scaled0"),
                 a("fp320", 2048), a("softmax0", 2048), f("fp320"), a("weights0", 1024), f("softmax0"), f("masked0"),
                 a("av0", 2048), a("attn0", 2048), f("av0"), f("rk0"), f("rv0"),
                 a("o0", 2048), f("attn0"), f("q0.rot")]
    start = ops.index(a("q0", 2048))
    assert ops[start:start + len(attention)] == attention
    # the model: embeddings, the additive causal mask (q² bools twice, batch·q² bools, batch·q²·b), cos / sin
    assert ops[:8] == [a("emb", 2048), a("mask.full.causal", 64), a("mask.full.and1", 64), f("mask.full.causal"),
                       a("mask.full.bool", 128), f("mask.full.and1"), a("mask.full", 256), f("mask.full.bool")]
    assert a("cos", 16 * 16 * 2) in ops and a("sin", 16 * 16 * 2) in ops
    # the layer: residual sums as hidden-size tensors of their own; the weights dropped as the layer returns
    after = ops[start + len(attention):]
    assert after[:3] == [f("ln0"), a("sum0", 2048), f("o0")]
    out = after.index(a("out0", 2048))
    assert after[out - 1] == f("mlp0.normed") and after[out + 1:out + 4] == [f("mlp0.down"), f("sum0"), f("weights0")]
    # layer 0's output is dropped when layer 1 returns; the embeddings, mask and tables when the model does
    assert ops.index(f("out0")) > ops.index(f("weights1"))
    assert ops[ops.index(f("out1")):ops.index(f("out1")) + 8] == [
        f("out1"), f("emb"), f("mask.full"), f("cos"), f("sin"), a("logits0", 2 * 100 * 2), f("final"),
        a("carried0", 2 * 100 * 4)]
    alive = {}
    for kind, name, *size in ops:
        if kind == "alloc":
            alive[name] = size[0]
        else:
            del alive[name]
    assert alive == {"K0_0": 1024, "V0_0": 1024, "K1_0": 1024, "V1_0": 1024, "carried0": 800}


def test_llama_ops_only_where_transformers_code_was_read():
    """The op-by-op prefill covers eager attention of the LLAMA_OPS model types with the Llama layout;
    SDPA, other model types (their own norms, multipliers, NoPE layers) and one KV head (repeat_kv a
    view) keep the lumped replay (one ``residual`` block, ``qkv{l}``). At batch 1 q's strides fold into
    one matmul batch: no copy of q."""
    cfg = LlamaConfig(**TINY_LLAMA)
    names = lambda ops: {op[1] for op in ops}        # noqa: E731
    eager = names(_prefill(cfg, 8, 1, "eager"))
    assert "emb" in eager and "residual" not in eager and "qkv0" not in eager and "qc0" not in eager
    assert {"residual", "qkv0"} <= names(_prefill(cfg, 8, 1, "sdpa"))
    mqa = LlamaConfig(**{**TINY_LLAMA, "num_key_value_heads": 1})
    assert "residual" in names(_prefill(mqa, 8, 1, "eager"))
    for other in ("Qwen3-1.7B", "Granite-3.1-2B", "SmolLM3-3B", "OLMo-2-1B", "Gemma-2-2B"):
        assert "residual" in names(_prefill(models.architecture_config(other), 16, 1, "eager")), other


def _recorded_prefill_blocks(name, index, min_bytes=200 * 1024):
    """The recorded prefill (first forward, up to generate's own tensors) of a trace of
    benchmarks/alloc_trace.py, as signed sizes of the blocks of ``min_bytes`` or more, in order."""
    import gzip
    import json

    from benchmarks.alloc_trace import MARK_BYTES
    from helpers.config import results_path
    with gzip.open(results_path("h200", name), "rt") as fh:
        rec = json.load(fh)
    rec = rec[index] if isinstance(rec, list) else rec
    live, blocks, phase = {}, [], -1
    for code, addr, size, frame in rec["events"]:
        if code == "a" and size == MARK_BYTES:
            phase += 1
            continue
        if phase != 0 or code not in "af":
            continue
        if blocks and "generation/" in rec["frames"][frame]:      # generate's scores: the prefill is over
            break
        if code == "a":
            live[addr] = size
        elif addr in live:
            size = -live.pop(addr)
        else:
            continue
        if abs(size) >= min_bytes:
            blocks.append(size)
    return rec["point"], blocks


@pytest.mark.parametrize("name, index", [
    ("alloc_events_smollm2-135m_eager_512x16_2026-12-04.json.gz", 0),
    ("alloc_events_qwen2.5-0.5B_eager_8192x1.json.gz", 0),
    ("alloc_events_points_2026-12-02.json.gz", 0),                 # Llama-3.2-1B eager 2048 × 1
    ("alloc_events_points_2026-12-02.json.gz", 2),                 # Qwen2.5-0.5B SDPA 8192 × 2
    ("alloc_events_mistral-7b_sdpa_512x1_2026-12-03.json.gz", 0)])
def test_llama_prefill_ops_are_the_recorded_blocks(name, index):
    """Every block of 200 KiB or more the H200's recorded prefills allocated and freed, in order, is the
    replay's (llama_prefill_ops; SDPA checked too although prefill_ops does not switch it on): the
    norms' fp32 copies, q/k/v, the rotations, the cache's K and V, repeat_kv, the q copy at batch > 1,
    the scores, the attention output and its transpose, o_proj, the residual sums, the MLP, the final
    norm, the logits — up to generate's fp32 scores."""
    from helpers.budget_layout import meta_model
    from helpers.budget_replay import llama_prefill_ops
    point, real = _recorded_prefill_blocks(name, index)
    arch, attention, q, batch = point.split(":")
    cfg = models.architecture_config(arch)
    s = Shape.from_config(cfg)
    ops = llama_prefill_ops(cfg, s, Layout.from_model(meta_model(cfg), s), int(q), int(batch), attention,
                            torch.bfloat16)
    sizes, mine = {}, []
    for op in ops[:ops.index(["alloc", "carried0", int(batch) * s.vocab * 4])]:
        size = op[2] if op[0] == "alloc" else -sizes[op[1]]
        sizes[op[1]] = abs(size)
        if abs(size) >= 200 * 1024:
            mine.append(size)
    assert mine == real


def test_llama_family_causal_masks_follow_each_model_forward():
    """Eager masks as masking_utils builds them (transformers 5.17): Mistral's sliding mask function is
    and_masks(sliding_window_overlay, causal) inside the padding and_mask — q² bools for the overlay, the
    inner conjunction, causal, the inner result, the outer conjunction — then batch·q² bools and the
    additive batch·q²·b; Qwen2 builds the full mask always and a sliding one for its sliding layers."""
    from helpers.budget_replay import causal_mask_ops, llama_mask_kinds
    q2 = 8 * 8
    assert causal_mask_ops("sliding", 2, 8, 2) == [
        ["alloc", "mask.sliding.window", q2], ["alloc", "mask.sliding.in1", q2], ["free", "mask.sliding.window"],
        ["alloc", "mask.sliding.causal", q2], ["alloc", "mask.sliding.in2", q2], ["free", "mask.sliding.causal"],
        ["free", "mask.sliding.in1"], ["alloc", "mask.sliding.and1", q2], ["free", "mask.sliding.in2"],
        ["alloc", "mask.sliding.bool", 2 * q2], ["free", "mask.sliding.and1"],
        ["alloc", "mask.sliding", 2 * q2 * 2], ["free", "mask.sliding.bool"]]
    base = {k: v for k, v in TINY_LLAMA.items() if k != "head_dim"}
    mistral = AutoConfig.for_model("mistral", **base, sliding_window=4)
    qwen2 = AutoConfig.for_model("qwen2", **base, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert llama_mask_kinds(mistral, Shape.from_config(mistral)) == ["sliding"]
    assert llama_mask_kinds(qwen2, Shape.from_config(qwen2)) == ["full", "sliding"]
    assert llama_mask_kinds(LlamaConfig(**TINY_LLAMA), Shape.from_config(LlamaConfig(**TINY_LLAMA))) == ["full"]
    names = [op[1] for op in _prefill(qwen2, 8, 1, "eager") if op[0] == "alloc"]
    assert "mask.full" in names and "mask.sliding" in names and "residual" not in names
