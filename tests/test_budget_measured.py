"""The budget's activation formulas against measurement, without a GPU.

:mod:`helpers.host_alloc` reads the C allocator's live bytes after every aten operator: on a CPU it is
``max_memory_allocated``. Real transformers architectures (small random-weight configs of each
family: memory depends on shapes only) run one prefill forward with SDPA and with eager attention;
the prediction of :func:`helpers.budget.activation_bytes` must match the measured peak.

CPU and CUDA differ in one place the formulas know: fp16 softmax is fused only on CUDA (bf16 — used
here — takes the same path on both). SDPA on a CPU falls back to the score-materialising math kernel
when q/k and v head sizes differ (DeepSeek's MLA), so MLA is checked with eager attention only.
"""
import sys

import pytest
import torch
import transformers as T

from helpers import budget, budget_activations, budget_check, host_alloc
from helpers.budget_shape import Shape

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="host_alloc needs glibc (Linux)")

BASE = dict(hidden_size=256, intermediate_size=640, num_attention_heads=8, num_key_value_heads=2,
            num_hidden_layers=2, vocab_size=1000, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "llama": lambda: T.LlamaConfig(**BASE, head_dim=32),
    "qwen2": lambda: T.Qwen2Config(**BASE),
    "qwen3": lambda: T.Qwen3Config(**BASE, head_dim=32),
    "gemma2 (local/global)": lambda: T.Gemma2Config(**BASE, head_dim=32, sliding_window=128),
    "gemma3": lambda: T.Gemma3TextConfig(**BASE, head_dim=32, sliding_window=128, sliding_window_pattern=2),
    "mistral (sliding)": lambda: T.MistralConfig(**BASE, head_dim=32, sliding_window=128),
    "phi3 (MHA, fused)": lambda: T.Phi3Config(**{**BASE, "num_key_value_heads": 8}),
    "mixtral (MoE)": lambda: T.MixtralConfig(**BASE, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe (MoE + shared)": lambda: T.Qwen2MoeConfig(**BASE, num_experts=4, num_experts_per_tok=2,
                                                         moe_intermediate_size=320, shared_expert_intermediate_size=640),
    "deepseek_v2 (MLA + MoE)": lambda: T.DeepseekV2Config(
        **{**BASE, "num_key_value_heads": 8}, kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=32,
        v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, first_k_dense_replace=1,
        n_shared_experts=1),
    # six narrow experts per token: the fp32-weighted down stage is the block's peak, as at
    # DeepSeek-V2-Lite's real widths (the H200's −26 % prefill error before it was modelled)
    "deepseek_v2 (6 of 8 narrow experts)": lambda: T.DeepseekV2Config(
        **{**BASE, "num_key_value_heads": 8}, kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=32,
        v_head_dim=32, n_routed_experts=8, num_experts_per_tok=6, moe_intermediate_size=64, first_k_dense_replace=1,
        n_shared_experts=1),
    # the families people bring today: post-norms (no normed MLP input), NoPE layers, 5:1 local/global,
    # a parallel block rotating q and k in fp32, μP multipliers, 8 experts, sinks + biased experts with
    # their own gate and a bf16 softmax, chunked attention with every token through every expert
    "olmo2 (post-norms)": lambda: T.Olmo2Config(**BASE),
    "smollm3 (NoPE layers)": lambda: T.SmolLM3Config(**BASE),
    "gemma3 (5:1 local/global)": lambda: T.Gemma3TextConfig(**{**BASE, "num_hidden_layers": 6}, head_dim=32,
                                                            sliding_window=128),
    "cohere2 (parallel, fp32 rotary)": lambda: T.Cohere2Config(**{**BASE, "num_hidden_layers": 4}, sliding_window=128,
                                                               sliding_window_pattern=4),
    "granite": lambda: T.GraniteConfig(**BASE),
    "qwen3_moe": lambda: T.Qwen3MoeConfig(**BASE, head_dim=32, num_experts=8, num_experts_per_tok=2,
                                          moe_intermediate_size=128),
    "gpt_oss (sinks, biased experts)": lambda: T.GptOssConfig(**BASE, head_dim=32, num_local_experts=4,
                                                              num_experts_per_tok=2, sliding_window=128),
    "llama4_text (chunked, dense dispatch)": lambda: T.Llama4TextConfig(**BASE, head_dim=32, num_local_experts=4,
                                                                        num_experts_per_tok=1, attention_chunk_size=128,
                                                                        intermediate_size_mlp=640),
}
CPU_MATH_SDPA = {"deepseek_v2 (MLA + MoE)", "deepseek_v2 (6 of 8 narrow experts)"}   # q/k and v head sizes differ: the CPU falls back to the math kernel
NO_SDPA = {"gpt_oss (sinks, biased experts)"}   # transformers has no SDPA path for attention sinks
POINTS = [(96, 1), (384, 2)]   # 384 > the 128-token windows: past the sliding window


