import pytest
import torch
from transformers import LlamaConfig

from helpers import budget as B
from helpers import models

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


@pytest.mark.parametrize("name", sorted(set(models.ARCHITECTURES) - {"Llama-2-70B"}))
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
    extra = B.weight_allocation(c) - B.weight_bytes(c, "bf16")
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
    rest = g["decode"] - kv_full - kv_full / s.layers / 2 - B.activation_bytes(cfg, 1, 16)["peak"]
    assert rest == 16 * cfg.vocab_size * 4


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
    kw = {"residual_tokens": B.int4_residual_tokens(decode_steps), "residual_dtype": "fp32"} if fmt == "int4" else {}
    assert B.kv_bytes(cfg, tokens, 2, fmt, **kw) == kvcache.stored_bytes(cache)


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
}


def family_config(name):
    from transformers import AutoConfig

    mt, kw = FAMILY_CASES[name]
    return AutoConfig.for_model(mt, **{**TINY, **kw})


@pytest.mark.parametrize("name", list(FAMILY_CASES))
def test_param_counts_equal_the_meta_model(name):
    """Every family's count (extra norms, q/k norms, biases, experts, MLA factors) against the real
    transformers class built on the meta device."""
    cfg = family_config(name)
    assert B.param_counts(cfg)["total"] == B.meta_param_count(cfg)


def test_unknown_family_raises_instead_of_guessing():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=4)
    with pytest.raises(ValueError, match="does not know model_type 'gpt2'.*meta_param_count"):
        B.param_counts(cfg)


@pytest.mark.parametrize("name", ["mistral (sliding)", "qwen2 (max_window_layers)", "gemma2 (4 norms, local/global)",
                                  "gemma3", "deepseek_v2 (MLA)", "llama"])
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
    assert B.layer_windows(cfg) == [4096] * 32


def test_generation_ops_by_hand():
    """The op sequence of a generate: weights, the prefill layer by layer (transients freed, K and V
    kept), then one torch.cat per layer, K and V, and decode step; what stays allocated at the end is
    the weights and the final KV cache."""
    from helpers.allocator_sim import simulate
    c = models.architecture_config("SmolLM2-135M")
    for attention in ("sdpa", "eager"):
        ops = B.generation_ops(c, 256, 5, 2, attention)
        w = len(B.weight_ops(c))
        cats = [op for op in ops[w:] if op[0] == "alloc" and op[1].startswith(("K", "V"))]
        assert len(cats) == c.num_hidden_layers * 2 * 5            # prefill + 4 fed-back tokens
        end = simulate(ops)
        kv = B.kv_bytes(c, 256 + 4, 2)
        assert end["allocated"] == pytest.approx(B.weight_allocation(c) + kv, rel=1e-3)
        assert end["reserved"] >= end["allocated"]
    sdpa, eager = (B.device_footprint(c, 2048, 8, 4, 700 * 2**20, a) for a in ("sdpa", "eager"))
    assert eager["reserved"] > sdpa["reserved"] and sdpa["total"] == sdpa["reserved"] + 700 * 2**20


def test_eager_ops_follow_the_score_copies():
    """Eager attention's score-sized blocks, in order: q·kᵀ, ×scaling (q·kᵀ freed), +mask, fp32 copy,
    fp32 softmax, weights in the model dtype — 2, 2, 2, 4, 4, 2 bytes per score (bf16)."""
    c = models.architecture_config("SmolLM2-135M")
    ops = B.generation_ops(c, 128, 1, 1, "eager")
    S = 9 * 128 * 128
    sizes = [op[2] // S for op in ops if op[0] == "alloc" and op[1].endswith("0")
             and op[1][:-1] in ("qk", "scaled", "masked", "fp32", "softmax", "weights")]
    assert sizes == [2, 2, 2, 4, 4, 2]


