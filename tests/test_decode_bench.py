"""What engines do around the int4 kernel (helpers.decode_bench.Recipe): fused projections and the bytes a
decode step reads — checked on tiny models on the CPU; the speed itself is measured by benchmarks/decode.py."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers import decode_bench
from helpers.measure import module_bytes


def tiny_llama(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(LlamaConfig(**{**cfg, **kw})).eval()


def test_fused_projections_compute_the_same_function_with_four_matmuls_per_layer():
    m = tiny_llama()
    f = decode_bench.fused_projections(m)
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(m(ids).logits, f(ids).logits)       # the same columns of the same products
    names = {n.split(".")[-1] for n, mod in f.named_modules() if isinstance(mod, torch.nn.Linear)}
    assert names == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}
    linears = sum(isinstance(mod, torch.nn.Linear) for mod in f.model.layers[0].modules())
    assert linears == 4                                         # q|k|v, o, gate|up, down (Llama's: 7)
    assert module_bytes(f) == module_bytes(m)                  # the same bytes, joined
    qkv = f.model.layers[1].self_attn.qkv_proj.weight
    src = m.model.layers[1].self_attn
    assert torch.equal(qkv, torch.cat([src.q_proj.weight, src.k_proj.weight, src.v_proj.weight]))


def test_fused_projections_keep_mistrals_sliding_window():
    """Mistral is Llama with a sliding window: fused, the same logits on a sequence longer than the window
    (so the window matters: without it the logits differ, checked)."""
    from transformers import MistralConfig, MistralForCausalLM
    torch.manual_seed(0)
    cfg = dict(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, head_dim=32)
    m = MistralForCausalLM(MistralConfig(**cfg, sliding_window=8)).eval()
    f = decode_bench.fused_projections(m)
    assert f.config.sliding_window == 8
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(m(ids).logits, f(ids).logits, atol=1e-5)
        f.config.sliding_window = None
        assert not torch.allclose(m(ids).logits, f(ids).logits, atol=1e-3)


def test_fused_projections_refuse_what_they_cannot_keep_the_same():
    with pytest.raises(ValueError, match="rope_type 'default' only"):
        decode_bench.fused_projections(tiny_llama(rope_parameters={
            "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}))
    with pytest.raises(ValueError, match="Llama- or Mistral-architecture"):
        decode_bench.fused_projections(tiny_llama(attention_bias=True))
    with pytest.raises(ValueError, match="Llama- or Mistral-architecture"):
        decode_bench.fused_projections(tiny_llama(head_dim=64))


def test_a_decode_step_reads_every_weight_but_the_input_embedding_table():
    m = tiny_llama()
    emb = 300 * 128 * 4                                          # fp32 input embedding: one row per token is read
    assert decode_bench.bytes_read_per_step(m) == module_bytes(m) - emb
    tied = tiny_llama(tie_word_embeddings=True)                  # the head reads the whole shared table
    assert decode_bench.bytes_read_per_step(tied) == module_bytes(tied) == module_bytes(m) - emb


def test_recipes_parse_from_their_labels_and_refuse_others():
    for label in ("plain", "fused", "head", "fused+head", "attn", "fused+head+attn"):
        assert decode_bench.Recipe.parse(label).label == label
    assert decode_bench.Recipe.parse("head+fused") == decode_bench.Recipe(fused=True, head=True)
    assert decode_bench.Recipe.parse("attn+fused") == decode_bench.Recipe(fused=True, attn=True)
    for bad in ("", "fast", "fused+lm_head"):
        with pytest.raises(ValueError, match="recipe must be 'plain'"):
            decode_bench.Recipe.parse(bad)
    with pytest.raises(TypeError, match="Recipe.parse"):
        decode_bench.build("Llama-3.2-1B", "bf16", recipe="fused")
    with pytest.raises(ValueError, match="fmt must be one of"):
        decode_bench.build("Llama-3.2-1B", "int4")


def test_the_attn_step_runs_the_fused_model_through_the_split_kv_kernel(monkeypatch):
    """Recipe ``attn`` on the fused (Phi-3 class) model: transformers' own switch takes the kernel, and the
    decode step's logits stay SDPA's (one step on a static cache; the kernel in Triton's interpreter on a CPU)."""
    from transformers import StaticCache

    from helpers import decode_attention

    dev = "cuda" if torch.cuda.is_available() else "cpu"     # the kernel takes CUDA tensors, or the interpreter's

    def logits(model):
        ids = torch.randint(0, 300, (1, 20), generator=torch.Generator().manual_seed(2)).to(dev)
        cache = StaticCache(config=model.config, max_cache_len=32)
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(20, device=dev))
            return model(input_ids=ids[:, -1:], past_key_values=cache,
                         cache_position=torch.tensor([20], device=dev)).logits
    want = logits(decode_bench.fused_projections(tiny_llama()).to(dev))
    ours = decode_bench.fused_projections(tiny_llama()).to(dev)
    decode_attention.use(ours)
    assert ours.config._attn_implementation == decode_attention.NAME
    calls = []
    real = decode_attention.decode_attention
    monkeypatch.setattr(decode_attention, "decode_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    torch.testing.assert_close(logits(ours), want, rtol=1e-4, atol=1e-4)
    assert len(calls) == 2                                       # the decode step's two layers


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.profiler's kernel times need a CUDA device")
def test_step_profile_splits_a_step_into_named_kernels():
    model = tiny_llama().to("cuda", torch.bfloat16)
    prof = decode_bench.step_profile(model, batch=2, prompt=24, top_n=5)
    assert prof["kernel_us"] == pytest.approx(sum(prof["us"].values()))
    assert 0 < prof["kernel_us"] < prof["wall_us"] and prof["kernels"] > 10
    assert len(prof["top"]) == 5 and prof["top"][0]["us"] == max(t["us"] for t in prof["top"])
    assert all(t["category"] == decode_bench.kernel_category(t["kernel"]) for t in prof["top"])


def test_decode_benchmark_reads_one_kernel_family_or_a_list():
    """benchmarks.decode.kernel_families (--family): an object laid over --family-from's family, or a list
    of them, one build of our W4 format each; '{}' keeps the base; each says which one-row kernel it runs
    (PREPARED: the default since round 14, or the GEMV its switches ask for); anything else is refused by name."""
    from benchmarks.decode import kernel_families
    base = {"HALF2": True}
    assert kernel_families("{}") == [{"PREPARED": True}]
    assert kernel_families("{}", base) == [{"PREPARED": False, "HALF2": True}]
    assert kernel_families('{"UNEVEN": true}', base) == [{"PREPARED": False, "HALF2": True, "UNEVEN": True}]
    assert kernel_families('[{"PREPARED": false}, {}, {"PAD": true}]') == [
        {"PREPARED": False}, {"PREPARED": True}, {"PREPARED": True, "PAD": True}]
    for bad in ("[]", "[1]", '"x"', "{UNEVEN: true}"):
        with pytest.raises(ValueError, match="--family"):
            kernel_families(bad)
