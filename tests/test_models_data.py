import pytest
import torch

from helpers import budget, data, models


def test_parse_dtype():
    assert models.parse_dtype("bf16") is torch.bfloat16 and models.parse_dtype("torch.float16") is torch.float16
    with pytest.raises(ValueError, match="unknown dtype"):
        models.parse_dtype("float12")


def test_unknown_model_name(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models.hub_available.cache_clear()
    with pytest.raises(ValueError, match="unknown model"):
        models.resolve_model_name("not a model")
    with pytest.raises(RuntimeError, match="hub cannot be reached"):
        models.resolve_model_name("org/some-model")
    models.hub_available.cache_clear()


def test_dir_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.resolve_model_name(str(tmp_path))


def test_unknown_architecture():
    with pytest.raises(ValueError, match="unknown architecture"):
        models.architecture_config("GPT-9")


def test_architectures_match_real_parameter_counts():
    cfg = models.architecture_config("SmolLM2-135M")
    assert budget.meta_param_count(cfg) == 134_515_008


# the sizes the models' cards and hub pages publish (total parameters, experts included)
PUBLISHED = {"Gemma-3-1B": 1.00e9, "OLMo-2-1B": 1.48e9, "SmolLM3-3B": 3.08e9, "Qwen3-30B-A3B": 30.5e9,
             "gpt-oss-20b": 20.9e9, "Command-R7B": 8.03e9, "Granite-3.1-2B": 2.53e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_new_architectures_build_on_meta_and_have_their_published_size(name):
    """Each added architecture builds on the meta device from its config and counts what its card says
    (within 1 %, the rounding of a published "1.48B"); the hand formula agrees exactly."""
    cfg = models.architecture_config(name)
    n = budget.meta_param_count(cfg)
    assert abs(n / PUBLISHED[name] - 1) < 0.01, f"{name}: {n:,} parameters, published {PUBLISHED[name]:,.0f}"
    assert budget.param_counts(cfg)["total"] == n


def test_offline_model_and_local_dir_path(offline_model, tmp_path):
    model, tok = offline_model
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert models.is_offline_q4_1(model)
    # a locally saved transformers directory goes through the same hub-style from_pretrained path
    small = models.model_from_config(models.architecture_config("SmolLM2-135M"), dtype=torch.float32)
    small.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    m2, t2 = models.load_model(str(tmp_path), device="cpu", dtype="fp32", echo=False)
    assert torch.equal(m2.model.embed_tokens.weight, small.model.embed_tokens.weight)
    ids = t2("Hello world", return_tensors="pt").input_ids
    assert m2(ids).logits.shape == (1, ids.shape[1], 49152)


def test_missing_text_file(monkeypatch, tmp_path):
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "nope.raw"))
    with pytest.raises(FileNotFoundError, match="COURSE_WIKITEXT"):
        data.load_text("eval")


def test_bad_split(text_available):
    with pytest.raises(ValueError, match="unknown split"):
        data.load_text("train")


def test_splits_are_disjoint_and_deterministic(text_available):
    ev, cal, all_ = data.load_text("eval"), data.load_text("calib"), data.load_text("all")
    assert all_ == ev + "\n" + cal
    rows = data.text_rows()
    cut = int(len(rows) * data.EVAL_FRACTION)
    assert ev == "\n".join(rows[:cut]) and cal == "\n".join(rows[cut:])  # disjoint paragraph ranges
    assert data.load_text("eval") == ev


def test_tokens_cached_and_calibration(text_available, offline_model, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    _, tok = offline_model
    a = data.tokens(tok, "calib")
    assert list(tmp_path.joinpath("tokens").glob("calib-*.pt"))
    assert torch.equal(a, data.tokens(tok, "calib"))
    b1, b2 = data.calibration_batch(tok, 4, 128, seed=1), data.calibration_batch(tok, 4, 128, seed=1)
    assert b1.shape == (4, 128) and torch.equal(b1, b2)
    with pytest.raises(ValueError, match="positive"):
        data.calibration_batch(tok, 0, 128)


def test_default_dtype_follows_native_bf16(monkeypatch):
    import torch

    from helpers import models
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)     # what a T4 reports (emulated)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert models.default_dtype(torch.device("cuda")) == torch.float16
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert models.default_dtype(torch.device("cuda")) == torch.bfloat16
    assert models.default_dtype(torch.device("cpu")) == torch.float32


def test_keep_first_layers_cuts_model_and_config(tiny_llama_factory):
    from helpers.models import decoder_layers, keep_first_layers
    m = tiny_llama_factory(layers=3)
    m.config._name_or_path = "/somewhere/with/the/whole/config"
    first = decoder_layers(m)[0]
    keep_first_layers(m, 2)
    assert len(decoder_layers(m)) == 2 and decoder_layers(m)[0] is first and m.config.num_hidden_layers == 2
    assert m.config._name_or_path == ""   # nothing re-reads the 3-layer config.json (llm-compressor would)
    import torch
    assert m(torch.randint(0, 128, (1, 8))).logits.shape == (1, 8, 128)
    for bad in (0, 3, 2.0, True):
        with pytest.raises(ValueError, match="n must be an int in \\[1, 2\\]"):
            keep_first_layers(m, bad)


def test_random_ids_are_ordinary_ids_reproducible_on_any_device():
    a = data.random_ids(50, (4, 300), seed=3)
    assert a.shape == (4, 300) and a.dtype == torch.long
    assert int(a.min()) >= data.FIRST_ORDINARY_ID and int(a.max()) <= 50 - 2
    assert torch.equal(a, data.random_ids(50, (4, 300), seed=3)) and not torch.equal(a, data.random_ids(50, (4, 300), seed=4))
    with pytest.raises(ValueError, match="vocab_size"):
        data.random_ids(4, (2, 2))
    with pytest.raises(ValueError, match="shape"):
        data.random_ids(50, (2, 0))