def measured(model, positions, batch):
    return budget_check.cpu_prefill_peak(model, positions, batch)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_activation_peak_matches_measurement(family, attention):
    if attention == "sdpa" and family in NO_SDPA:
        pytest.skip("transformers runs GPT-OSS's attention sinks only with eager (or flash) attention")
    if attention == "sdpa" and family in CPU_MATH_SDPA:
        pytest.skip("SDPA on a CPU materialises the scores when q/k and v head sizes differ (MLA); the GPU's "
                    "kernels do not — checked on the H200 by benchmarks/budget_accuracy.py")
    cfg = CONFIGS[family]()
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation=attention).eval()
    for positions, batch in POINTS:
        pred = budget.activation_bytes(cfg, positions, batch, attention=attention, device="cpu")["peak"]
        meas = measured(model, positions, batch)
        assert abs(pred - meas) <= 0.05 * meas, \
            f"{family} {attention} {positions}×{batch}: predicted {pred:,.0f} B, measured {meas:,.0f} B"


def test_eager_scores_dominate_and_the_old_formula_missed_them():
    """The point of the eager term: at 384×2 the scores and their fp32 softmax copies are most of the
    peak — counting them once, as scores plus one softmax in bf16, missed more than half."""
    cfg = CONFIGS["llama"]()
    model = T.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()
    meas = measured(model, 384, 2)
    scores = 2 * 8 * 384**2
    assert meas > 10 * scores * 0.9                      # ≈ 10 bytes per score element (bf16 + 2 × fp32)
    assert 2 * scores * 2 < 0.5 * meas                   # the former "2 copies in bf16" is under half



