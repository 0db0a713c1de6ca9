"""Bad input at the doors of the public helpers, tried as a new user would.

Every case asserts a clear error: its type, and a message that names the argument (or file) and what
is wrong — or, where an input is legitimately accepted, what it means (``accepted`` cases)."""
import json
import re

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from helpers import (
    allocator_ops,
    allocator_sim,
    awq,
    budget,
    calib,
    data,
    device,
    engine_plan,
    evaluate,
    generation,
    gguf_run,
    gptq,
    key_numbers,
    kvcache,
    loading,
    measure,
    models,
    quant,
    validate,
    variants,
)
from helpers.engine_plan import GiB, MemoryProfile
from helpers.qspec import QuantSpec, allowed_group_sizes

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
        gptq.gptq_model(tiny_llama, tiny_calib, bits=4, group_size=32, calibration=calib.CalibSpec(batch_size=0),
                        progress=False)
    with pytest.raises(ValueError, match="batch_size must be a positive"):      # the same through the variant door
        variants.apply_quantizer(tiny_llama, tiny_calib, "gptq", bits=4, group_size=32, batch_size=0)
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
    (lambda: budget.budget(CFG, "bf16", 1024, 1, overhead=-1e12), ValueError, "overhead must be .*≥ 0"),
    (lambda: budget.budget(CFG, "int5", 1024, 1), ValueError, "unknown weight format"),
    (lambda: budget.budget(CFG, "bf16", 1024, 1, kv_dtype="int2"), ValueError, "unknown dtype"),
    (lambda: budget.budget(CFG, "bf16", 0, 1), ValueError, "prompt_len must be a positive"),
    (lambda: budget.kv_bytes(CFG, -1, 1), ValueError, "seq_len must be a positive"),
    (lambda: budget.kv_bytes(CFG, 1024, 0), ValueError, "batch must be a positive"),
    (lambda: budget.kv_bytes(CFG, 1024, 1.5), ValueError, "batch must be a positive"),
    (lambda: budget.kv_bytes(CFG, 16, 1, "int4", decode_steps=20), ValueError, "decode_steps must be below seq_len=16"),
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
    (lambda: allocator_ops.seed_snippet("meant"), ValueError, r"version must be one of \['as_written', 'corrected'\]"),
    (lambda: allocator_ops.seed_snippet(False), ValueError, r"version must be one of .*got False"),
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


# ==================================================================== the newer modules' doors
# ------------------------------------------------------------------ the shared validators
NAN, INF = float("nan"), float("inf")

VALIDATE_ERRORS = [
    (lambda: validate.positive_int(torch.tensor(True), "batch"), TypeError, r"batch must be an integer, got the bool"),
    (lambda: validate.positive_int(np.True_, "batch"), TypeError, r"batch must be an integer, got the bool"),
    (lambda: validate.positive_int(torch.tensor([4, 4]), "batch"), TypeError, r"batch must be an integer"),
    (lambda: validate.positive_int(-3, "batch", "sequences per step"), ValueError,
     r"batch must be a positive integer, got -3; sequences per step"),
    (lambda: validate.non_negative_int(-1, "residual"), ValueError, r"residual must be a non-negative integer"),
    (lambda: validate.as_number(NAN, "cap"), ValueError, r"cap must be a finite number, got nan"),
    (lambda: validate.as_number(-INF, "cap"), ValueError, r"cap must be a finite number, got -inf"),
    (lambda: validate.as_number("3", "cap"), TypeError, r"cap must be a number, got str"),
    (lambda: validate.as_number(True, "cap"), TypeError, r"cap must be a number, got the bool"),
    (lambda: validate.positive_number(0, "cap"), ValueError, r"cap must be a positive, finite number"),
    (lambda: validate.non_negative_number(-1e9, "bytes"), ValueError, r"bytes must be a non-negative, finite"),
    (lambda: validate.number_in(1.5, "alpha", 0, 1), ValueError, r"alpha must be in \[0, 1\], got 1.5"),
    (lambda: validate.number_in(0, "utilization", 0, 1, low_open=True), ValueError, r"utilization must be in \(0, 1\]"),
    (lambda: validate.one_of(["fp8"], "kv", ("fp8", "auto")), ValueError, r"kv must be one of \['auto', 'fp8'\]"),
    (lambda: validate.one_of("e4m3", "fmt", {"e4m3fn": 1}, what="FP8 format"), ValueError,
     r"unknown FP8 format fmt='e4m3'; use one of \['e4m3fn'\]"),
    (lambda: validate.flag(1, "clip"), TypeError, r"clip must be True or False, got int 1"),
    (lambda: validate.text("", "label"), TypeError, r"label must be a non-empty string"),
    (lambda: validate.tensor([1], "x", 4), TypeError, r"x must be a 4-D torch.Tensor, got list"),
    (lambda: validate.tensor(torch.ones(2), "ids", 1, "int"), TypeError, r"ids must hold integers, got torch.float32"),
    (lambda: validate.model_config({"num_hidden_layers": 2}), TypeError, r"config must be a model config.*AutoConfig"),
    (lambda: validate.json_fields([], "f.json", {"a": validate.text}), ValueError, r"f.json holds list.*rm 'f.json'"),
    (lambda: validate.json_fields({"a": NAN}, "f.json", {"a": validate.positive_number}), ValueError,
     r"f.json has a bad 'a'.*finite.*run the cell again"),
]


