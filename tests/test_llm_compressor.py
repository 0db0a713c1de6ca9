import pytest
import torch

pytest.importorskip("llmcompressor")

from helpers import llm_compressor as llmc  # noqa: E402
from helpers.qspec import QuantSpec  # noqa: E402


def test_pin_memory_workaround_is_scoped():
    from llmcompressor.pipelines.cache import IntermediatesCache

    original = IntermediatesCache.pin_memory
    with llmc.cpu_pin_memory_workaround():
        if not torch.accelerator.is_available():
            assert IntermediatesCache.pin_memory is not original
    assert IntermediatesCache.pin_memory is original


def test_scheme_and_bad_method(tiny_llama, tiny_calib):
    s = llmc.scheme(QuantSpec(3, 32))
    assert s.weights.num_bits == 3 and s.weights.group_size == 32 and not s.weights.symmetric
    assert llmc.scheme(bits=8, group_size=None).weights.strategy == "channel"
    with pytest.raises(ValueError, match="method must be"):
        llmc.oneshot_quantize(tiny_llama, tiny_calib, "squeezellm")


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_quantize_save_reload_tiny(method, tiny_llama, tiny_calib, tmp_path):
    r = llmc.oneshot_quantize(tiny_llama, tiny_calib, method, bits=4, group_size=32)
    assert r["calib_tokens"] == tiny_calib.numel() and r["seconds"] > 0
    w = tiny_llama.model.layers[0].mlp.down_proj.weight.data
    assert all(len(torch.unique(row)) <= 16 for row in w.reshape(-1, 32))
    dev = next(tiny_llama.parameters()).device
    with torch.no_grad():
        ref = tiny_llama(tiny_calib.to(dev)).logits.cpu()
    info = llmc.save_compressed(tiny_llama, None, tmp_path / "ckpt")
    assert info["safetensors_bytes"] > 0
    back = llmc.load_compressed(tmp_path / "ckpt")     # compared on the CPU, wherever oneshot left the model
    with torch.no_grad():
        out = back(tiny_calib).logits
    assert torch.allclose(out, ref, atol=1e-3)


def test_batched_calibration_matches_batch_one(tiny_llama, tiny_calib):
    """The course's batches of 8 windows give the library's batch-1 AWQ up to float rounding: the
    same scales chosen, so nearly every code the same."""
    import copy

    one, batched = copy.deepcopy(tiny_llama), copy.deepcopy(tiny_llama)
    assert llmc.oneshot_quantize(one, tiny_calib, "awq", QuantSpec(4, 32), batch_size=1)["batch_size"] == 1
    assert llmc.oneshot_quantize(batched, tiny_calib, "awq", QuantSpec(4, 32))["batch_size"] == 8
    a, b = dict(one.named_parameters()), dict(batched.named_parameters())
    off = total = 0
    for name, p in a.items():
        q = b[name].data.to(p.device)
        off += int((~torch.isclose(p.data, q, rtol=1e-3, atol=1e-3 * float(p.data.abs().max()))).sum())
        total += p.numel()
    assert off <= total // 500, f"{off} of {total} values differ: more than rounding ties"


def test_batch_size_must_be_a_positive_int(tiny_llama, tiny_calib):
    with pytest.raises(ValueError, match="batch_size"):
        llmc.oneshot_quantize(tiny_llama, tiny_calib, "awq", QuantSpec(4, 32), batch_size=0)


def test_roundtrip_reports_bytes_and_agreement(tiny_llama, tiny_calib, tmp_path):
    llmc.oneshot_quantize(tiny_llama, tiny_calib, "gptq", bits=4, group_size=32)
    r = llmc.roundtrip(tiny_llama, None, tmp_path / "ckpt", tiny_calib[:1])
    assert r["safetensors_bytes"] > 0 and r["agreement"] == 1.0 and r["max_abs_logit_diff"] < 1e-3


