"""vLLM's start-up memory plan, re-implemented: checked against vLLM's own published log."""
import pytest
import torch

from helpers import engine_plan, models
from helpers.engine_plan import EngineStartupError, GiB, MemoryProfile

# vllm-project/vllm#12330 (Meta-Llama-3-8B, one A100 40GB, vLLM 0.6.x), verbatim log lines
LOG_12330 = """INFO 01-13 11:35:23 worker.py:241] the current vLLM instance can use total_gpu_memory (39.50GiB) x gpu_memory_utilization (0.90) = 35.55GiB
INFO 01-13 11:35:23 worker.py:241] model weights take 14.96GiB; non_torch_memory takes 0.10GiB; PyTorch activation peak memory takes 9.37GiB; the rest of the memory reserved for KV Cache is 11.12GiB.
INFO 01-13 11:35:23 gpu_executor.py:76] # GPU blocks: 5691, # CPU blocks: 2048
INFO 01-13 11:35:23 gpu_executor.py:80] Maximum concurrency for 8192 tokens per request: 11.12x"""


def llama3_8b():
    return models.architecture_config("Llama-3.1-8B")   # same KV shape as Llama-3-8B: 32 layers, 8 KV heads × 128


def test_block_bytes_of_llama3_8b():
    assert engine_plan.kv_bytes_per_token(llama3_8b()) == 32 * 2 * 8 * 128 * 2     # 128 KiB per token
    assert engine_plan.kv_bytes_per_token(llama3_8b(), "fp8") == 32 * 2 * 8 * 128


def test_plan_reproduces_vllm_log():
    parsed = engine_plan.parse_vllm_log(LOG_12330)
    per_token = engine_plan.kv_bytes_per_token(llama3_8b())
    p = engine_plan.plan(engine_plan.profile_from_log(parsed), per_token, parsed["max_model_len"])
    assert abs(p["kv_pool"] - parsed["kv_pool"]) <= 0.01 * GiB          # 35.55 − 14.96 − 0.10 − 9.37 = 11.12
    lo, hi = engine_plan.rounding_bounds(parsed, per_token)
    assert lo <= parsed["blocks"] <= hi and lo <= p["blocks"] <= hi      # 5691 inside what the rounding allows
    # from vLLM's own block count, our concurrency is its printed 11.12x
    assert round(parsed["blocks"] * 16 / parsed["max_model_len"], 2) == parsed["concurrency"]


def test_fp8_kv_doubles_blocks_and_quantized_weights_move_memory_to_kv():
    prof = MemoryProfile(total=80 * GiB, utilization=0.9, weights=15 * GiB, activation_peak=2 * GiB, non_torch=0.5 * GiB)
    bf16 = engine_plan.plan(prof, engine_plan.kv_bytes_per_token(llama3_8b()), 8192)
    fp8 = engine_plan.plan(prof, engine_plan.kv_bytes_per_token(llama3_8b(), "fp8"), 8192)
    assert fp8["blocks"] in (2 * bf16["blocks"], 2 * bf16["blocks"] + 1)
    w4 = engine_plan.plan(MemoryProfile(80 * GiB, 0.9, 5.7 * GiB, 2 * GiB, 0.5 * GiB),
                          engine_plan.kv_bytes_per_token(llama3_8b()), 8192)
    assert w4["kv_pool"] - bf16["kv_pool"] == pytest.approx(9.3 * GiB)


def test_startup_failures_say_what_vllm_says():
    per_token = engine_plan.kv_bytes_per_token(llama3_8b())
    with pytest.raises(EngineStartupError, match="No available memory for the cache blocks"):
        engine_plan.plan(MemoryProfile(16 * GiB, 0.9, 15 * GiB, 1 * GiB, 0.1 * GiB), per_token, 8192)
    with pytest.raises(EngineStartupError, match=r"max seq len \(131072\).*estimated maximum model length"):
        engine_plan.plan(MemoryProfile(24 * GiB, 0.9, 15 * GiB, 1 * GiB, 0.1 * GiB), per_token, 131072)


def test_bad_input():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        MemoryProfile(80 * GiB, 1.5, 1, 1, 1)
    with pytest.raises(ValueError, match="weights must be a non-negative"):
        MemoryProfile(80 * GiB, 0.9, -1, 1, 1)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        engine_plan.kv_bytes_per_token(llama3_8b(), "int3")
    with pytest.raises(ValueError, match="max_model_len must be a positive int"):
        engine_plan.plan(MemoryProfile(80 * GiB, 0.9, 1, 1, 1), 1024, 0)
    with pytest.raises(ValueError, match="no 'weights' field"):
        engine_plan.parse_vllm_log("total_gpu_memory (39.50GiB) x gpu_memory_utilization (0.90)")
    from transformers import MistralConfig
    with pytest.raises(ValueError, match="sliding-window"):
        engine_plan.kv_bytes_per_token(MistralConfig(sliding_window=4096))


def test_module_bytes_counts_each_storage_once_and_subclasses_by_what_they_wrap():
    from helpers.measure import module_bytes
    lin = torch.nn.Linear(256, 128, bias=True)
    assert module_bytes(lin) == 4 * (256 * 128 + 128)
    emb, head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64, bias=False)
    head.weight = emb.weight                                  # tied: one storage
    tied = torch.nn.ModuleDict({"emb": emb, "head": head})
    tied.register_buffer("view", emb.weight.data[:8])         # a view of it: the same storage
    assert module_bytes(tied) == 4 * 64 * 32
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got NoneType"):
        module_bytes(None)


def test_module_bytes_of_a_torchao_weight_is_its_packed_bytes_not_its_dense_size():
    pytest.importorskip("torchao")
    from helpers.measure import module_bytes
    models.quiet_torchao_import()
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    lin = torch.nn.Linear(256, 128, bias=False)
    quantize_(lin, Int8WeightOnlyConfig())
    assert lin.weight.untyped_storage().nbytes() == 4 * 256 * 128     # what a storage count would say
    inner = [getattr(lin.weight, n) for n in lin.weight.__tensor_flatten__()[0]]
    assert module_bytes(lin) == sum(t.numel() * t.element_size() for t in inner) < 256 * 128 + 128 * 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="measure_profile measures on a CUDA device")
def test_measure_profile_counts_the_models_bytes_not_other_live_tensors(monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from helpers.measure import module_bytes
    cfg = LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    other = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")   # an earlier cell's tensor, still live
    own = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])   # + rotary inv_freq
    with torch.no_grad():
        prof = engine_plan.measure_profile(model, 512, 0.9)
    assert prof.weights == module_bytes(model) == own
    assert prof.total == torch.cuda.mem_get_info()[1] and 0 < prof.activation_peak < 256 * 2**20
    monkeypatch.setenv("COURSE_GPU_GIB", "15")
    with torch.no_grad():
        assert engine_plan.measure_profile(model, 512, 0.9).total == 15 * GiB
    del other
