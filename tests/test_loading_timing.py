"""Loading peaks and times (helpers.loading), the roofline (helpers.timing), llama.cpp (helpers.gguf_run)."""
import math
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers import generation, gguf_run, loading, timing


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    cfg = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    loading.write_pickle_copy(folder)
    return folder


def test_naive_load_peaks_well_above_lazy(checkpoint):
    """Also in a process whose heap is warm: pages an earlier job freed are handed back before the load,
    else the naive load reuses them and its resident set hardly grows (it once read 2 MB against 7 MB)."""
    junk = [torch.randn(1 << 16) for _ in range(1200)]                   # 300 MiB allocated, then freed
    del junk
    naive, lazy = loading.load_peaks(checkpoint, "cpu", torch.bfloat16)
    assert naive["param_bytes"] == 2 * lazy["param_bytes"]                 # fp32 vs bf16 parameters
    assert naive["peak_bytes"] > 1.5 * lazy["peak_bytes"] > 0              # fp32 model + a whole state dict


def test_lazy_and_naive_load_the_same_tensors(checkpoint):
    a = loading.load_lazy(checkpoint, "cpu", torch.bfloat16)
    b = loading.load_naive(checkpoint, "cpu")
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa.float(), pb.float())


@pytest.fixture(scope="module")
def two_formats(tmp_path_factory):
    state = loading.demo_state(1, layers=2)                       # h = 128: 18 tensors, 1 MiB
    return loading.write_both_formats(state, tmp_path_factory.mktemp("formats")), state


def test_demo_state_is_decoder_shaped():
    s = loading.demo_state(4, layers=3)
    assert len(s) == 27 and s["layers.0.q"].shape == (192, 192) and s["layers.2.down"].shape == (192, 576)
    assert all(t.dtype == torch.bfloat16 for t in s.values())
    assert 0.5 * 4 * 2**20 < sum(t.numel() * 2 for t in s.values()) <= 4 * 2**20


def test_both_formats_hold_the_same_tensors(two_formats):
    from safetensors.torch import load_file
    folder, state = two_formats
    st, pk = load_file(folder / "model.safetensors"), torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert st.keys() == pk.keys() == state.keys() and all(torch.equal(st[k], pk[k]) for k in st)


def test_format_load_times_rows(two_formats):
    r = loading.format_load_times(two_formats[0], repeats=3)
    assert r["tensors"] == 18 and r["repeats"] == 3 and set(r["files_bytes"]) == set(loading.FORMATS)
    caches = ("warm", "cold") if r["cold"]["ran"] else ("warm",)
    assert r["cold"]["ran"] or r["cold"]["why_not"]                         # cold skipped only with a reason
    assert [(x["format"], x["cache"]) for x in r["rows"]] == [(f, c) for c in caches for f in loading.FORMATS]
    for x in r["rows"]:
        assert len(x["seconds"]) == 3 and 0 < x["min_s"] <= x["median_s"] <= x["max_s"]
        assert x["spread"] == pytest.approx((x["max_s"] - x["min_s"]) / x["median_s"])
    warm = loading.format_load_times(two_formats[0], repeats=1, cold=False)
    assert {x["cache"] for x in warm["rows"]} == {"warm"} and not warm["cold"]["ran"]


def test_dropped_pages_come_back_only_when_touched(two_formats):
    path = two_formats[0] / "pytorch_model.bin"
    left = loading.drop_page_cache(path)
    if left is None or left > 0.05:
        pytest.skip(f"posix_fadvise/mincore cannot drop or see this file's pages here (resident: {left})")
    state = torch.load(path, weights_only=True, mmap=True)               # mapped, not read
    assert loading.resident_fraction(path) < 0.5
    loading._touch(state)                                                # one byte per page: every page read
    assert loading.resident_fraction(path) > 0.95


def test_load_formats_bad_input(two_formats, tmp_path):
    folder = two_formats[0]
    for call, exc, msg in [
        (lambda: loading.format_load_times(folder, repeats=0), ValueError, "repeats must be a positive integer"),
        (lambda: loading.format_load_times(folder, repeats=2.0), TypeError, "repeats must be an integer"),
        (lambda: loading.format_load_times(folder, cold="yes"), TypeError, "cold must be True or False"),
        (lambda: loading.format_load_times(tmp_path / "nope"), FileNotFoundError, "nope is not a directory"),
        (lambda: loading.demo_state(-1), ValueError, "mib must be"),
        (lambda: loading.demo_state(0.01), ValueError, "mib=0.01 is too small for layers=16"),
        (lambda: loading.demo_state(8, layers=0), ValueError, "layers must be a positive integer"),
        (lambda: loading.demo_state(8, dtype=torch.int8), ValueError, "dtype must be a floating dtype"),
        (lambda: loading.write_both_formats({}, tmp_path), TypeError, "state must be a non-empty dict of tensors"),
        (lambda: loading.write_both_formats({"w": [1.0]}, tmp_path), TypeError, "state must be a non-empty dict"),
        (lambda: loading.write_both_formats({"w": torch.zeros(2)}, 42), TypeError, "folder must be a directory"),
    ]:
        with pytest.raises(exc, match=msg):
            call()
    import json
    bad = tmp_path / "load_formats.json"
    for content, problem in [("[]", "is not the"), (json.dumps({"runs": [{"rows": []}]}), "no rows in run 0"),
                             (json.dumps({"runs": [{"rows": [{"format": "x"}]}]}), "lacks 'cache' in run 0 row 0")]:
        bad.write_text(content)
        with pytest.raises(ValueError, match=problem):
            loading.read_load_formats(bad)