def test_a_plain_model_is_refused_not_written_dense_as_compressed(tiny_llama, tiny_calib, tmp_path):
    """A variant loaded from the store is a plain model (dense weights holding the quantized values):
    saved "compressed" it would be written dense and agree perfectly, a wrong size under the right name."""
    with pytest.raises(ValueError, match="oneshot_quantize first"):
        llmc.roundtrip(tiny_llama, None, tmp_path / "ckpt", tiny_calib[:1])
    assert not (tmp_path / "ckpt").exists()


def test_our_gptq_is_bit_identical_to_llm_compressor_on_the_first_block(tiny_llama, tiny_calib):
    """Same inputs, same settings (W4 g32 asymmetric, act-order with static groups, dampening 1 %,
    blocks of 128 — the library's defaults, options=None): block 0's weights come out bit-identical
    (notebook 04 states this)."""
    import copy

    from helpers import gptq

    ours, lib = copy.deepcopy(tiny_llama), copy.deepcopy(tiny_llama)
    gptq.gptq_model(ours, tiny_calib, QuantSpec(4, 32), gptq.GPTQOptions(actorder=True, static_groups=True),
                    progress=False)
    llmc.oneshot_quantize(lib, tiny_calib, "gptq", QuantSpec(4, 32))
    for name, mod in ours.model.layers[0].named_modules():
        if isinstance(mod, torch.nn.Linear):
            theirs = lib.model.layers[0].get_submodule(name).weight.data.to(mod.weight.device)
            assert torch.equal(mod.weight.data, theirs), name


def test_options_reach_the_library_gptq_without_act_order(tiny_llama, tiny_calib):
    """GPTQOptions(actorder=False, static_groups=True) is the library's actorder=None: columns in order,
    static grids. Block 0 matches ours but for a code or so at a rounding tie (the two sum in another
    order); the default (act-order) run differs from it."""
    import copy

    from helpers import gptq

    options = gptq.GPTQOptions(actorder=False, static_groups=True)
    ours, lib, default = copy.deepcopy(tiny_llama), copy.deepcopy(tiny_llama), copy.deepcopy(tiny_llama)
    gptq.gptq_model(ours, tiny_calib, QuantSpec(4, 32), options, progress=False)
    llmc.oneshot_quantize(lib, tiny_calib, "gptq", QuantSpec(4, 32), options)
    llmc.oneshot_quantize(default, tiny_calib, "gptq", QuantSpec(4, 32))
    differ = total = moved = 0
    for name, mod in ours.model.layers[0].named_modules():
        if isinstance(mod, torch.nn.Linear):
            theirs = lib.model.layers[0].get_submodule(name).weight.data.to(mod.weight.device)
            differ += int((mod.weight.data != theirs).sum())
            total += mod.weight.numel()
            moved += int((default.model.layers[0].get_submodule(name).weight.data.to(theirs.device) != theirs).sum())
    assert differ <= total // 1000 and moved > total // 100


def test_oneshot_logs_are_quieted_and_restored(tiny_llama, tiny_calib, capfd):
    """What a notebook cell shows of our call: one progress bar of ours, none of the library's
    per-layer bars, no log lines — even though ``oneshot`` reconfigures its logger when it starts.
    Afterwards the library is as it was: a direct ``oneshot`` draws its own bars and logs again."""
    import copy

    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier

    other = copy.deepcopy(tiny_llama)
    capfd.readouterr()
    llmc.oneshot_quantize(tiny_llama, tiny_calib, "gptq", QuantSpec(4, 32))
    ours = capfd.readouterr()
    shown = ours.out + ours.err
    assert "llm-compressor gptq" in ours.err                     # our one bar
    assert "Calibrating" not in shown and "Propagating" not in shown
    assert " | INFO - " not in shown and " | WARNING - " not in shown and "METRIC" not in shown
    recipe = [GPTQModifier(config_groups={"g": QuantSpec(4, 32).to_llmcompressor()}, ignore=["lm_head"])]
    llmc._give_path(other)   # the library re-reads the config from a path
    with llmc.cpu_pin_memory_workaround():
        oneshot(model=other, dataset=llmc._dataset(tiny_calib), recipe=recipe, processor=llmc._PreTokenized(),
                max_seq_length=tiny_calib.shape[1], num_calibration_samples=len(tiny_calib), pipeline="sequential")
    theirs = capfd.readouterr()
    assert "Calibrating" in theirs.err and "Propagating" in theirs.err   # its own bars are back