@pytest.mark.parametrize("call,exc,msg", VALIDATE_ERRORS)
def test_shared_validators_refuse(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_shared_validators_accept_numpy_and_torch_scalars():  # accepted: one meaning of "integer" and "number"
    assert validate.positive_int(np.int64(4096), "n") == 4096 and type(validate.positive_int(np.int32(3), "n")) is int
    assert validate.positive_int(torch.tensor(7), "n") == 7
    assert validate.as_number(np.int64(2**40), "bytes") == 2**40 and type(validate.as_number(np.int64(1), "b")) is int
    assert validate.as_number(np.float32(0.5), "u") == 0.5 and validate.as_number(torch.tensor(2.5), "u") == 2.5
    assert validate.flag(np.True_, "clip") is True and validate.one_of("fp8", "kv", ("fp8",)) == "fp8"


QSPEC_MORE_ERRORS = [
    (lambda: allowed_group_sizes(0), ValueError, r"columns must be a positive integer.*input columns"),
    (lambda: allowed_group_sizes(-64), ValueError, r"columns must be a positive integer"),
    (lambda: allowed_group_sizes(64.0), TypeError, r"columns must be an integer, got float"),
    (lambda: allowed_group_sizes("64"), TypeError, r"columns must be an integer, got str"),
    (lambda: allowed_group_sizes(64, (0, 32)), ValueError, r"candidates must be a positive integer"),
    (lambda: QuantSpec(4, 64).group_for(0), ValueError, r"columns must be a positive integer"),
    (lambda: QuantSpec(4, None).group_for(-64), ValueError, r"columns must be a positive integer"),
    (lambda: QuantSpec(4, 32).group_for(64.5), TypeError, r"columns must be an integer"),
    (lambda: QuantSpec.of(None, bitz=4), TypeError, r"unknown keyword\(s\) \['bitz'\]: a QuantSpec takes bits="),
    (lambda: QuantSpec.of(QuantSpec(), blocksiz=64), TypeError, r"unknown keyword\(s\) \['blocksiz'\]"),
]


@pytest.mark.parametrize("call,exc,msg", QSPEC_MORE_ERRORS)
def test_qspec_doors_refuse(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_qspec_accepts_library_integers():  # accepted
    assert allowed_group_sizes(np.int64(576)) == [16, 32, 64]
    assert QuantSpec(torch.tensor(4), torch.tensor(64)).group_for(np.int64(128)) == 64


# -------------------------------------------------------------------------------- engine_plan
PROF = MemoryProfile(80 * GiB, 0.9, 15 * GiB, 2 * GiB, 0.5 * GiB)
VLLM_LOG = ("total_gpu_memory (39.50GiB) x gpu_memory_utilization (0.90) = 35.55GiB\n"
            "model weights take 14.96GiB; non_torch_memory takes 0.10GiB; PyTorch activation peak memory takes "
            "9.37GiB; the rest of the memory reserved for KV Cache is 11.12GiB.")

ENGINE_ERRORS = [
    (lambda: MemoryProfile(INF, 0.9, 1, 1, 1), ValueError, r"total must be a finite number, got inf.*bytes"),
    (lambda: MemoryProfile(0, 0.9, 0, 0, 0), ValueError, r"total must be a positive, finite number"),
    (lambda: MemoryProfile(80 * GiB, NAN, 1, 1, 1), ValueError, r"gpu_memory_utilization.*finite.*default is 0.9"),
    (lambda: MemoryProfile(80 * GiB, True, 1, 1, 1), TypeError, r"gpu_memory_utilization\) must be a number, got the bool"),
    (lambda: MemoryProfile(80 * GiB, "0.9", 1, 1, 1), TypeError, r"gpu_memory_utilization\) must be a number, got str"),
    (lambda: MemoryProfile(80 * GiB, 0.9, INF, 1, 1), ValueError, r"weights must be a finite number"),
    (lambda: MemoryProfile(80 * GiB, 0.9, 1, 1, True), TypeError, r"non_torch must be a number, got the bool"),
    (lambda: engine_plan.plan(PROF, NAN, 4096), TypeError, r"per_token must be an integer.*kv_bytes_per_token"),
    (lambda: engine_plan.plan(PROF, True, 4096), TypeError, r"per_token must be an integer, got the bool"),
    (lambda: engine_plan.plan(PROF, 0.5, 4096), TypeError, r"per_token must be an integer.*kv_bytes_per_token"),
    (lambda: engine_plan.plan(PROF, 1024, True), TypeError, r"max_model_len must be an integer, got the bool"),
    (lambda: engine_plan.plan(PROF, 1024, 4096, -16), ValueError, r"block_size must be a positive integer.*default is 16"),
    (lambda: engine_plan.plan({"total": 1}, 1024, 4096), TypeError, r"profile must be a MemoryProfile.*profile_from_log"),
    (lambda: engine_plan.kv_bytes_per_token(CFG, "auto", "int3"), ValueError, r"model_dtype must be one of.*bf16"),
    (lambda: engine_plan.kv_bytes_per_token(CFG, ["fp8"]), ValueError, r"kv_cache_dtype must be one of.*--kv-cache-dtype"),
    (lambda: engine_plan.kv_bytes_per_token(None), TypeError, r"config must be a model config.*model.config"),
    (lambda: engine_plan.parse_vllm_log(VLLM_LOG.encode()), TypeError, r"text must be the log as a str.*decode"),
    (lambda: engine_plan.parse_vllm_log(VLLM_LOG.replace("(0.90)", "(1.50)")), ValueError,
     r"impossible profile: utilization \(gpu_memory_utilization\) must be in \(0, 1\], got 1.5"),
    (lambda: engine_plan.profile_from_log({}), ValueError, r"parsed lacks \['total'.*parse_vllm_log\(text\)"),
    (lambda: engine_plan.rounding_bounds(engine_plan.parse_vllm_log(VLLM_LOG), 0), ValueError,
     r"per_token must be a positive integer"),
    (lambda: engine_plan.measure_profile(None, 0), ValueError, r"max_num_batched_tokens must be a positive integer"),
    (lambda: engine_plan.measure_profile(None, 2048, 2.0), ValueError, r"gpu_memory_utilization\) must be in \(0, 1\]"),
]


@pytest.mark.parametrize("call,exc,msg", ENGINE_ERRORS)
def test_engine_plan_refuses(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_engine_plan_accepts_numpy_and_torch_integers():  # accepted: the np.int64(4096)
    prof = MemoryProfile(np.int64(80 * GiB), np.float64(0.9), np.int64(15 * GiB), 2 * GiB, 0)
    a = engine_plan.plan(prof, np.int64(131072), np.int64(4096), np.int64(16))
    b = engine_plan.plan(MemoryProfile(80 * GiB, 0.9, 15 * GiB, 2 * GiB, 0), torch.tensor(131072), 4096)
    assert a["blocks"] == b["blocks"] > 0 and type(prof.total) is int


# ------------------------------------------------------------------------------------ kvcache
KV = torch.randn(1, 2, 8, 16)

KVCACHE_ERRORS = [
    (lambda: kvcache.FP8Layer(margin=NAN), ValueError, r"margin must be a finite number.*2.0 leaves room"),
    (lambda: kvcache.FP8Layer(margin=-2.0), ValueError, r"margin must be a positive, finite number"),
    (lambda: kvcache.FP8Layer(margin=INF), ValueError, r"margin must be a finite number, got inf"),
    (lambda: kvcache.FP8Layer(margin="2"), TypeError, r"margin must be a number, got str"),
    (lambda: kvcache.FP8Layer(unit_scale="no"), TypeError, r"unit_scale must be True or False"),
    (lambda: kvcache.FP8Layer(["e5m2"]), ValueError, r"unknown FP8 format fmt=\['e5m2'\]; use one of"),
    (lambda: kvcache.FP8Layer().update([1.0], [1.0]), TypeError, r"key_states must be a 4-D torch.Tensor \[batch"),
    (lambda: kvcache.FP8Layer().update(KV, KV[:, :1]), ValueError, r"key_states .* and value_states .* one shape"),
    (lambda: kvcache.Int4Layer(q_group_size=0), ValueError, r"q_group_size must be a positive integer.*head_dim"),
    (lambda: kvcache.Int4Layer(residual_length=-4), ValueError, r"residual_length must be a non-negative integer"),
    (lambda: kvcache.Int4Layer(residual_length=2.5), TypeError, r"residual_length must be an integer"),
    (lambda: kvcache.Int4Layer(q_group_size=6).update(KV, KV), ValueError,
     r"q_group_size=6 does not divide head_dim=16; use a divisor of 16"),
    (lambda: kvcache.make_cache(None, CFG), ValueError, r"unknown KV cache kind kind=None; use one of"),
    (lambda: kvcache.make_cache("static", CFG, -5), ValueError, r"max_cache_len must be a positive integer"),
    (lambda: kvcache.make_cache("static", CFG, True), TypeError, r"max_cache_len must be an integer, got the bool"),
    (lambda: kvcache.make_cache("baseline", CFG, margin=1.0), TypeError, r"make_cache\('baseline'\) takes no keyword"),
    (lambda: kvcache.make_cache("int4", CFG, margin=2.0), TypeError, r"takes no keyword \['margin'\]; it takes \['q_group"),
    (lambda: kvcache.make_cache("int4", CFG, q_group_size=6), ValueError, r"q_group_size=6 does not divide head_dim=16"),
    (lambda: kvcache.make_cache("fp8-e4m3", None), TypeError, r"config must be a model config"),
    (lambda: kvcache.stored_bytes([]), TypeError, r"cache must be a transformers Cache \(make_cache"),
    (lambda: kvcache.fp8_roundtrip_bound(torch.ones(4, 4)), ValueError, r"x must be a 4-D torch.Tensor.*got shape"),
    (lambda: kvcache.fp8_roundtrip_bound(KV, "e4m3"), ValueError, r"unknown FP8 format fmt='e4m3'"),
    (lambda: kvcache.fp8_roundtrip_bound(KV, margin=NAN), ValueError, r"margin must be a finite number"),
    (lambda: kvcache.fp8_roundtrip_bound(KV.long()), TypeError, r"x must hold floating-point values"),
]


@pytest.mark.parametrize("call,exc,msg", KVCACHE_ERRORS)
def test_kvcache_refuses(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_kvcache_accepts_library_integers_and_a_growing_cache_length():  # accepted
    assert kvcache.Int4Layer(np.int64(16), np.int64(0)).q_group_size == 16
    assert kvcache.make_cache("static", CFG, np.int64(64)) is not None
    kvcache.make_cache("fp8-e4m3", CFG, max_cache_len=64)      # growing caches need no length (generation passes one)
    layer = kvcache.Int4Layer(q_group_size=64)                  # a group as wide as head_dim or wider: one per row
    layer.update(KV, KV)
    assert layer._quantized_keys["g"] == 16


# ------------------------------------------------------------------------------------ loading
@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from transformers import LlamaForCausalLM
    folder = tmp_path_factory.mktemp("tiny_ckpt")
    torch.manual_seed(0)
    LlamaForCausalLM(CFG).to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    loading.write_pickle_copy(folder)
    return folder


def broken_copy(src, tmp_path, name, data=None):
    import shutil
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    f = dst / name
    f.write_bytes(f.read_bytes()[:100] if data is None else data)
    return dst


def test_loading_refuses(tiny_checkpoint, tmp_path):
    cases = [
        (lambda: loading.write_pickle_copy(None), TypeError, r"folder must be a checkpoint directory"),
        (lambda: loading.write_pickle_copy(tmp_path / "nope"), FileNotFoundError, r"nope is not a directory.*save_pretr"),
        (lambda: loading.write_pickle_copy(tiny_checkpoint / "config.json"), FileNotFoundError,
         r"config.json is not a directory"),
        (lambda: loading.load_naive(tiny_checkpoint, "gpu"), ValueError, r"device must be 'cpu', 'cuda' or 'cuda:N'"),
        (lambda: loading.load_lazy(tiny_checkpoint, "tpu"), ValueError, r"device must be 'cpu'"),
        (lambda: loading.load_lazy(tiny_checkpoint, "cpu", "bf16x"), ValueError, r"unknown dtype 'bf16x'; use one of"),
        (lambda: loading.load_lazy(tiny_checkpoint, "cpu", torch.int8), ValueError, r"dtype must be a floating dtype"),
        (lambda: loading.load_peaks(tiny_checkpoint, "cpu", "float8"), ValueError, r"unknown dtype"),
        (lambda: loading.remembered_load_peaks(tmp_path / "nope2"), FileNotFoundError, r"nope2 is not a directory"),
        (lambda: loading.peak_rss_during(42), TypeError, r"fn must be a function of no arguments"),
    ]
    if not torch.cuda.is_available():
        cases.append((lambda: loading.load_lazy(tiny_checkpoint, "cuda"), RuntimeError, r"no CUDA device.*device='cpu'"))
    for call, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            call()


@pytest.mark.parametrize("load", [loading.write_pickle_copy, loading.load_lazy, loading.format_load_times,
                                  loading.remembered_load_peaks])
def test_truncated_safetensors_is_named_with_the_remedy(tiny_checkpoint, tmp_path, load):
    folder = broken_copy(tiny_checkpoint, tmp_path, "model.safetensors")
    with pytest.raises(ValueError, match=r"ckpt/model.safetensors cannot be read.*Save or download the checkpoint"):
        load(folder)


@pytest.mark.parametrize("load", [loading.format_load_times, loading.load_naive])
def test_truncated_pickle_is_named_with_the_remedy(tiny_checkpoint, tmp_path, load):
    folder = broken_copy(tiny_checkpoint, tmp_path, "pytorch_model.bin", b"not a pickle")
    with pytest.raises(ValueError, match=r"pytorch_model.bin cannot be read by torch.load.*write_pickle_copy"):
        load(folder)


def test_missing_pickle_says_write_pickle_copy(tiny_checkpoint, tmp_path):
    folder = broken_copy(tiny_checkpoint, tmp_path, "config.json")
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"no pytorch_model.bin: call write_pickle_copy\(folder\) first"):
        loading.load_naive(folder)


@pytest.mark.parametrize("content,problem", [
    ("42", "holds int"), ("[]", "holds list"), (json.dumps({"cpu:bfloat16": 42}), "not the two rows"),
    (json.dumps({"cpu:bfloat16": [{"load": "a"}, {"load": "b"}]}), "lacks 'device'"),
    (json.dumps({"cpu:bfloat16": [dict(load="a", device="cpu", peak_bytes=-5, param_bytes=10, peak_over_params=-.5,
                                       seconds=1)] * 2}), "bad 'peak_bytes'")])
def test_load_peaks_file_that_is_not_a_measurement_is_measured_again(tiny_checkpoint, tmp_path, capsys, content,
                                                                     problem):
    folder = broken_copy(tiny_checkpoint, tmp_path, "config.json", (tiny_checkpoint / "config.json").read_bytes())
    (folder / "load_peaks.json").write_text(content)
    with pytest.raises(ValueError, match=f"load_peaks.json {problem}|load_peaks.json has.*{problem}|{problem}"):
        loading.read_load_peaks(folder / "load_peaks.json")
    rows = loading.remembered_load_peaks(folder)          # accepted: never returned, measured again and said so
    out = capsys.readouterr().out
    assert "load_peaks.json" in out and "measuring again" in out
    assert len(rows) == 2 and all(r["param_bytes"] > 0 and r["peak_bytes"] >= 0 for r in rows)
    assert loading.read_load_peaks(folder / "load_peaks.json")["cpu:bfloat16"] == rows


# ----------------------------------------------------------------------------------- gguf_run
class FakeLlama:
    """llama-cpp-python's ``Llama`` as gguf_run uses it (context, vocabulary, eval, scores, generate)."""

    def __init__(self, stop_after=None):
        self.stop_after = stop_after

    def n_ctx(self):
        return 256

    def n_vocab(self):
        return 128

    def reset(self):
        pass

    def eval(self, tokens):
        self.scores = np.zeros((len(tokens), 128), dtype=np.float32)

    def generate(self, prompt, temp=0.0, reset=True):
        for _ in range(self.stop_after or 10_000):
            yield 1


IDS = torch.randint(0, 128, (300,), generator=torch.Generator().manual_seed(0))

GGUF_ERRORS = [
    (dict(max_tokens=-100), ValueError, r"max_tokens must be a positive integer, got -100"),
    (dict(max_tokens=0), ValueError, r"max_tokens must be a positive integer"),
    (dict(max_tokens=2.5), TypeError, r"max_tokens must be an integer"),
    (dict(ids=[1, 2, 3]), TypeError, r"ids must be a 1-D torch.Tensor of token ids"),
    (dict(ids=torch.rand(300)), TypeError, r"ids must hold integer token ids"),
    (dict(ids=IDS + 200), ValueError, r"outside the model's vocabulary \[0, 128\)"),
    (dict(ids=IDS[None]), ValueError, r"ids must be a 1-D token stream"),
    (dict(seq_len=None), TypeError, r"seq_len must be an integer"),
    (dict(seq_len=1), ValueError, r"seq_len must be ≥ 2"),
    (dict(seq_len=512), ValueError, r"seq_len=512 does not fit the llama.cpp context n_ctx=256.*larger n_ctx"),
    (dict(stride=0), ValueError, r"stride must be in 1..seq_len"),
    (dict(bos_token_id=-1), ValueError, r"bos_token_id must be a non-negative integer.*tokenizer's bos_token_id"),
    (dict(bos_token_id=500), ValueError, r"bos_token_id=500 is outside the vocabulary \[0, 128\)"),
    (dict(progress="no"), TypeError, r"progress must be True or False"),
    (dict(llm=None), TypeError, r"llm must be a llama.cpp model: open one with `with open_gguf\(\) as llm:`"),
]


@pytest.mark.parametrize("kw,exc,msg", GGUF_ERRORS)
def test_llama_cpp_perplexity_refuses_like_ours(kw, exc, msg):
    args = {"llm": FakeLlama(), "ids": IDS, "seq_len": 64, "progress": False, **kw}
    with pytest.raises(exc, match=msg):
        gguf_run.perplexity(**args)


DECODE_ERRORS = [
    (dict(new_tokens=0), ValueError, r"new_tokens must be a positive integer"),
    (dict(new_tokens=1), ValueError, r"new_tokens must be ≥ 2 \(the decode rate is timed between tokens\)"),
    (dict(prompt=[]), TypeError, r"prompt must be a non-empty list of token ids \(ids.tolist\(\)\)"),
    (dict(prompt="hello"), TypeError, r"prompt must be a non-empty list of token ids"),
    (dict(prompt=[1.5, 2.0]), TypeError, r"prompt\[0\] must be an integer"),
    (dict(prompt=[1, 999]), ValueError, r"prompt holds token ids in \[1, 999\], outside"),
    (dict(llm=FakeLlama(stop_after=1)), RuntimeError, r"llama.cpp stopped after 1 token.*another prompt"),
]


@pytest.mark.parametrize("kw,exc,msg", DECODE_ERRORS)
def test_llama_cpp_decode_speed_refuses(kw, exc, msg):
    args = {"llm": FakeLlama(), "prompt": [1, 2, 3], "new_tokens": 8, **kw}
    with pytest.raises(exc, match=msg):
        gguf_run.decode_speed(**args)


def test_open_gguf_checks_its_arguments_before_importing(tmp_path):
    with pytest.raises(ValueError, match=r"n_ctx must be a positive integer.*seq_len"):
        gguf_run.open_gguf(n_ctx=0).__enter__()
    with pytest.raises(ValueError, match=r"n_threads must be a positive integer"):
        gguf_run.open_gguf(n_threads=-1).__enter__()
    with pytest.raises(FileNotFoundError, match=r"no GGUF file at .*x.gguf: pass the .gguf file"):
        gguf_run.open_gguf(tmp_path / "x.gguf").__enter__()
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(ValueError, match=r"model.gguf is not a GGUF file"):
        gguf_run.open_gguf(tmp_path / "model.gguf").__enter__()


def test_llama_cpp_accepts_library_integers():  # accepted: numpy ints, a tensor prompt
    r = gguf_run.perplexity(FakeLlama(), IDS, np.int64(64), max_tokens=np.int64(200), progress=False)
    assert r["scored_tokens"] == 189 and r["ppl"] == pytest.approx(128, rel=1e-5)
    assert gguf_run.decode_speed(FakeLlama(), torch.arange(5), np.int64(4))["new_tokens"] == 4


# ----------------------------------------------------------------------------------- variants
def tiny_bench(model):
    from helpers.course_model import Bench
    ids = torch.randint(0, 128, (400,), generator=torch.Generator().manual_seed(0))
    return Bench(model, None, True, True, ids, "tiny", {"calib_samples": 2, "seq_len": 32, "eval_tokens": 128})


VARIANT_ERRORS = [
    (lambda m: variants.apply_quantizer(m, None, "rtn", spec=QuantSpec(), bits=8), TypeError,
     r"give either spec= or \['bits'\], not both"),
    (lambda m: variants.apply_quantizer(m, None, "rtn", blocksize=64), TypeError,
     r"rtn \(ours\) has no setting \['blocksize'\].*bits=, group_size=, symmetric="),
    (lambda m: variants.apply_quantizer(m, torch.zeros(2, 8, dtype=torch.long), "gptq", blocksiz=64), TypeError,
     r"unknown settings \['blocksiz'\]: GPTQOptions takes \[.*'blocksize'.*CalibSpec takes"),
    (lambda m: variants.apply_quantizer(m, None, "RTN"), ValueError, r"unknown quantizer method='RTN'"),
    (lambda m: variants.apply_quantizer(m, torch.zeros(2, 8, dtype=torch.long), "awq", n_grid=0), ValueError,
     r"n_grid must be a positive integer"),
    (lambda m: variants.apply_quantizer(m, None, "gptq", "llmcompressor", blocksiz=64), TypeError,
     r"gptq \(llmcompressor\) has no setting \['blocksiz'\]; its settings: \[.*'blocksize'"),
    (lambda m: variants.apply_quantizer(m, None, "awq", "llmcompressor", clip=True), ValueError,
     r"options.clip=True: llm-compressor's AWQModifier has no clipping search; use AWQOptions\(clip=False"),
    (lambda m: variants.apply_quantizer(m, None, "gptq", "llmcompressor", static_groups=False), ValueError,
     r"options.static_groups=False: .*use GPTQOptions\(static_groups=True"),
    (lambda m: variants.apply_quantizer(m, None, "awq", "llmcompressor", n_grid=0), ValueError,
     r"n_grid must be a positive integer"),
    (lambda m: variants.variant_key("m", "rtn", "ours", "w4g64"), TypeError, r"spec must be a QuantSpec or None"),
    (lambda m: variants.variant_key("m", "rtn", "ours", QuantSpec(), -5), ValueError,
     r"calib_tokens must be a non-negative integer.*calib.numel\(\)"),
    (lambda m: variants.variant_key(None, "rtn", "ours", QuantSpec()), TypeError, r"model must be the model's name"),
    (lambda m: variants.variant(tiny_bench(m), "squeeze"), ValueError, r"unknown quantizer method='squeeze'"),
    (lambda m: variants.variant(None, "rtn"), TypeError, r"bench must be the Bench of helpers.course_model.setup"),
    (lambda m: variants.variant(tiny_bench(m), "rtn", rebuild="yes"), TypeError, r"rebuild must be True or False"),
    (lambda m: variants.perplexity(tiny_bench(m), seqlen=64), TypeError,
     r"perplexity has no setting \['seqlen'\]; its settings: \['seq_len'"),
    (lambda m: variants.perplexity(tiny_bench(m), max_tokens=-100), ValueError, r"max_tokens must be a positive integer"),
    (lambda m: variants.perplexity(tiny_bench(m), max_tokens=1.5), TypeError, r"max_tokens must be an integer"),
    (lambda m: variants.perplexity(tiny_bench(m), label=42), TypeError, r"label must be a non-empty string"),
    (lambda m: variants.score_key(m, [1, 2], {}), TypeError, r"ids must be the evaluated token ids"),
    (lambda m: variants.weights_fingerprint(None), TypeError, r"model must be a torch model"),
    (lambda m: variants.save(m, "../evil", {}), ValueError, r"key must be a file name without folders.*variant_key"),
    (lambda m: variants.save(m, "k", None), TypeError, r"meta must be a dict"),
]


def _llmc():
    from helpers import llm_compressor
    return llm_compressor


LLMC_OPTIONS_ERRORS = [   # checked before llm-compressor is imported: no model, no calibration needed
    (lambda: _llmc().oneshot_quantize(None, None, "awq", options=gptq.GPTQOptions()), TypeError,
     r"options for method='awq' must be a helpers.awq.AWQOptions \(e.g. options=AWQOptions\(.*\)\), got GPTQOptions"),
    (lambda: _llmc().oneshot_quantize(None, None, "gptq", options={"blocksize": 64}), TypeError,
     r"options for method='gptq' must be a helpers.gptq.GPTQOptions .*got dict"),
    (lambda: _llmc().oneshot_quantize(None, None, "rtn", options=gptq.GPTQOptions()), TypeError,
     r"options: RTN \(llm-compressor's data-free pipeline\) takes none, got GPTQOptions; pass options=None"),
    (lambda: _llmc().oneshot_quantize(None, None, "gptq", options=gptq.GPTQOptions(actorder=True)), ValueError,
     r"options.static_groups=False: llm-compressor's GPTQ computes every group's grid from the original weights"),
    (lambda: _llmc().oneshot_quantize(None, None, "awq", options=awq.AWQOptions()), ValueError,
     r"options.clip=True: llm-compressor's AWQModifier has no clipping search"),
    (lambda: _llmc().oneshot_quantize(None, None, "awq", options=awq.AWQOptions(clip=False, search_dtype=torch.float32)),
     ValueError, r"options.search_dtype=torch.float32: llm-compressor's AWQ searches in the model's own dtype"),
    (lambda: _llmc().oneshot_quantize(None, None, "squeezellm"), ValueError, r"method must be 'rtn', 'gptq' or 'awq'"),
    (lambda: _llmc().oneshot_quantize(None, None, "gptq", n_grid=10), TypeError, r"unknown keyword\(s\) \['n_grid'\]"),
]


@pytest.mark.parametrize("call,exc,msg", LLMC_OPTIONS_ERRORS)
def test_llm_compressor_options_refuse(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_llm_compressor_options_default_to_the_librarys():   # accepted: None means llm-compressor's defaults
    llmc = _llmc()
    assert llmc.library_options("gptq") == gptq.GPTQOptions(actorder=True, static_groups=True)
    assert llmc.library_options("awq") == awq.AWQOptions(duo_scaling=True, clip=False)
    assert llmc.library_options("rtn") is None
    assert llmc.library_options("gptq", gptq.GPTQOptions(static_groups=True)).actorder is False


@pytest.mark.parametrize("call,exc,msg", VARIANT_ERRORS)
def test_variants_refuse(tiny_llama, tmp_path, monkeypatch, call, exc, msg):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    with pytest.raises(exc, match=msg):
        call(tiny_llama)


def test_spec_keywords_are_not_ignored(tiny_llama, tmp_path, monkeypatch):  # accepted: bits=8 means 8 bits
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    variants.apply_quantizer(tiny_llama, None, "rtn", bits=8, group_size=32)
    levels = torch.unique(tiny_llama.model.layers[0].mlp.up_proj.weight[0, :32]).numel()
    assert 16 < levels <= 256
    _, _, key = variants.variant(tiny_bench(tiny_llama), "rtn", bits=3, group_size=32)
    assert "w3g32" in key
    assert variants.variant_key("m", "rtn", "ours", QuantSpec(), np.int64(0)).endswith("-c0")


@pytest.mark.parametrize("content,problem", [
    ("[]", "holds list"), ("42", "holds int"), (json.dumps({"k": 42}), "holds int '42' in entry 'k'"),
    (json.dumps({"k": {"ppl": -3.0, "scored_tokens": 10, "label": "x"}}), "bad 'ppl'"),
    (json.dumps({"k": {"ppl": "x", "scored_tokens": 10, "label": "x"}}), "bad 'ppl'"),
    (json.dumps({"k": {"ppl": 12.5, "label": "x"}}), "lacks 'scored_tokens'")])
def test_score_table_that_is_not_one_is_named_and_set_aside(tiny_llama, tmp_path, monkeypatch, capsys, content,
                                                            problem):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    (tmp_path / "scores.json").write_text(content)
    with pytest.raises(ValueError, match=rf"scores.json {problem}|scores.json.*{problem}.*rm "):
        variants.read_scores(tmp_path / "scores.json")
    p = variants.perplexity(tiny_bench(tiny_llama))          # accepted: recomputed, never trusted
    assert p > 1 and (tmp_path / "scores.json.corrupt").exists()
    assert "scores.json" in capsys.readouterr().out and len(variants.remembered_scores()) == 1


def test_variant_json_that_is_not_a_dict_is_rebuilt(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    bench = tiny_bench(tiny_llama)
    _, _, key = variants.variant(bench, "rtn", spec=QuantSpec(4, 32))
    (tmp_path / "variants" / f"{key}.json").write_text("[1, 2]")
    assert variants.stored_meta(bench, "rtn", spec=QuantSpec(4, 32)) is None
    _, meta, _ = variants.variant(bench, "rtn", spec=QuantSpec(4, 32))
    assert meta["cached"] is False and "not the dict of facts" in capsys.readouterr().out


# -------------------------------------------------------------------------------- key_numbers
def report_into(tmp_path, monkeypatch, content="{}"):
    path = tmp_path / "key_numbers.json"
    path.write_text(content)
    monkeypatch.setenv(key_numbers.ENV_VAR, str(path))
    return path


@pytest.mark.parametrize("content,problem", [
    ("[]", "holds list, not the {notebook: {name: value}} report"), ("42", "holds int"),
    (json.dumps({"nb": 42}), "has int under 'nb'"), (json.dumps({"nb": []}), "has list under 'nb'"),
    ('{"nb": {"a"', "is not valid JSON")])
def test_report_file_that_is_not_a_report_is_named(tmp_path, monkeypatch, content, problem):
    report_into(tmp_path, monkeypatch, content)
    with pytest.raises(ValueError, match=rf"key_numbers.json {re.escape(problem)}.*rm '"):
        key_numbers.record("nb", a=1)


KEY_NUMBER_ERRORS = [
    (lambda: key_numbers.record(None, a=1), ValueError, r"notebook must be a non-empty name such as '01_memory"),
    (lambda: key_numbers.record(42, a=1), ValueError, r"notebook must be a non-empty name"),
    (lambda: key_numbers.record("nb"), ValueError, r"needs at least one number to record"),
    (lambda: key_numbers.record("nb", a=object()), TypeError, r"a \(object\) has no value to record: record numbers"),
    (lambda: key_numbers.record("nb", t={"fn": lambda: 1}), TypeError, r"t\['fn'\] \(function\) has no value"),
]


@pytest.mark.parametrize("call,exc,msg", KEY_NUMBER_ERRORS)
def test_key_numbers_refuse(tmp_path, monkeypatch, call, exc, msg):
    report_into(tmp_path, monkeypatch)
    with pytest.raises(exc, match=msg):
        call()


def test_report_variable_naming_a_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(key_numbers.ENV_VAR, str(tmp_path))
    with pytest.raises(ValueError, match=r"COURSE_REPORT=.* names a folder: set it to a file, e.g. .*key_numbers.json"):
        key_numbers.record("nb", a=1)


def test_key_numbers_accept_library_scalars_and_write_valid_json(tmp_path, monkeypatch):  # accepted
    path = report_into(tmp_path, monkeypatch)
    key_numbers.record("nb", a=np.int64(3), b=torch.tensor(2.5), c=np.float64("nan"), d=float("inf"),
                       e=torch.float16)
    assert json.loads(path.read_text()) == {"nb": {"a": 3, "b": 2.5, "c": None, "d": None, "e": "torch.float16"}}
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()


# ----------------------------------------------------------------------------------- evaluate
class WordTok:
    def __call__(self, text, return_tensors=None, max_length=None, truncation=None):
        return {"input_ids": (torch.arange(len(text.split())) % 128)[None, :max_length]}


EVAL_MORE_ERRORS = [
    (lambda m: evaluate.windows(100, 32, bos="yes"), TypeError, r"bos must be True or False"),
    (lambda m: evaluate.perplexity(m, IDS, 32, bos_token_id=-1, progress=False), ValueError,
     r"bos_token_id must be a non-negative integer.*tokenizer's bos_token_id"),
    (lambda m: evaluate.perplexity(m, IDS, 32, bos_token_id=200, progress=False), ValueError,
     r"bos_token_id=200 is outside the vocabulary \[0, 128\)"),
    (lambda m: evaluate.perplexity(m, IDS, 32, bos_token_id=1.0, progress=False), TypeError,
     r"bos_token_id must be an integer"),
    (lambda m: evaluate.perplexity(m, IDS, 32, logits_dtype="bf16", progress=False), TypeError,
     r"logits_dtype must be a floating torch.dtype"),
    (lambda m: evaluate.perplexity(m, IDS, 32, logits_dtype=torch.int64, progress=False), TypeError,
     r"logits_dtype must be a floating torch.dtype"),
    (lambda m: evaluate.agreement(m, m, torch.rand(1, 8)), TypeError, r"prompts must hold integer token ids"),
    (lambda m: evaluate.agreement(m, m, torch.full((1, 8), 500)), ValueError, r"prompts holds token ids in \[500, 500\]"),
    (lambda m: evaluate.agreement(m, m, torch.zeros(1, 0, dtype=torch.long)), ValueError,
     r"prompts must be token ids \[batch, len\]"),
    (lambda m: evaluate.seed_perplexity(m, WordTok(), "one text"), TypeError,
     r"texts must be a non-empty list of strings \(one text: \[text\]\)"),
    (lambda m: evaluate.seed_perplexity(m, WordTok(), []), TypeError, r"texts must be a non-empty list"),
    (lambda m: evaluate.seed_perplexity(m, WordTok(), ["a b c"], 0), ValueError, r"max_length must be a positive"),
    (lambda m: evaluate.seed_perplexity(m, WordTok(), ["a b c", "one"]), ValueError,
     r"texts\[1\] has 1 token: its loss .* is NaN; drop texts .* or use weighting='per_token'"),
    (lambda m: evaluate.seed_perplexity(m, WordTok(), ["one"], weighting="per_token"), ValueError,
     r"no text of texts has a token to score.*longer texts"),
    (lambda m: evaluate.window_nll(torch.zeros(10, 128), torch.zeros(11, dtype=torch.long), 20, 5), ValueError,
     r"window_nll needs n ≤ stop ≤ len\(logits\) = 10"),
]


@pytest.mark.parametrize("call,exc,msg", EVAL_MORE_ERRORS)
def test_evaluate_doors_refuse(tiny_llama, call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(tiny_llama)


# ------------------------------------------------------------------------------------ w4_kernel
def _w4():
    from types import SimpleNamespace

    from helpers import w4_format, w4_kernel
    both = SimpleNamespace(pack_w4=w4_format.pack_w4, W4Weight=w4_format.W4Weight, w4a16_matmul=w4_kernel.w4a16_matmul)
    return both, w4_format.pack_w4(W(16, 256), 64)


W4_ERRORS = [
    (lambda k, p: k.pack_w4(W(16, 256), 48), ValueError, r"in_features=256 must be a multiple of 8 and of group_size=48"),
    (lambda k, p: k.pack_w4(torch.full((4, 128), float("inf")), 64), ValueError, r"non-finite"),
    (lambda k, p: k.W4Weight(p.words[:8], p.scale, p.zero, 64, (16, 256)), ValueError,
     r"W4Weight.words must be torch.int32 of shape \(16, 32\).*pack with pack_w4"),
    (lambda k, p: k.W4Weight(p.words, p.scale[:, :2], p.zero, 64, (16, 256)), ValueError,
     r"W4Weight.scale must be torch.float16 of shape \(16, 4\)"),
    (lambda k, p: k.W4Weight(p.words, p.scale, p.zero, True, (16, 256)), ValueError,
     r"group_size must be a positive multiple of 8"),
    (lambda k, p: k.w4a16_matmul(torch.randn(1, 256), p, dict(KERNEL="gemv", BLOCK_N=-32)), ValueError,
     r"BLOCK_N must be a power of 2 ≥ 16"),
    (lambda k, p: k.w4a16_matmul(torch.randn(1, 256), p, dict(KERNEL="gemv", SPLIT_K=0)), ValueError,
     r"SPLIT_K must be a positive integer"),
    (lambda k, p: k.w4a16_matmul(torch.randn(1, 256), p, dict(KERNEL="gemv", BLOCK_K=96)), ValueError,
     r"unknown keys \['BLOCK_K'\] for KERNEL='gemv'"),
    (lambda k, p: k.w4a16_matmul(torch.ones(1, 256, dtype=torch.int32), p), ValueError,
     r"x must be float16, bfloat16 or float32 activations, got torch.int32"),
    (lambda k, p: k.w4a16_matmul(torch.randn(1, 128), p), ValueError, r"x must be a 2-D tensor \[M, K=256\]"),
    (lambda k, p: k.w4a16_matmul(torch.randn(3, 256), p, dict(KERNEL="gemv")), ValueError,
     r"KERNEL='gemv' computes one row; x has 3 rows"),
    (lambda k, p: k.w4a16_matmul(torch.randn(3, 256), p, dict(KERNEL="tc")), ValueError,
     r"KERNEL='tc' multiplies 16-bit activations"),
    (lambda k, p: k.w4a16_matmul(torch.randn(1, 256, dtype=torch.float16), p, dict(KERNEL="tc", SWAP="yes")), TypeError,
     r"config SWAP must be True or False"),
]


@pytest.mark.parametrize("call,exc,msg", W4_ERRORS)
def test_w4_kernel_doors_refuse(call, exc, msg):
    k, p = _w4()
    with pytest.raises(exc, match=msg):
        call(k, p)


# ------------------------------------------------------------------------------------ clinic
def _clinic():
    from helpers import clinic
    return clinic


CLINIC_ERRORS = [
    (lambda c: c.generation_oom_point(CFG, float("nan"), 4, [512]), ValueError, r"cap_bytes must be a finite number"),
    (lambda c: c.generation_oom_point(CFG, 24e9, 4, "512"), TypeError, r"contexts must be a list of context lengths"),
    (lambda c: c.generation_oom_point(CFG, 24e9, 4, [512, 2.5]), TypeError, r"contexts\[1\] must be an integer"),
    (lambda c: c.simulated_oom([["alloc", "a"]], 1000), ValueError, r"unknown op \['alloc', 'a'\]: an op is \['alloc', name, bytes\]"),
    (lambda c: c.vocab_checks(-1, 10, 10, 5), ValueError, r"tokenizer_len must be a positive integer.*len\(tokenizer\)"),
    (lambda c: c.vocab_checks(10, 10, 10.0, 5), TypeError, r"embedding_rows must be an integer"),
    (lambda c: c.copy_task(torch.nn.Linear(2, 2), torch.arange(100), n=0), ValueError, r"n must be a positive integer"),
    (lambda c: c.copy_task(torch.nn.Linear(2, 2), torch.rand(100), n=2, span=4), TypeError, r"ids must hold integers"),
    (lambda c: c.rtn_part(torch.nn.Linear(2, 2), None, "attn"), TypeError, r"spec must be a QuantSpec"),
    (lambda c: c.calibration_held_bytes(CFG, -128, 512), ValueError, r"n_samples must be a positive integer"),
    (lambda c: c.calibration_held_bytes(CFG, 128, 512, 0), ValueError, r"act_bytes must be a positive integer.*bf16"),
    (lambda c: c.calibration_held_bytes({"hidden_size": 64}, 1, 1), TypeError, r"config must be a model config"),
    (lambda c: c.fp8_support((9,)), ValueError, r"capability must be \(major, minor\)"),
    (lambda c: c.fp8_support(("9", "0")), TypeError, r"capability\[0\] must be an integer"),
    (lambda c: c.caught_oom(42), TypeError, r"fn must be a zero-argument callable"),
    (lambda c: c.caught_oom(lambda: None, need=-1), ValueError, r"need must be a non-negative"),
    (lambda c: c.rankings([{"ppl": 1}]), ValueError, r"rows must be task_drops' three rows"),
    (lambda c: c.task_drops(torch.nn.Linear(2, 2), torch.arange(100), 3), TypeError,
     r"spec must be a QuantSpec \(e.g. QuantSpec\(3, 64\): 3 bits, groups of 64\), got int 3"),
    (lambda c: c.device_full_scenario(4, 2), ValueError, r"request_gib \(2\) must exceed leave_gib \(4\)"),
    (lambda c: c.fragment_on_gpu(0), ValueError, r"block must be a positive integer"),
    (lambda c: c.decode_until_oom(torch.nn.Linear(2, 2), -1, 4), ValueError, r"batch must be a positive integer"),
    (lambda c: c.diagnose_real_ooms([lambda: None]), TypeError, r"scenarios must be OOMScenario objects"),
    (lambda c: c.shared_gpu_demo([(4.0, float("inf"))]), ValueError, r"participants\[0\] must be \(cap GiB, wanted GiB\)"),
]


@pytest.mark.parametrize("call,exc,msg", CLINIC_ERRORS)
def test_clinic_doors_refuse(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(_clinic())


def test_clinic_accepts_numpy_integers():
    rows = _clinic().generation_oom_point(CFG, np.float64(24e9), np.int64(2), [np.int64(64)])
    assert rows[0]["context"] == 64 and type(rows[0]["context"]) is int and rows[0]["batch"] == 2
    assert _clinic().fp8_support((np.int64(9), np.int64(0))).startswith("compute capability 9.0")


# ------------------------------------------------------------------------------------ widgets
def _widgets():
    from helpers import widgets
    return widgets


WIDGET_ERRORS = [
    (lambda w: w.kv_formats("SmolLM2-135M", -1, 2), ValueError, r"seq_len must be a positive integer"),
    (lambda w: w.kv_formats("SmolLM2-135M", 512, 0), ValueError, r"batch must be a positive integer"),
    (lambda w: w.kv_formats(42, 512, 2), TypeError, r"arch must be a model config"),
    (lambda w: w.kv_formats("NotAModel", 512, 2), ValueError, r"unknown architecture 'NotAModel'"),
    (lambda w: w.kv_point(torch.nn.Linear(2, 2), 512, 2, extra=-1), ValueError, r"extra must be a non-negative"),
    (lambda w: w.kv_point(torch.nn.Linear(2, 2), 0, 2), ValueError, r"seq_len must be a positive integer"),
    (lambda w: w.allocator_run("a=1MiB", cap_mib=float("nan")), ValueError, r"cap_mib must be a finite number"),
    (lambda w: w.allocator_run("a=1MiB", cap_mib=-5), ValueError, r"cap_mib must be a non-negative"),
    (lambda w: w.allocator_run("a=1MiB", expandable="yes"), TypeError, r"expandable must be True or False"),
    (lambda w: w.allocator_run(None), ValueError, r"ops must be text such as 'a=300MiB; free a'"),
    (lambda w: w.budget_point("SmolLM2-135M", 512, 1, kv_dtype="e4m3"), ValueError, r"kv_dtype must be one of"),
    (lambda w: w.budget_point("SmolLM2-135M", 512, 1, dtype="int5"), ValueError, r"unknown weight format 'int5'"),
    (lambda w: w.budget_point("SmolLM2-135M", 512, 1, measure_on_device="no"), TypeError,
     r"measure_on_device must be True or False"),
    (lambda w: w.load_measured("SmolLM2-135M", "int8"), ValueError, r"dtype 'int8' cannot be built to measure"),
]


@pytest.mark.parametrize("call,exc,msg", WIDGET_ERRORS)
def test_widget_doors_refuse(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(_widgets())


def test_widgets_accept_numpy_integers():
    p = _widgets().budget_point("SmolLM2-135M", np.int64(256), np.int64(2), measure_on_device=False)
    assert p["parts"] == _widgets().budget_point("SmolLM2-135M", 256, 2, measure_on_device=False)["parts"]


# ------------------------------------------------------------------------------------ budget's newer arguments
BUDGET_NEWER_ERRORS = [
    (lambda: budget.kv_bytes(CFG, float("nan"), 1), ValueError, r"seq_len must be a positive integer"),
    (lambda: budget.kv_bytes(CFG, 512, 1, "fp7"), ValueError, r"unknown dtype 'fp7'"),
    (lambda: budget.kv_bytes(CFG, 512, 1, "int4", budget.KVLayout(group_size=0)), ValueError, r"group_size must be a positive"),
    (lambda: budget.activation_bytes(CFG, 512, 1, attention="flashy"), ValueError, r"attention must be 'sdpa' or 'eager'"),
    (lambda: budget.activation_bytes(CFG, 512, 1, cached="yes"), ValueError, r"cached must be True or False"),
    (lambda: budget.generation_peak(CFG, 512, -1, 1), ValueError, r"new_tokens must be a positive integer"),
    (lambda: budget.budget(CFG, "bf16", 512, 1, kv_dtype="fp9"), ValueError, r"unknown dtype 'fp9'"),
    (lambda: budget.weight_bytes(CFG, "int5"), ValueError, r"unknown weight format 'int5'"),
    (lambda: _replay().device_footprint(CFG, 512, 16, 1, float("nan")), ValueError, r"non_torch_bytes must be bytes ≥ 0"),
    (lambda: _replay().device_footprint(CFG, 512, 16, 1, 0, "flash9"), ValueError, r"attention must be one of"),
    (lambda: _kv().kv_storage_positions(CFG, 512, -3), ValueError, r"steps must be an int ≥ 0"),
    (lambda: budget.param_counts({"hidden_size": 4}), ValueError, r"config lacks"),
]


def _replay():
    from helpers import budget_replay
    return budget_replay


def _kv():
    from helpers import budget_kv
    return budget_kv


@pytest.mark.parametrize("call,exc,msg", BUDGET_NEWER_ERRORS)
def test_budget_newer_doors_refuse(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()