def test_the_recorded_benchmark_reads_back():
    from helpers.config import results_path
    data = loading.read_load_formats(results_path("cpu", "load_formats.json"))
    assert {r["format"] for run in data["runs"] for r in run["rows"]} == set(loading.FORMATS)


def test_loading_bad_input(tmp_path):
    from safetensors.torch import save_file
    with pytest.raises(FileNotFoundError, match="no .safetensors"):
        loading.write_pickle_copy(tmp_path)
    save_file({"w": torch.zeros(4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="write_pickle_copy"):
        loading.format_load_times(tmp_path)


def test_peak_rss_sees_a_big_temporary():
    _, peak = loading.peak_rss_during(lambda: torch.ones(64 * 2**20).sum())     # 256 MiB, freed at once
    assert peak >= 200 * 2**20


def test_roofline():
    assert timing.roofline_tokens_per_s(16e9, 4000) == pytest.approx(250)
    assert timing.roofline_tokens_per_s(16e9, 4000, kv_bytes=4e9) == pytest.approx(200)
    with pytest.raises(ValueError, match="positive"):
        timing.roofline_tokens_per_s(0, 4000)
    import time
    assert 19 <= timing.cpu_ms(lambda: time.sleep(0.02), iters=3) < 200      # the timer reads 20 ms as 20 ms
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="cpu_ms"):
            timing.gpu_ms(lambda: None)
        with pytest.raises(RuntimeError, match="L2 size"):
            timing.copies_past_l2(2**20)
    else:
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        assert timing.copies_past_l2(l2) == 3 and timing.copies_past_l2(10 * l2) == 2


def test_decode_speed_of_a_tiny_model():
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2)).eval()
    import time
    hook = m.register_forward_pre_hook(lambda *_: time.sleep(0.02))    # every forward takes ≥ 20 ms
    r = generation.decode_speed(m, torch.arange(10), 4)
    hook.remove()
    assert r["new_tokens"] == 4 and 10 < r["decode_tok_s"] <= 50        # 3 decode steps of ≥ 20 ms each
    assert 50 < r["prefill_tok_s"] <= 500                                # 10 prompt tokens in one ≥ 20 ms forward
    with pytest.raises(ValueError, match="1-D"):
        generation.decode_speed(m, torch.arange(10)[None], 4)
    with pytest.raises(ValueError, match="new_tokens must be"):
        generation.decode_speed(m, torch.arange(10), 1)


@pytest.mark.skipif(not gguf_run.available(), reason="llama-cpp-python is an optional extra (builds from source, "
                    "5-10 min on 2 cores): " + gguf_run.INSTALL)
def test_llama_cpp_perplexity_agrees_with_ours(offline_model, text_available):
    from helpers import data
    model, tok = offline_model
    ids = data.tokens(tok, "eval")[:1024]
    from helpers import evaluate
    ours = evaluate.perplexity(model, ids, seq_len=256, progress=False)
    with gguf_run.open_gguf(n_ctx=300) as llm:
        theirs = gguf_run.perplexity(llm, ids, seq_len=256, progress=False)
        with pytest.raises(ValueError, match="n_ctx"):
            gguf_run.perplexity(llm, ids, seq_len=4096)
    assert theirs["scored_tokens"] == ours["scored_tokens"]
    assert abs(math.log(theirs["ppl"] / ours["ppl"])) < 0.02                 # within 2 %


def test_a_write_that_fails_halfway_leaves_the_earlier_files_whole(tmp_path, monkeypatch):
    """A workshop's participants share the cache folder: a file is renamed into place only once whole."""
    state = {"w": torch.arange(4096, dtype=torch.float32)}
    folder = loading.write_both_formats(state, tmp_path / "f")
    before = (folder / "pytorch_model.bin").read_bytes()

    def dies_halfway(obj, path):
        Path(path).write_bytes(before[: len(before) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(loading.torch, "save", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        loading.write_both_formats({"w": torch.zeros(4096)}, folder)
    assert (folder / "pytorch_model.bin").read_bytes() == before
    assert torch.load(folder / "pytorch_model.bin", weights_only=True)["w"].equal(state["w"])
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors", "pytorch_model.bin"]


def test_graph_ms_replays_untimed_for_warm_ms_before_it_times():
    """timing.graph_ms: the graph replayed untimed for at least ``warm_ms`` (the card's clocks up), then
    ``replays`` timed; a counter captured in the graph counts every run. Bad input names the argument."""
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA graphs"):
            timing.graph_ms([lambda: None])
        return
    with pytest.raises(ValueError, match="fns"):
        timing.graph_ms([])
    with pytest.raises(ValueError, match="warm_ms"):
        timing.graph_ms([lambda: None], warm_ms=-1)
    runs = torch.zeros((), device="cuda")

    def step():
        torch.cuda._sleep(500_000)     # about 0.3 ms at the H100's clock
        runs.add_(1)
    ms = timing.graph_ms([step], replays=20, warmup=2, warm_ms=30.0)
    warm = runs.item() - 2 - 1 - 20    # eager warm-ups, the first replay, the timed replays
    assert warm >= 8 and warm * ms >= 30.0 * 0.9, (warm, ms)
