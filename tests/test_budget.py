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


@pytest.mark.parametrize("name", ["SmolLM2-135M", "Qwen2.5-0.5B", "TinyLlama-1.1B", "Llama-3.1-8B"])
def test_param_counts_match_meta_models(name):
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
    eager = B.activation_bytes(c, 100, 2, attention="eager")["attention"]
    assert eager - a["attention"] == 2 * 2 * 9 * 100 ** 2 * 2


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
