"""helpers.widgets: what the 01 widget predicts and, on CUDA, measures for every weight and KV setting."""
import pytest
import torch

from helpers import budget, kvcache, models, widgets


def test_every_kv_setting_has_a_cache_to_measure_with():
    assert set(widgets.KV_CACHE_KIND.values()) <= set(kvcache.KV_KINDS)
    assert set(widgets.MEASURED_WEIGHTS) <= set(budget.WEIGHT_FORMATS)


def test_without_cuda_the_point_says_it_predicts_only():
    p = widgets.budget_point("SmolLM2-135M", 512, 2, "int4", "fp8", measure_on_device=False)
    assert p["measured_peak"] is None and "prediction only" in p["note"]
    # SmolLM2's 576-wide inputs take g64, not g128: the prediction uses the group the W4 layer can use
    assert p["weight_format"] == "int4-g64"
    assert p["parts"] == budget.budget(models.architecture_config("SmolLM2-135M"), "int4-g64", 512, 2, "fp8",
                                       new_tokens=16)
    assert widgets.int4_format(models.architecture_config("Llama-3.2-1B")) == ("int4", 128)


def test_a_format_without_a_layer_is_predicted_only_and_says_why():
    p = widgets.budget_point("SmolLM2-135M", 512, 2, "int8", "bf16", measure_on_device=True)   # returns before loading
    assert p["measured_peak"] is None and "no int8 layer" in p["note"]


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="kv_dtype"):
        widgets.budget_point("SmolLM2-135M", 512, 2, "bf16", "int2")
    with pytest.raises(ValueError, match="measured formats"):
        widgets.load_measured("SmolLM2-135M", "int8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200)")
def test_int4_weights_and_fp8_kv_are_measured_on_the_gpu():
    ex = widgets.BudgetExplorer()
    bf16 = ex.point("SmolLM2-135M", 1024, 4, "bf16", "bf16")
    w4 = ex.point("SmolLM2-135M", 1024, 4, "int4", "fp8")
    assert bf16["measured_peak"] and w4["measured_peak"]
    # the linears shrink to 4.25 bits; the embedding (tied lm_head) stays bf16
    assert w4["measured_weights"] < bf16["measured_weights"]
    assert w4["measured_weights"] == pytest.approx(w4["parts"]["weights"], rel=0.05)


def test_kv_widget_without_cuda_predicts_and_says_so(capsys):
    pytest.importorskip("ipywidgets")
    w = widgets.kv_widget(("SmolLM2-135M",), model=torch.nn.Linear(2, 2))
    w.update()
    if not torch.cuda.is_available():
        out = capsys.readouterr().out
        assert "predicted" in out and "Predicted only" in out
    c = models.architecture_config("SmolLM2-135M")
    assert widgets.kv_formats(c, 512, 2) == widgets.kv_formats("SmolLM2-135M", 512, 2)


def test_kv_widget_on_a_gpu_measures_only_when_ticked(monkeypatch, capsys):
    pytest.importorskip("ipywidgets")
    calls = []
    monkeypatch.setattr(widgets, "has_cuda", lambda: True)
    monkeypatch.setattr(widgets, "kv_point", lambda *a, **k: calls.append(a) or {"cap_gib": 1.0, "rows": []})
    model = torch.nn.Linear(2, 2)
    model.config = models.architecture_config("SmolLM2-135M")
    w = widgets.kv_widget(("SmolLM2-135M",), model=model)
    w.update()
    assert not calls and "Tick 'measure'" in capsys.readouterr().out      # the first render measures nothing
    w.children[2].value = True                        # ticking "measure" re-runs the view, now measuring
    assert len(calls) == 1 and "measured on this GPU" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200)")
def test_kv_point_measures_peaks_and_oom_points_per_format():
    model = models.model_from_config("SmolLM2-135M", device="cuda", dtype=torch.bfloat16)
    m = widgets.kv_point(model, 512, 8, extra=64)          # up to 64 + 512 tokens
    rows = {r["kv"]: r for r in m["rows"]}
    assert set(rows) == {"baseline", "fp8-e4m3", "int4"} and all(r["peak"] for r in rows.values())
    assert rows["baseline"]["ran_out"] and rows["baseline"]["tokens_before_oom"] >= 64   # 64 tokens + the prefill's room
    assert rows["int4"]["tokens_before_oom"] >= rows["fp8-e4m3"]["tokens_before_oom"] >= rows["baseline"]["tokens_before_oom"]


def test_kv_formats_say_not_stored_for_mla_latents():
    vals = widgets.kv_formats("DeepSeek-V2-Lite", 512, 2)
    assert vals["bf16"] > 0 and vals["fp8"] != vals["fp8"] and vals["int4 (g64)"] != vals["int4 (g64)"]   # NaN
