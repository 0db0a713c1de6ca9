"""Notebook 09's measurements (helpers.clinic): CPU parts everywhere, real OOM diagnoses on a GPU."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers import allocator_sim, clinic, models
from helpers.qspec import QuantSpec

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200)")
GiB, MiB = 2**30, 2**20


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2)).eval()


def test_generation_oom_point_grows_with_context_and_fp8_halves_kv():
    c = models.architecture_config("Llama-3.1-8B")
    rows = clinic.generation_oom_point(c, 24e9, 4, [2048, 8192]) + clinic.generation_oom_point(c, 24e9, 4, [8192], kv_dtype="fp8")
    assert rows[0]["fits"] and not rows[1]["fits"]
    assert rows[1]["kv_cache"] == pytest.approx(2 * rows[2]["kv_cache"], rel=1e-6)


def test_simulated_oom_verdicts():
    frag = clinic.simulated_oom(allocator_sim.fragmenting_sequence(), allocator_sim.fragmenting_cap())
    assert frag["oom"] and frag["verdict"] == "fragmentation"
    grow = clinic.simulated_oom(clinic.growth_sequence(), 700 * MiB)
    assert grow["oom"] and grow["verdict"] == "too-big"
    assert not clinic.simulated_oom(clinic.growth_sequence(n=3), 700 * MiB)["oom"]


def test_vocab_checks_seed_vs_right():
    qwen = clinic.vocab_checks(151665, 151643, 151936, 151664)
    assert not qwen["seed_check (vocab_size == rows)"] and qwen["right_check (len(tokenizer) <= rows)"]
    broken = clinic.vocab_checks(32001, 32000, 32000, 32000)
    assert not broken["right_check (len(tokenizer) <= rows)"] and not broken["max_id_in_range"]


def test_copy_task_and_rtn_part():
    m = tiny_model()
    ids = torch.randint(0, 128, (500,), generator=torch.Generator().manual_seed(0))
    r = clinic.copy_task(m, ids, n=4, span=16)
    assert 0 <= r["first_copy_acc"] <= 1 and 0 <= r["second_copy_acc"] <= 1 and r["prompts"] == 4
    before = m.model.layers[0].self_attn.q_proj.weight.clone()
    mlp_before = m.model.layers[0].mlp.up_proj.weight.clone()
    assert clinic.rtn_part(m, QuantSpec(2, 32), "attn") == 2 * 4
    assert not torch.equal(before, m.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(mlp_before, m.model.layers[0].mlp.up_proj.weight)
    with pytest.raises(ValueError, match="part must be"):
        clinic.rtn_part(m, QuantSpec(2, 32), "both")
    with pytest.raises(ValueError, match="at least n·span"):
        clinic.copy_task(m, ids[:10], n=4, span=16)


def test_kv_magnitudes_and_calibration_bytes():
    m = tiny_model()
    s = clinic.kv_magnitudes(m, torch.randint(0, 128, (2, 12)))
    assert s["max_abs_k"] > 0 and 0 <= s["k_subnormal"] <= 1
    c = models.architecture_config("Llama-2-70B")
    seq = clinic.calibration_held_bytes(c, 128, 512, 2, "sequential")
    assert seq == 2 * 128 * 512 * 8192 * 2
    assert clinic.calibration_held_bytes(c, 128, 512, 2, "all_layers") == seq * 81 // 2
    with pytest.raises(ValueError, match="hold must be"):
        clinic.calibration_held_bytes(c, 1, 1, 2, "some")


def test_fp8_support_text():
    assert "no FP8 tensor cores" in clinic.fp8_support((7, 5))
    assert "FP8 tensor cores" in clinic.fp8_support((9, 0)) and "no FP8" not in clinic.fp8_support((8, 9))
    assert "no CUDA device" in clinic.fp8_support(None)


def test_requested_bytes_parsing():
    assert clinic._requested_bytes("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0") == 2 * GiB
    assert clinic._requested_bytes("Tried to allocate 20.00 MiB") == 20 * MiB
    assert clinic._requested_bytes("something else") is None


@cuda
def test_real_ooms_are_diagnosed_right():
    from helpers import budget
    from helpers.device import memory_limit
    from helpers.measure import free_memory
    free_memory()
    tiny_cfg = models.architecture_config("TinyLlama-1.1B")
    with memory_limit(2.0):
        load = clinic.caught_oom(lambda: models.model_from_config("TinyLlama-1.1B", device="cuda", dtype=torch.float32),
                                 need=budget.weight_bytes(tiny_cfg, "fp32"))
    assert load["oom"] and load["branch"] == "too-big", load
    small = models.model_from_config("SmolLM2-135M", device="cuda", dtype=torch.bfloat16)
    w = torch.cuda.memory_allocated()
    with memory_limit(w / GiB + 0.5):
        dec = clinic.caught_oom(lambda m=small: clinic.decode_until_oom(m, batch=64, prompt_len=256, max_new=4096),
                                need=w + budget.kv_bytes(small.config, 256 + 4096, 64))
    assert dec["oom"] and dec["branch"] == "too-big", dec
    small = None
    free_memory()
    with memory_limit(torch.cuda.memory_reserved() / GiB + 17 * 16 / 1024):
        frag = clinic.caught_oom(clinic.fragment_on_gpu)
    assert frag["oom"] and frag["branch"] == "fragmentation"


@cuda
def test_shared_gpu_caps_isolate_participants():
    rows = clinic.shared_gpu_demo([(2.0, 1.0), (2.0, 4.0)])
    assert not rows[0]["oom"] and rows[0]["got_gib"] == 1.0
    assert rows[1]["oom"] and rows[1]["got_gib"] <= 2.0
