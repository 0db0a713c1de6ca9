"""Notebook 09's measurements (helpers.clinic): CPU parts everywhere, real OOM diagnoses on a GPU."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers import allocator_ops, allocator_replay, allocator_sim, clinic, models
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


def test_simulated_oom_verdicts_holes_larger_and_smaller_than_a_page():
    seqs = clinic.holes_sequences()
    big, small = seqs["64 MiB holes"], seqs["16 MiB holes"]
    frag = clinic.simulated_oom(*big)
    assert frag["oom"] and frag["verdict"] == "fragmentation"
    assert not clinic.simulated_oom(*big, expandable=True)["oom"]         # whole 20 MiB pages in each hole
    for exp in (False, True):                                              # no whole page in a 16 MiB hole
        r = clinic.simulated_oom(*small, expandable=exp)
        assert r["oom"] and r["verdict"] == "fragmentation", (exp, r["verdict"])
    assert len(frag["trace"]) == len(big[0]) - 1                          # one point per op that ran


def test_fenced_cycles_grow_only_with_max_split_and_expandable():
    ops = allocator_ops.fenced_cycles_sequence(cycles=6)
    res = {(e, m): allocator_sim.simulate(ops, expandable=e, max_split_size=m)["reserved"]
           for e in (False, True) for m in (None, 128 * MiB)}
    alone = max(res[(False, None)], res[(False, 128 * MiB)], res[(True, None)])
    assert res[(True, 128 * MiB)] > 4 * alone
    with pytest.raises(ValueError, match="max_split_mb"):
        allocator_replay.run_real(ops, max_split_mb=10)


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


def test_gpu_share_refuses_bad_sizes(capsys):
    from helpers import gpu_share
    with pytest.raises(SystemExit):
        gpu_share.main(["hold", "--gib", "-1"])
    assert "--gib must be a positive" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"participants\[0\] must be \(cap GiB, wanted GiB\)"):
        clinic.shared_gpu_demo([(4.0,)])
    with pytest.raises(ValueError, match="gib must be a positive"):
        with clinic.other_process(float("nan")):
            pass


def _small_gpu_model():
    return models.model_from_config("SmolLM2-135M", device="cuda", dtype=torch.bfloat16)


@cuda
def test_real_ooms_are_diagnosed_right_alone_and_beside_another_process():
    from helpers.measure import free_memory
    for holder in (None, 8.0):
        small = _small_gpu_model()
        scenarios = clinic.real_oom_scenarios(small) + [clinic.device_full_scenario()]
        if holder is None:
            rows = clinic.diagnose_real_ooms(scenarios, progress=False)
        else:
            with clinic.other_process(holder):
                rows = clinic.diagnose_real_ooms(scenarios, progress=False)
        del small
        free_memory()
        assert all(r["ok"] for r in rows), [(r["scenario"], r["verdict"], r["why"]) for r in rows if not r["ok"]]


@cuda
def test_shared_gpu_caps_isolate_participants_unless_lifted():
    rows = clinic.shared_gpu_demo([(2.0, 1.0), (2.0, 4.0), (2.0, 4.0)], lift=(2,))
    assert not rows[0]["oom"] and rows[0]["got_gib"] == 1.0
    assert rows[1]["oom"] and rows[1]["got_gib"] <= 2.0
    assert not rows[2]["oom"] and rows[2]["got_gib"] == 4.0                # its own code lifted the cap
    if rows[0]["process_bytes"] is not None:
        assert rows[0]["non_torch_bytes"] > 0


def test_group_sweep_and_task_drops_on_a_tiny_model():
    m = tiny_model()
    ids = torch.randint(0, 128, (2048,), generator=torch.Generator().manual_seed(3))
    rows = clinic.group_sweep(m, ids, bits=3, groups=(32, None), max_tokens=512, seq_len=128)
    assert [r["group"] for r in rows] == [32, "per channel"] and all(r["ppl"] > 1 for r in rows)
    assert rows[0]["bits_per_weight"] > rows[1]["bits_per_weight"]
    before = m.model.layers[0].mlp.up_proj.weight.clone()
    drops = clinic.task_drops(m, ids, QuantSpec(3, 32), n=4, span=16, max_tokens=512, seq_len=128)
    assert [r["model"] for r in drops] == ["reference", "W3 g32, attention only", "W3 g32, MLP only"]
    assert torch.equal(before, m.model.layers[0].mlp.up_proj.weight)      # the variants are copies
    text = clinic.rankings(drops)
    assert text.startswith("perplexity ranks ") and "the copy task ranks" in text


def test_gpu_share_command_and_result_line():
    from helpers import gpu_share
    argv, env = gpu_share.command("hold", "--gib", 8)
    assert argv[1:4] == ["-m", "helpers.gpu_share", "hold"] and argv[-1] == "8"
    from pathlib import Path
    assert (Path(env["PYTHONPATH"].split(":")[0]) / "helpers" / "gpu_share.py").is_file()   # the course's folder first
    assert gpu_share.last_json('noise\n{"a": 1}\n{"b": 2}\n') == {"b": 2} and gpu_share.last_json("none") is None
    with pytest.raises(ValueError, match="role must be"):
        gpu_share.command("sleep")


def test_the_device_full_case_is_refused_on_a_shared_card(monkeypatch):
    from helpers import device, measure
    views = lambda used, process: (lambda index=0: {"device_used": used, "process": process,
                                                    "others": None if process is None else used - process})
    monkeypatch.setattr(device, "cap_gib", lambda: None)
    monkeypatch.setattr(measure, "views", views((600 + 900) * MiB, 900 * MiB))
    assert clinic.why_not_fill_the_card() is None                   # alone: the driver's 600 MiB only
    monkeypatch.setattr(measure, "views", views(900 * MiB + 5 * GiB, 900 * MiB))
    assert "other processes hold 5.0 GiB" in clinic.why_not_fill_the_card()
    assert clinic.why_not_fill_the_card(others_gib=6) is None
    monkeypatch.setattr(measure, "views", views(900 * MiB + 5 * GiB, None))
    assert clinic.why_not_fill_the_card() is None                   # nothing to judge by: NVML cannot say
    monkeypatch.setattr(device, "cap_gib", lambda: 15.0)
    assert "COURSE_GPU_CAP_GIB=15" in clinic.why_not_fill_the_card()
    with pytest.raises(ValueError, match="others_gib"):
        clinic.why_not_fill_the_card(others_gib=0)


@cuda
def test_the_device_full_case_is_refused_beside_another_process():
    assert clinic.why_not_fill_the_card() is None
    with clinic.other_process(4.0):
        assert "other processes hold" in clinic.why_not_fill_the_card()
