"""helpers.budget_check on the CPU: the measurement points, the grid's order, and the re-prediction of a
recorded file (the measuring itself needs a CUDA device: benchmarks/budget_accuracy.py)."""
import json

import pytest
import torch

from helpers import budget, budget_check, budget_replay, models
from helpers.budget_check import Point, grid_points

RECORDED = {"model": "SmolLM2-135M", "attention": "sdpa", "seq_len": 512, "batch": 1, "new_tokens": 32,
            "weights_meas": 269054976, "cublas_workspace": 68157440, "kv_meas": 12510720, "peak_meas": 19015680,
            "reserved_meas": 387973120, "non_torch": 786432000, "smi_meas": 1176502272}


def test_point_checks_its_fields_and_reads_a_row():
    p = Point("SmolLM2-135M", "eager", 512, 2)
    assert p.new_tokens == budget_check.NEW_TOKENS
    assert Point.from_row({"model": "SmolLM2-135M", "seq_len": 512, "batch": 2, "new_tokens": 32}) == \
        Point("SmolLM2-135M", "sdpa", 512, 2, 32)          # rows recorded before the attention key: SDPA
    assert p.key_fields() == {"model": "SmolLM2-135M", "attention": "eager", "seq_len": 512, "batch": 2}
    with pytest.raises(ValueError, match="unknown architecture"):
        Point("GPT-9", "sdpa", 512, 1)
    with pytest.raises(ValueError, match="attention must be one of"):
        Point("SmolLM2-135M", "flash", 512, 1)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        Point("SmolLM2-135M", "sdpa", 512, 0)


def test_grid_points_in_measurement_order():
    pts = grid_points(["SmolLM2-135M", "Qwen2.5-0.5B"], [(512, 1), (2048, 4)], attentions=("sdpa", "eager"))
    assert [(p.arch, p.attention, p.seq_len, p.batch) for p in pts[:3]] == \
        [("SmolLM2-135M", "sdpa", 512, 1), ("SmolLM2-135M", "sdpa", 2048, 4), ("SmolLM2-135M", "eager", 512, 1)]
    assert len(pts) == 8 and len(grid_points()) == len(budget_check.ARCHS) * 2 * len(budget_check.GRID)
    with pytest.raises(TypeError, match="budget_check.Point"):
        budget_check.predicted_vs_measured([("SmolLM2-135M", 512, 1)])
    with pytest.raises(TypeError, match="static"):
        budget_check.predicted_vs_measured(pts, static="no")


def test_repredict_rewrites_only_the_predictions(tmp_path):
    path = tmp_path / "rows.json"
    error = {"model": "SmolLM2-135M", "attention": "eager", "error": "no such attention"}
    path.write_text(json.dumps([RECORDED, error]))
    row, kept = budget_check.repredict(path)
    assert kept == error and json.loads(path.read_text()) == [row, error]
    assert {k: row[k] for k in RECORDED} == RECORDED                        # the measured fields as measured
    cfg = models.architecture_config("SmolLM2-135M")
    gen = budget.generation_peak(cfg, 512, 32, 1, score_copies=1)    # measure_generate's min_new_tokens
    foot = budget_replay.device_footprint(cfg, 512, 32, 1, RECORDED["non_torch"], workspace_bytes=RECORDED["cublas_workspace"])
    assert (row["peak_pred"], row["kv_pred"], row["decode_pred"]) == (int(gen["peak"]), int(gen["kv"]), int(gen["decode"]))
    assert (row["reserved_pred"], row["smi_pred"]) == (foot["reserved"], foot["total"])
    assert row["weights_pred"] == budget_replay.weight_allocation(cfg)


def test_cpu_prefill_ids_are_data_random_ids():
    """The prompt cpu_prefill_peak feeds is helpers.data.random_ids' (the same draw as the CPU generator
    torch.randint it replaced), so the measured peaks in tests/test_budget_measured.py stay comparable."""
    from helpers.data import random_ids
    seen = {}

    class Model(torch.nn.Module):
        config = type("C", (), {"vocab_size": 1000})()

        def forward(self, ids, **_):
            seen["ids"] = ids
            return type("Out", (), {"logits": torch.zeros(1)})()
    budget_check.cpu_prefill_peak(Model(), 16, 2, seed=5)
    assert torch.equal(seen["ids"], random_ids(1000, (2, 16), seed=5))
    assert torch.equal(seen["ids"], torch.randint(3, 999, (2, 16), generator=torch.Generator().manual_seed(5)))


def test_an_architecture_level_error_row_is_echoed_not_raised(capsys):
    # an attention implementation the model lacks is one row without seq_len/batch (GPT-OSS has no SDPA)
    from helpers.budget_check import _echo
    _echo({"model": "gpt-oss-20b", "attention": "sdpa", "error": "ValueError: no SDPA"})
    assert "ERROR ValueError: no SDPA" in capsys.readouterr().out