def test_library_bars_are_dropped_and_counted_other_text_passes():
    """What the libraries' tqdm bars write while quiet_logs runs: redraws (a leading carriage return),
    a bar's closing newline and cursor moves are dropped; "(k/n): Calibrating" moves our bar to k of n;
    a warning's text goes through."""
    import io

    shown = io.StringIO()
    err = llmc._LibraryBars(shown, "ours", bar_file=io.StringIO())
    err.write("\rPropagating: 100%|##########| 2/2")
    assert err.bar is None                       # no bar until a layer is calibrated (RTN shows none)
    for s in ["\r(3/9): Calibrating:   0%|          | 0/2 [00:00<?, ?it/s]", "\n", "\x1b[A\x1b[A", "\r",
              "\rPropagating: 100%|##########| 2/2", "UserWarning: something the learner should see\n"]:
        assert err.write(s) == len(s)
    ours = err.bar
    assert shown.getvalue() == "UserWarning: something the learner should see\n"
    assert (ours.n, ours.total) == (3, 9)
    err.write("\r(4/9): Calibrating:  50%|#####     | 1/2")
    assert ours.n == 4


def test_our_bar_stays_on_one_line_while_a_library_bar_is_open():
    """The library's bars are open while ours runs: ours is drawn at position 0 with carriage returns
    only, no cursor moves (ESC[A) or newlines a notebook would show as stray lines."""
    import io

    from tqdm import tqdm

    drawn = io.StringIO()
    err = llmc._LibraryBars(io.StringIO(), "ours", bar_file=drawn)
    library = tqdm(total=2, desc="Calibrating", file=err)          # open, as the library's is
    for k in range(1, 4):
        err.write(f"\r({k}/3): Calibrating:   0%|          | 0/2")
    library.close()
    err.close()
    out = drawn.getvalue()
    assert "\x1b[A" not in out and out.count("\n") <= 1 and "3/3" in out


def test_quiet_logs_uses_the_libraries_switches_and_restores_them(capsys, monkeypatch):
    import os
    import sys

    import datasets
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("LLM_COMPRESSOR_LOG_DISABLED", raising=False)
    hf_logging.enable_progress_bar()
    datasets.enable_progress_bars()
    err = sys.stderr
    with llmc.quiet_logs("counting"):
        assert not hf_logging.is_progress_bar_enabled() and datasets.are_progress_bars_disabled()
        assert os.environ["LLM_COMPRESSOR_LOG_DISABLED"] == "true" and sys.stderr is not err
        print("UserWarning: a warning still shows", file=sys.stderr)   # as warnings.showwarning writes it
        sys.stderr.write("\r(1/2): Calibrating:   0%|          | 0/2")    # a layer calibrated: our bar appears
    assert sys.stderr is err and "LLM_COMPRESSOR_LOG_DISABLED" not in os.environ
    assert hf_logging.is_progress_bar_enabled() and not datasets.are_progress_bars_disabled()
    shown = capsys.readouterr().err
    assert "a warning still shows" in shown and "counting" in shown
    hf_logging.disable_progress_bar()                     # a learner's own choice is kept
    try:
        with llmc.quiet_logs():
            pass
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()
    with pytest.raises(RuntimeError, match="inside"), llmc.quiet_logs():
        raise RuntimeError("inside")
    assert sys.stderr is err and hf_logging.is_progress_bar_enabled()
