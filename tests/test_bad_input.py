"""Bad input at the doors of the public helpers, tried as a new user would.

Every case asserts a clear error: its type, and a message that names the argument (or file) and what
is wrong — or, where an input is legitimately accepted, what it means (``accepted`` cases)."""
import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from helpers import (
    allocator_sim,
    awq,
    budget,
    calib,
    data,
    device,
    evaluate,
    generation,
    gptq,
    key_numbers,
    kvcache,
    measure,
    models,
    quant,
    variants,
)
from helpers.qspec import QuantSpec

CFG = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)


def W(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------------------------ QuantSpec
SPEC_ERRORS = [
    (dict(bits=5), ValueError, "bits=5"),
    (dict(bits=0), ValueError, "bits=0"),
    (dict(bits=4.0), TypeError, "bits must be an integer"),
    (dict(bits="4"), TypeError, "bits must be an integer"),
    (dict(bits=True), TypeError, "bits must be an integer"),
    (dict(group_size=0), ValueError, "group_size must be a positive"),
    (dict(group_size=-64), ValueError, "group_size must be a positive"),
    (dict(group_size=64.0), TypeError, "group_size must be an integer"),
    (dict(group_size="64"), TypeError, "group_size must be an integer"),
    (dict(symmetric="yes"), TypeError, "symmetric must be True or False"),
    (dict(symmetric=1), TypeError, "symmetric must be True or False"),
]


@pytest.mark.parametrize("kw,exc,msg", SPEC_ERRORS)
def test_quantspec_refuses(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        QuantSpec(**kw)


def test_quantspec_accepts_numpy_and_torch_integers():  # accepted: integer types of any library
    s = QuantSpec(np.int64(4), np.int32(64))
    assert (s.bits, s.group_size) == (4, 64) and type(s.bits) is int
    assert QuantSpec(torch.tensor(3).item(), None).label == "w3ch"


def test_quantspec_of_refuses_both_forms():
    with pytest.raises(TypeError, match="either spec= or"):
        QuantSpec.of(QuantSpec(), bits=3)
    with pytest.raises(TypeError, match="spec must be a QuantSpec"):
        QuantSpec.of({"bits": 4})


def test_group_that_does_not_divide_names_allowed_sizes():
    with pytest.raises(ValueError, match=r"group_size=128 does not divide the 576.*\[16, 32, 64\]"):
        QuantSpec(4, 128).group_for(576)


# ---------------------------------------------------------------------------------------- quant
QUANT_ERRORS = [
    (lambda: quant.quantize_tensor(W(4, 64), group_size=-64), ValueError, "group_size must be a positive"),
    (lambda: quant.quantize_tensor(W(4, 64), group_size=0), ValueError, "group_size must be a positive"),
    (lambda: quant.quantize_tensor(W(4, 64), group_size=None), ValueError, "None means per channel"),
    (lambda: quant.quantize_tensor(W(4, 64), bits=16), ValueError, "bits=16"),
    (lambda: quant.quantize_tensor(W(64), bits=4), ValueError, "2-D weight"),
    (lambda: quant.quantize_tensor(W(2, 4, 64)), ValueError, "2-D weight"),
    (lambda: quant.quantize_tensor([[1.0, 2.0]]), TypeError, "floating torch.Tensor"),
    (lambda: quant.quantize_tensor(torch.ones(4, 64, dtype=torch.int64)), TypeError, "floating"),
    (lambda: quant.quantize_tensor(W(4, 64), granularity="row"), ValueError, "unknown granularity"),
    (lambda: quant.pack_codes(torch.tensor([0.5, 1.0]), 4), ValueError, "codes must be integers"),
    (lambda: quant.pack_codes(torch.tensor([-1, 2]), 4), ValueError, r"must lie in \[0, 15\]"),
    (lambda: quant.pack_codes(torch.tensor([16]), 4), ValueError, r"must lie in \[0, 15\]"),
    (lambda: quant.pack_codes([1, 2], 4), TypeError, "codes must be a torch.Tensor"),
    (lambda: quant.pack_codes(torch.tensor([1, 2]), 5), ValueError, "bits=5"),
    (lambda: quant.unpack_codes(torch.zeros(4, dtype=torch.uint8), 4, 9), ValueError, "numel=9 does not fit"),
    (lambda: quant.unpack_codes(torch.zeros(4, dtype=torch.uint8), 4, -1), ValueError, "numel=-1"),
    (lambda: quant.unpack_codes(torch.zeros(4, dtype=torch.int32), 4, 2), TypeError, "uint8"),
    (lambda: quant.unpack_codes(torch.zeros(4, dtype=torch.uint8), 3, 8), ValueError, "does not fit"),
    (lambda: quant.bits_per_weight(4, 0), ValueError, "group_size must be a positive"),
    (lambda: quant.bits_per_weight(4, -128), ValueError, "group_size must be a positive"),
    (lambda: quant.bits_per_weight(7, 64), ValueError, "bits=7"),
    (lambda: quant.fp8_range("e3m4"), ValueError, "unknown FP8 format"),
    (lambda: quant.smoothquant_scales(torch.ones(4), torch.ones(4), alpha=1.5), ValueError, "alpha must be"),
    (lambda: quant.rtn_model(torch.nn.Linear(4, 4), bits=4), TypeError, "not a Llama-style decoder"),
]


@pytest.mark.parametrize("call,exc,msg", QUANT_ERRORS)
def test_quant_refuses(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_named(bad):
    x = W(4, 64)
    x[2, 17] = bad
    with pytest.raises(ValueError, match=r"non-finite.*index \(2, 17\)"):
        quant.quantize_tensor(x)


def test_non_finite_qtensor_blames_the_scale_not_the_codes():
    q = quant.quantize_tensor(W(4, 64))
    q.scale[0, 0] = float("nan")
    with pytest.raises(ValueError, match="QTensor's scale"):
        quant.storage_bytes(q)


def test_float_codes_that_are_integers_are_accepted():  # accepted: 3.0 is the code 3
    assert torch.equal(quant.unpack_codes(quant.pack_codes(torch.tensor([3.0, 1.0]), 4), 4, 2),
                       torch.tensor([3, 1]))


# ---------------------------------------------------------------------------------- GPTQ / AWQ
def gptq_layer():
    g = gptq.GPTQ(torch.nn.Linear(64, 8, bias=False))
    g.add_batch(W(32, 64))
    return g


GPTQ_ERRORS = [
    (lambda: gptq_layer().fasterquant(QuantSpec(), blocksize=0), ValueError, "blocksize must be a positive"),
    (lambda: gptq_layer().fasterquant(QuantSpec(), blocksize=-8), ValueError, "blocksize must be a positive"),
    (lambda: gptq_layer().fasterquant(QuantSpec(), blocksize=2.5), TypeError, "blocksize must be an integer"),
    (lambda: gptq_layer().fasterquant(QuantSpec(), percdamp=-0.1), ValueError, "percdamp must be in"),
    (lambda: gptq_layer().fasterquant(QuantSpec(), percdamp=1.5), ValueError, "percdamp must be in"),
    (lambda: gptq_layer().fasterquant(QuantSpec(4, 48)), ValueError, "does not divide the 64"),
    (lambda: gptq_layer().fasterquant({"bits": 4}), TypeError, "spec must be a QuantSpec"),
    (lambda: gptq_layer().add_batch(W(8, 32)), ValueError, "32 features; the layer has 64"),
    (lambda: gptq.GPTQ(torch.nn.Linear(64, 8)).fasterquant(QuantSpec()), RuntimeError, "before add_batch"),
]


@pytest.mark.parametrize("call,exc,msg", GPTQ_ERRORS)
def test_gptq_refuses(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_gptq_refuses_nan_inputs_and_weights():
    g = gptq.GPTQ(torch.nn.Linear(64, 8, bias=False))
    x = W(16, 64)
    x[3, 5] = float("nan")
    with pytest.raises(ValueError, match="calibration inputs"):
        g.add_batch(x)
    g = gptq_layer()
    g.layer.weight.data[1, 2] = float("nan")
    with pytest.raises(ValueError, match="layer's weight"):
        g.fasterquant(QuantSpec())


CALIB_ERRORS = [
    (torch.randint(0, 128, (32,)), ValueError, r"\[n_samples, seq_len\]"),
    (torch.randint(0, 128, (0, 32)), ValueError, r"\[n_samples, seq_len\]"),
    (torch.rand(2, 32), TypeError, "integer token ids"),
    (torch.randint(0, 500, (2, 32)), ValueError, "outside the model's vocabulary"),
    (torch.full((2, 32), -1), ValueError, "outside the model's vocabulary"),
    ([[1, 2, 3]], TypeError, "must be a torch.Tensor"),
]


@pytest.mark.parametrize("ids,exc,msg", CALIB_ERRORS)
def test_quantizers_check_calibration_ids(tiny_llama, ids, exc, msg):
    for run in (lambda: gptq.gptq_model(tiny_llama, ids, bits=4, group_size=32, progress=False),
                lambda: awq.awq_model(tiny_llama, ids, bits=4, group_size=32, progress=False)):
        with pytest.raises(exc, match=msg):
            run()


def test_quantizers_refuse_bad_batch_size_and_nan_weights(tiny_llama, tiny_calib):
    with pytest.raises(ValueError, match="batch_size must be a positive"):
        gptq.gptq_model(tiny_llama, tiny_calib, bits=4, group_size=32, batch_size=0, progress=False)
    tiny_llama.model.layers[1].mlp.up_proj.weight.data[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.up_proj.weight"):
        awq.awq_model(tiny_llama, tiny_calib, bits=4, group_size=32, progress=False)


AWQ_ERRORS = [
    (lambda: awq.salient_channels(W(8), W(4, 8), fraction=0), ValueError, "fraction"),
    (lambda: awq.salient_channels(W(8), W(4, 8), fraction=1.5), ValueError, "fraction"),
    (lambda: awq.salient_channels(W(8), W(4, 8), by="grad"), ValueError, "by must be"),
    (lambda: awq.search_clip(W(4, 64), W(10, 64), QuantSpec(4, 32), max_shrink=1.0), ValueError, "max_shrink"),
    (lambda: awq.search_clip(W(4, 64), W(10, 64), QuantSpec(4, 48)), ValueError, "does not divide"),
]


@pytest.mark.parametrize("call,exc,msg", AWQ_ERRORS)
def test_awq_refuses(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


# ------------------------------------------------------------------------------------ evaluate
class Tiny(torch.nn.Module):
    config = type("C", (), {"vocab_size": 50})()


EVAL_ERRORS = [
    (dict(ids=torch.randint(0, 50, (2, 100))), ValueError, "1-D token stream"),
    (dict(ids=torch.rand(100)), TypeError, "integer token ids"),
    (dict(ids=torch.randint(0, 500, (100,))), ValueError, "outside the model's vocabulary"),
    (dict(ids=[1, 2, 3]), TypeError, "1-D torch.Tensor"),
    (dict(max_tokens=-5), ValueError, "max_tokens must be a positive"),
    (dict(max_tokens=0), ValueError, "max_tokens must be a positive"),
    (dict(max_tokens=1), ValueError, "need at least 2 tokens"),
    (dict(batch_size=0), ValueError, "batch_size must be a positive"),
    (dict(seq_len=1), ValueError, "seq_len must be ≥ 2"),
    (dict(seq_len=32.0), TypeError, "seq_len must be an integer"),
    (dict(stride=0), ValueError, "stride must be in"),
    (dict(stride=64), ValueError, "stride must be in"),
    (dict(ids=torch.zeros(0, dtype=torch.long)), ValueError, "need at least 2 tokens"),
]


@pytest.mark.parametrize("kw,exc,msg", EVAL_ERRORS)
def test_perplexity_refuses(kw, exc, msg):
    model = evaluate.UniformModel(50)
    args = {"ids": torch.randint(0, 50, (100,)), "seq_len": 32, **kw}
    with pytest.raises(exc, match=msg):
        evaluate.perplexity(model, progress=False, **args)


def test_numpy_integers_are_accepted_where_ints_are():  # accepted: np.int64 is an integer
    r = evaluate.perplexity(evaluate.UniformModel(50), torch.randint(0, 50, (100,)), np.int64(32),
                            batch_size=np.int32(2), max_tokens=np.int64(64), progress=False)
    assert r["scored_tokens"] == 62


def test_agreement_refuses_bad_prompts(tiny_llama):
    with pytest.raises(ValueError, match=r"prompts must be token ids \[batch, len\]"):
        evaluate.agreement(tiny_llama, tiny_llama, torch.randint(0, 128, (16,)))
    with pytest.raises(ValueError, match="new_tokens must be a positive"):
        evaluate.agreement(tiny_llama, tiny_llama, torch.randint(0, 128, (1, 8)), new_tokens=0)


# -------------------------------------------------------------------------------------- budget
BUDGET_ERRORS = [
    (lambda: budget.budget(CFG, "bf16", 1024, 1, overhead=-1e12), ValueError, "overhead must be ≥ 0"),
    (lambda: budget.budget(CFG, "int5", 1024, 1), ValueError, "unknown weight format"),
    (lambda: budget.budget(CFG, "bf16", 1024, 1, kv_dtype="int2"), ValueError, "unknown dtype"),
    (lambda: budget.budget(CFG, "bf16", 0, 1), ValueError, "prompt_len must be a positive"),
    (lambda: budget.kv_bytes(CFG, -1, 1), ValueError, "seq_len must be a positive"),
    (lambda: budget.kv_bytes(CFG, 1024, 0), ValueError, "batch must be a positive"),
    (lambda: budget.kv_bytes(CFG, 1024, 1.5), ValueError, "batch must be a positive"),
    (lambda: budget.kv_bytes(CFG, 16, 1, "int4", residual_tokens=20), ValueError, "residual_tokens"),
    (lambda: budget.activation_bytes(CFG, 128, 1, attention="flash"), ValueError, "attention must be"),
    (lambda: budget.generation_peak(CFG, 128, 8, cache="paged"), ValueError, "cache must be"),
    (lambda: budget.format_bits("int4-g48"), ValueError, "unknown weight format"),
    (lambda: budget.param_counts(type("Cfg", (), {"num_hidden_layers": 2})()), ValueError, "does not know model_type"),
    (lambda: budget.kv_bytes(type("Cfg", (), {"num_hidden_layers": 2, "model_type": "llama"})(), 8), ValueError,
     "config lacks"),
    (lambda: budget.dtype_bytes("fp6"), ValueError, "unknown dtype"),
]


@pytest.mark.parametrize("call,exc,msg", BUDGET_ERRORS)
def test_budget_refuses(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


# ----------------------------------------------------------------------- allocator, device, caches
SIM_ERRORS = [
    (lambda: allocator_sim.simulate([["alloc", "a", 100]], cap=-5), ValueError, "cap"),
    (lambda: allocator_sim.simulate([["alloc", "a", -10]]), ValueError, "size"),
    (lambda: allocator_sim.simulate([["alloc", "a", 0]]), ValueError, "size"),
    (lambda: allocator_sim.simulate([["free", "nope"]]), (KeyError, ValueError), "nope"),
    (lambda: allocator_sim.simulate([["resize", "a", 10]]), ValueError, "resize"),
]


@pytest.mark.parametrize("call,exc,msg", SIM_ERRORS)
def test_allocator_simulator_refuses(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


DEVICE_ERRORS = [
    (lambda: device.get_device("tpu"), ValueError, "unknown device"),
    (lambda: device.card_share(-1, 80 * 2**30, 79 * 2**30), ValueError, "card must be a positive"),
    (lambda: device.card_share(15, 80 * 2**30, 81 * 2**30), ValueError, "inconsistent device memory"),
    (lambda: device.limit_memory(-1), ValueError, "positive, finite number of GiB"),
    (lambda: device.limit_memory("2"), ValueError, "positive, finite number of GiB"),
    (lambda: device.limit_memory(float("inf")), ValueError, "positive, finite number of GiB"),
    (lambda: device.limit_memory(True), ValueError, "positive, finite number of GiB"),
]


@pytest.mark.parametrize("call,exc,msg", DEVICE_ERRORS)
def test_device_refuses(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


@pytest.mark.parametrize("value,msg", [("abc", "must be a number of GiB"), ("-3", "must be a positive"),
                                       ("0", "must be a positive"), ("inf", "finite")])
@pytest.mark.parametrize("env", ["CARD_ENV", "CAP_ENV"])
def test_card_and_cap_env_refuse(monkeypatch, env, value, msg):
    monkeypatch.setenv(getattr(device, env), value)
    with pytest.raises(ValueError, match=msg) as e:
        device.card_gib() if env == "CARD_ENV" else device.cap_gib()
    assert getattr(device, env) in str(e.value)      # the message names the variable to fix


MISC_ERRORS = [
    (lambda: models.parse_dtype("bf32"), ValueError, "unknown dtype"),
    (lambda: models.architecture_config("Llama-9B"), ValueError, "unknown architecture"),
    (lambda: models.resolve_model_name(42, echo=False), TypeError, "must be a string or path"),
    (lambda: kvcache.make_cache("fp4", CFG), ValueError, "unknown KV cache kind"),
    (lambda: kvcache.make_cache("static", CFG), ValueError, "needs max_cache_len"),
    (lambda: kvcache.FP8Layer("e2m5"), ValueError, "unknown FP8 format"),
    (lambda: data.load_text("train"), ValueError, "unknown split"),
    (lambda: measure.diagnose_oom({"total": 1}, echo=False), ValueError, "need key 'allocated'"),
    (lambda: generation.prefill_decode(None, torch.zeros(1, 8, dtype=torch.long), 0), ValueError,
     "decode_steps must be a positive"),
    (lambda: calib.forward_batches(None, torch.zeros(2, 4, dtype=torch.long), batch_size=-1), ValueError,
     "batch_size must be a positive"),
    (lambda: evaluate.UniformModel(0), ValueError, "vocab must be a positive"),
    (lambda: variants.apply_quantizer(None, None, "squeezellm"), ValueError, "unknown quantizer"),
    (lambda: variants.apply_quantizer(None, None, "rtn", "llmcompressor"), ValueError, "RTN is ours only"),
]


@pytest.mark.parametrize("call,exc,msg", MISC_ERRORS)
def test_misc_refuses(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


# ------------------------------------------------------------------------ files the course reads
def test_empty_text_file_is_named(tmp_path, monkeypatch):
    empty = tmp_path / "wiki.test.raw"
    empty.write_text("\n\n")
    monkeypatch.setenv(data.ENV_VAR, str(empty))
    with pytest.raises(ValueError, match=r"wiki.test.raw holds 0 non-empty paragraph"):
        data.text_rows()


def test_missing_text_file_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "nope.raw"))
    with pytest.raises(FileNotFoundError, match="does not name a file.*export COURSE_WIKITEXT"):
        data.text_rows()


def test_corrupt_token_cache_is_rebuilt(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    text = tmp_path / "t.raw"
    text.write_text("one two three\nfour five six\nseven eight\n")
    monkeypatch.setenv(data.ENV_VAR, str(text))

    class Tok:
        def get_vocab(self):
            return {"a": 0}

        def __len__(self):
            return 1

        def __call__(self, s, add_special_tokens=False):
            return {"input_ids": list(range(len(s.split())))}

    first = data.tokens(Tok(), "all")
    (path,) = (tmp_path / "tokens").glob("*.pt")
    path.write_bytes(b"garbage")
    again = data.tokens(Tok(), "all")
    assert torch.equal(first, again) and "unusable" in capsys.readouterr().out


def test_corrupt_key_numbers_file_names_the_file_and_remedy(tmp_path, monkeypatch):
    bad = tmp_path / "key_numbers.json"
    bad.write_text("{oops")
    monkeypatch.setenv(key_numbers.ENV_VAR, str(bad))
    with pytest.raises(ValueError, match=r"key_numbers.json is not valid JSON.*rm "):
        key_numbers.record("nb", a=1)
    bad.write_text(json.dumps({}))
    with pytest.raises(ValueError, match="notebook must be a non-empty name"):
        key_numbers.record("", a=1)


def test_truncated_converted_model_is_detected(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1000)}, str(tmp_path / "model.safetensors"))
    assert models.unreadable_safetensors(tmp_path) is None
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "model.safetensors" in models.unreadable_safetensors(tmp_path)