def test_merge_rows_replaces_points_and_keeps_the_rest():
    from helpers.budget_check import merge_rows
    old = [{"model": "a", "attention": "sdpa", "seq_len": 512, "batch": 1, "peak_meas": 1},
           {"model": "a", "attention": "eager", "seq_len": 512, "batch": 1, "peak_meas": 2},
           {"model": "g", "attention": "sdpa", "error": "no SDPA"}]
    new = [{"model": "a", "attention": "eager", "seq_len": 512, "batch": 1, "peak_meas": 3},
           {"model": "g", "attention": "sdpa", "error": "still no SDPA"},
           {"model": "b", "attention": "sdpa", "seq_len": 2048, "batch": 8, "peak_meas": 4}]
    rows = merge_rows(old, new)
    assert [r.get("peak_meas") for r in rows] == [1, 3, None, 4]
    assert rows[2]["error"] == "still no SDPA"


def live_bytes(ops):
    """(peak, final) live bytes of allocator-simulator ops, counted without the allocator's rounding."""
    live, now, peak = {}, 0, 0
    for op in ops:
        if op[0] == "alloc":
            live[op[1]] = op[2]
            now += op[2]
            peak = max(peak, now)
        elif op[0] == "free":
            now -= live.pop(op[1])
    return peak, now, set(live)


def test_norm_ops_hold_two_fp32_copies_and_leave_the_normed_tensor():
    from helpers.budget_replay import norm_ops
    peak, final, alive = live_bytes(norm_ops("ln", 1000, 2))
    assert peak == 2 * 1000 * 4 and final == 1000 * 2 and alive == {"ln"}


def test_mlp_ops_split_a_gated_mlp_and_keep_the_formula_peak():
    """A dense gated pre-norm MLP (Llama) becomes its tensors, peaking at the block_transients bytes
    n·(h + 3·I)·b and leaving nothing; so does a fused gate|up MLP (Phi-3, n·(h + 4·I)·b, its 2·I
    gate_up block: budget_replay.fused_mlp_ops); a post-norm one (OLMo-2) stays one block."""
    from helpers import budget_activations, budget_replay
    from helpers.budget_layout import Layout, meta_model
    from helpers.budget_shape import Shape
    for arch, split in (("Llama-3.2-1B", True), ("Phi-3-mini", True), ("OLMo-2-1B", False)):
        cfg = models.architecture_config(arch)
        s = Shape.from_config(cfg)
        lay = Layout.from_model(meta_model(cfg, torch.bfloat16), s)
        mlp = int(budget_activations.block_transients(s, lay, 64, 2, torch.bfloat16, "sdpa", "cuda")["mlp"])
        ops = budget_replay.mlp_ops("mlp", s, lay, 128, 2, mlp)
        peak, final, _ = live_bytes(ops)
        assert (len(ops) > 2) == split and final == 0
        assert peak == (max(mlp, 8 * 128 * s.hidden) if split else mlp)


def test_phi3_sets_a_long_prompts_given_cache_aside_and_kv_is_read_from_the_one_used():
    """transformers' Phi-3 drops a given cache when the prompt passes original_max_position_embeddings
    (here 32): measure_generate reads the KV bytes of the cache generate ended with and says it was not
    the one passed in — a static cache asked for there does not run. sets_cache_aside predicts it."""
    from transformers import Phi3Config, Phi3ForCausalLM

    from helpers import generation
    cfg = Phi3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, max_position_embeddings=32, original_max_position_embeddings=32,
                     sliding_window=15, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = Phi3ForCausalLM(cfg).eval()
    for prompt in (20, 40):
        for cache in ("baseline", "static"):
            m = generation.measure_generate(model, prompt, 1, 4, cache=cache)
            assert m["cache_used"] == (not budget_check.sets_cache_aside(cfg, prompt)) == (prompt < 33)
            assert m["kv_meas"] > 0 and m["new_tokens"] == 4
    phi3 = models.architecture_config("Phi-3-mini")
    assert not budget_check.sets_cache_aside(phi3, 4096) and budget_check.sets_cache_aside(phi3, 8192)
    assert budget_check.sets_cache_aside(phi3, 4090, 8) and not budget_check.sets_cache_aside(phi3, 4090, 7)
    m = generation.measure_generate(model, 30, 1, 4)          # crosses 32 while decoding: set aside there
    assert not m["cache_used"] and budget_check.sets_cache_aside(cfg, 30, 4)
    assert not budget_check.sets_cache_aside(models.architecture_config("Mistral-7B"), 8192)


@pytest.mark.parametrize("static", [True, False])
def test_a_point_runs_the_static_generate_only_when_asked(monkeypatch, static):
    """predicted_vs_measured(static=False) (notebook 01's grid): one generate per point, the dynamic cache's,
    and no static field in the row; static=True a second generate with the static cache (its fields)."""
    calls = []
    measured = {"kv_meas": 1, "peak_meas": 2, "prefill_meas": 3, "decode_meas": 4, "prefill_requested": 3,
                "decode_requested": 4, "reserved": 5, "new_tokens": 32, "cache_used": True}

    def fake_guard(fn, model, seq_len, batch, new_tokens, cache):
        calls.append(cache)
        return {"ok": True, "result": measured}
    monkeypatch.setattr(budget_check.measure, "oom_guard", fake_guard)
    base = budget_check.Baseline(context=None, workspace=0, non_torch=None, weights_meas=1, weights_pred=1,
                                 weights_formula=1)
    row = budget_check._point(None, Point("SmolLM2-135M", "sdpa", 512, 1), base, static)
    assert calls == (["baseline", "static"] if static else ["baseline"])
    assert ("static_peak_meas" in row) is static and row["peak_meas"] == 2
