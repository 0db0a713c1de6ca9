"""Loading peaks and times (helpers.loading), the roofline (helpers.timing), llama.cpp (helpers.gguf_run)."""
import math

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
    naive, lazy = loading.load_peaks(checkpoint, "cpu", torch.bfloat16)
    assert naive["param_bytes"] == 2 * lazy["param_bytes"]                 # fp32 vs bf16 parameters
    assert naive["peak_bytes"] > 1.5 * lazy["peak_bytes"] > 0              # fp32 model + a whole state dict


def test_read_seconds_and_same_tensors(checkpoint):
    s = loading.read_seconds(checkpoint)
    assert set(s) == {"safetensors", "torch.load", "torch.load mmap"} and all(v > 0 for v in s.values())
    a = loading.load_lazy(checkpoint, "cpu", torch.bfloat16)
    b = loading.load_naive(checkpoint, "cpu")
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa.float(), pb.float())


def test_loading_bad_input(tmp_path):
    from safetensors.torch import save_file
    with pytest.raises(FileNotFoundError, match="no .safetensors"):
        loading.write_pickle_copy(tmp_path)
    save_file({"w": torch.zeros(4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="write_pickle_copy"):
        loading.read_seconds(tmp_path)


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