@pytest.mark.parametrize("model_type", ["llama", "gemma2", "llama4_text", "gpt_oss"])
def test_eager_ops_match_the_real_eager_attention_forward(model_type):
    """The replay's op sequence for a model type (budget_replay.eager_ops) against that model's own
    transformers eager_attention_forward, run on bf16 tensors: the peak of live bytes and what stays
    alive (the returned weights) agree, to the attention output's few kilobytes."""
    import importlib
    from types import SimpleNamespace

    from helpers import budget_replay
    from helpers.allocator_sim import simulate

    module = importlib.import_module(f"transformers.models.{model_type.removesuffix('_text')}."
                                     f"modeling_{model_type.removesuffix('_text')}")
    batch, heads, q, d = 2, 4, 256, 16
    q_, k_, v_ = (torch.randn(batch, heads, q, d, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.zeros(batch, 1, q, q, dtype=torch.bfloat16)
    attn = SimpleNamespace(num_key_value_groups=1, training=False, sinks=torch.randn(heads, dtype=torch.bfloat16))
    softcap = {"softcap": 50.0} if model_type == "gemma2" else {}
    kept = {}

    def forward():
        out, kept["weights"] = module.eager_attention_forward(attn, q_, k_, v_, mask, scaling=0.25, **softcap)
        return out
    meas = host_alloc.peak_bytes(forward)
    ops = budget_replay.eager_ops(SimpleNamespace(model_type=model_type, attn_logit_softcapping=50.0),
                                  0, batch * heads * q, q)
    trace = simulate(ops)["trace"]
    assert meas["peak"] == pytest.approx(max(a for a, _ in trace), abs=2**16)
    assert kept["weights"].untyped_storage().nbytes() == trace[-1][0]

def test_score_bytes_per_element():
    assert budget_activations.eager_score_bytes("bf16", "cuda") == budget_activations.eager_score_bytes("bf16", "cpu") == 10
    assert budget_activations.eager_score_bytes("fp16", "cuda") == 8 and budget_activations.eager_score_bytes("fp16", "cpu") == 10
    assert budget_activations.eager_score_bytes("fp32") == 8
    with pytest.raises(ValueError, match="device must be"):
        budget_activations.eager_score_bytes("bf16", "tpu")


def test_tracker_sees_a_planted_peak():
    def f():
        a = torch.ones(1 << 20)           # 4 MiB
        b = torch.ones(1 << 21)           # 8 MiB, both alive
        del a
        return b
    r = host_alloc.peak_bytes(f)
    assert abs(r["peak"] - 12 * 2**20) < 2**16 and abs(r["end"] - 8 * 2**20) < 2**16   # b is the result, alive


def test_tracker_refuses_a_non_callable():
    with pytest.raises(TypeError, match="fn must be a callable"):
        host_alloc.peak_bytes(42)


def test_decode_with_batched_mm_experts_holds_the_gathered_weights():
    """On a GPU, generate decodes MoE layers with ``batched_mm`` (it gathers each token's experts'
    weights). The same implementation on the CPU, one decode-shaped forward: the measured peak is the
    gathered weights (:func:`helpers.budget_activations.moe_decode_gather_bytes`) plus a one-token activation."""
    cfg = CONFIGS["qwen2_moe (MoE + shared)"]()
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.set_experts_implementation("batched_mm")
    batch = 8
    ids = torch.randint(3, 900, (batch, 1))
    meas = host_alloc.peak_bytes(lambda: model(ids, use_cache=False, logits_to_keep=1).logits)["peak"]
    gather = budget_activations.moe_decode_gather_bytes(cfg, batch)
    assert gather == batch * 2 * (3 * 320 * 256 + 256 + 3 * 320) * 2                 # hand-computed
    pred = gather + budget.activation_bytes(cfg, 1, batch, device="cpu")["peak"]
    assert abs(pred - meas) <= 0.05 * meas, (pred, meas)


def test_generate_switches_moe_decoding_to_batched_mm_off_the_cpu():
    """The transformers behaviour the decode term rests on: off the CPU, ``generate`` swaps
    ``grouped_mm`` experts for ``batched_mm`` while it decodes (and back afterwards)."""
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(CONFIGS["qwen2_moe (MoE + shared)"]())
    assert set(model.get_experts_implementation().values()) == {"grouped_mm"}
    with model._optimize_model_for_decode():
        assert set(model.get_experts_implementation().values()) == {"batched_mm"}
    assert set(model.get_experts_implementation().values()) == {"grouped_mm"}


def test_sdpa_window_mask_and_per_type_rotary_are_in_the_peak():
    """Past its window a sliding layer's SDPA takes an explicit boolean mask (``batch·positions²``
    bytes, built once per forward), and Gemma-3 computes one rotary table per layer type: at 1024
    positions they are more than the 5 % tolerance of the measured peak, and the prediction holds."""
    cfg = CONFIGS["gemma3 (5:1 local/global)"]()
    assert Shape.from_config(cfg).rope_tables == 2
    assert Shape.from_config(CONFIGS["llama"]()).rope_tables == 1
    model = T.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    pred = budget.activation_bytes(cfg, 1024, 1, attention="sdpa", device="cpu")["peak"]
    meas = measured(model, 1024, 1)
    mask, rope = 1024**2, 2 * 1024 * 32 * 2
    assert mask + rope > 0.05 * meas
    assert abs(pred - meas) <= 0.05 * meas, f"predicted {pred:,.0f} B, measured {meas:,.0f} B"
    within = budget.activation_bytes(cfg, 127, 1, attention="sdpa", device="cpu")     # no mask below the window
    assert within["residual"] == 3 * 127 * 256 * 2 + 2 * 127 * 32 * 2 * 2


@pytest.mark.parametrize("family", ["llama (MHA)", "olmo2 (MHA, post-norms)"])
def test_eager_prefill_with_a_cache_holds_k_and_v_once(family):
    """A prefill with a cache, as ``generate`` runs it: the cache keeps copies of each layer's K and V
    and the projected k and v are freed before the scores, so at eager's widest point they are the
    KV bytes, not transients too. Measured peak = ``activation_bytes(cached=True)`` + the KV bytes;
    without ``cached`` the prediction counts them twice (MHA: K = H, where it shows)."""
    mha = {**BASE, "num_key_value_heads": 8}
    cfg = T.LlamaConfig(**mha, head_dim=32) if family.startswith("llama") else T.Olmo2Config(**mha)
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()
    for positions, batch in POINTS:
        ids = torch.randint(3, 1000, (batch, positions), generator=torch.Generator().manual_seed(0))
        mask = ids.new_ones(ids.shape)
        meas = host_alloc.peak_bytes(lambda: model(ids, attention_mask=mask, past_key_values=T.DynamicCache(config=cfg),
                                                   use_cache=True, logits_to_keep=1).logits)["peak"]
        kv = budget.kv_bytes(cfg, positions, batch)
        cached, uncached = (budget.activation_bytes(cfg, positions, batch, attention="eager", device="cpu", cached=c)["peak"] + kv
                            for c in (True, False))
        assert abs(cached - meas) <= 0.02 * meas, f"{family} {positions}×{batch}: {cached:,.0f} B vs measured {meas:,.0f} B"
        assert abs(cached - meas) < abs(uncached - meas)


def test_mla_decode_step_expands_the_cached_latents():
    """A DeepSeek-V2 decode step over a cache of latents: every layer expands all cached positions into
    each head's keys and values (kv_b_proj's output and the key tensor), and eager attention at
    batch > 1 also copies the values (their batch and head strides do not fold into one matmul batch).
    Measured peak of one fed token's forward = :func:`mla_expand_bytes` + a one-token activation; at
    batch 1 there is no value copy. (Eager only: a CPU's SDPA falls back to the math kernel for MLA.)"""
    cfg = CONFIGS["deepseek_v2 (MLA + MoE)"]()
    s = Shape.from_config(cfg)
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()

    def step_peak(batch, prompt):
        g = torch.Generator().manual_seed(0)
        cache = T.DynamicCache(config=cfg)
        with torch.no_grad():
            model(torch.randint(3, 900, (batch, prompt), generator=g), past_key_values=cache, use_cache=True,
                  logits_to_keep=1)
        token, mask = torch.randint(3, 900, (batch, 1), generator=g), torch.ones(batch, prompt + 1, dtype=torch.long)
        # ATen's own bf16 matmuls, not oneDNN's: on CPUs with AVX512-BF16 (seen on an AMD EPYC) oneDNN holds a
        # buffer of about 0.55 MB per one-token matmul across the layer, which the live-byte count would take
        # for activations
        with torch.backends.mkldnn.flags(enabled=False):
            return host_alloc.peak_bytes(lambda: model(token, attention_mask=mask, past_key_values=cache, use_cache=True,
                                                       logits_to_keep=1).logits, warmup=False)["peak"]

    for batch, prompt in [(2, 1024), (3, 512)]:
        parts = budget_activations.mla_expand_bytes(s, batch, prompt + 1, 2, "eager")
        assert parts[0] == batch * (prompt + 1) * 8 * (32 + 32) * 2 and parts[2] == batch * (prompt + 1) * 8 * 32 * 2
        pred = sum(parts) + budget.activation_bytes(cfg, 1, batch, attention="eager", device="cpu", cached=True)["peak"]
        meas = step_peak(batch, prompt)
        assert abs(pred - meas) <= 0.03 * meas, f"{batch}×{prompt}: predicted {pred:,.0f} B, measured {meas:,.0f} B"
    one = budget_activations.mla_expand_bytes(s, 1, 1025, 2, "eager")
    assert one[2] == 0
    meas = step_peak(1, 1024)
    assert sum(one) < meas < sum(one) + 1025 * 8 * 32 * 2      # the expansion, and no value copy at batch 1
    assert budget_activations.mla_expand_bytes(Shape.from_config(CONFIGS["llama"]()), 2, 100, 2, "eager") == ()