def test_device_footprint_bad_input():
    c = models.architecture_config("SmolLM2-135M")
    with pytest.raises(ValueError, match="non_torch_bytes"):
        B.device_footprint(c, 128, 4, 1, -1)
    with pytest.raises(ValueError, match="attention"):
        B.device_footprint(c, 128, 4, 1, 0, "flash")
    with pytest.raises(ValueError, match="workspace_bytes"):
        B.device_footprint(c, 128, 4, 1, 0, workspace_bytes=-5)


def test_device_footprint_counts_the_cublas_workspace_in_reserved():
    """The workspaces the first matmuls take through the caching allocator are reserved memory (65 MiB
    in the H200 run: most of the gap on SmolLM2-size models)."""
    c = models.architecture_config("SmolLM2-135M")
    base = B.device_footprint(c, 256, 4, 2, 500 * 2**20)
    with_ws = B.device_footprint(c, 256, 4, 2, 500 * 2**20, workspace_bytes=65 * 2**20)
    assert with_ws["reserved"] - base["reserved"] == 65 * 2**20
    assert with_ws["total"] == with_ws["reserved"] + 500 * 2**20


def test_kv_storage_after_the_prefill_is_the_whole_prompt():
    """transformers keeps a sliding layer's window as a view of the prefill's K/V: the whole prompt's
    storage stays alive until the first decode step copies the window out (the −28 % peak error on
    Mistral-7B at 8192 tokens on the H200). Hand-computed for Mistral's default (window 4096)."""
    from transformers import MistralConfig

    cfg = MistralConfig()
    assert B.kv_storage_positions(cfg, 8192) == [8192] * 32                  # after the prefill
    assert B.kv_storage_positions(cfg, 8192, 1) == [4096] * 32               # cat(window − 1, new)
    assert B.kv_storage_positions(cfg, 100, 5) == [105] * 32                 # inside the window
    per = 2 * 8 * 128 * 2                                                    # K+V, one position, bf16
    g = B.generation_peak(cfg, 8192, 16, 1)
    assert g["kv"] == 32 * 4095 * per                                        # what the cache exposes
    assert g["prefill"] - B.activation_bytes(cfg, 8192, 1)["peak"] == 32 * 8192 * per
    with pytest.raises(ValueError, match="steps"):
        B.kv_storage_positions(cfg, 10, -1)


@pytest.mark.parametrize("name", ["mistral (sliding)", "gemma2 (4 norms, local/global)"])
def test_kv_storage_matches_the_cache_tensors_storage(name):
    """Measured: the bytes of the storages behind the dynamic cache's K and V tensors, after a prefill
    past the window and after one decode step."""
    from transformers import AutoModelForCausalLM, DynamicCache

    cfg = family_config(name)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    prompt = 3 * max(w for w in B.layer_windows(cfg) if w) + 5
    cache = DynamicCache(config=cfg)

    def storage_bytes():
        return sum(t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values))

    per = B.kv_position_bytes(cfg, "fp32") * 2
    with torch.no_grad():
        model(torch.randint(3, 120, (2, prompt)), past_key_values=cache, use_cache=True)
        assert storage_bytes() == sum(B.kv_storage_positions(cfg, prompt)) * per
        model(torch.randint(3, 120, (2, 1)), past_key_values=cache, use_cache=True)
        assert storage_bytes() == sum(B.kv_storage_positions(cfg, prompt, 1)) * per


def test_moe_decode_term_only_for_moe_and_only_on_the_gpu():
    c = models.architecture_config("DeepSeek-V2-Lite")
    assert B.moe_decode_gather_bytes(c, 16) == 16 * 6 * (3 * 1408 * 2048 + 2048 + 3 * 1408) * 2
    assert B.moe_decode_gather_bytes(models.architecture_config("Llama-3.2-1B"), 16) == 0
    gpu, cpu = (B.generation_peak(c, 512, 8, 16, device=d)["decode"] for d in ("cuda", "cpu"))
    assert gpu - cpu == B.moe_decode_gather_bytes(c, 16)
