import pytest
import torch
from transformers import LlamaConfig

from helpers import envcheck, generation, kvcache, leaks, measure
from helpers.models import model_from_config

GiB = 2**30


def tiny():
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return model_from_config(cfg, dtype=torch.float32)


def test_top_tensors_dedupes_views():
    big = torch.zeros(1000, 1000)
    view = big[:10]  # noqa: F841  (a second tensor object on the same storage)
    p = torch.nn.Parameter(torch.zeros(900, 1000))
    rows = measure.top_tensors(50, device="cpu")
    mine = [r for r in rows if r["bytes"] in (4_000_000, 3_600_000)]
    assert any(r["bytes"] == 4_000_000 and r["views"] >= 2 and not r["parameter"] for r in mine)
    assert any(r["bytes"] == 3_600_000 and r["parameter"] for r in mine)
    del big, view, p


def test_stage_profiler_adds_up():
    prof = measure.StageProfiler()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with prof.stage("a"):
        x = torch.ones(1000, 1000, device=dev)
    r = prof.table()[0]
    assert r["stage"] == "a" and r["backend"] == ("cuda" if dev == "cuda" else "cpu-rss")
    if dev == "cuda":
        # the request is rounded up to 512 B; a cached free block is handed out whole when splitting it
        # would leave ≤ 1 MiB (large pool), so the delta is the size of the block x got — read it from
        # the allocator's snapshot (on the H200 the suite once reused a free 4 MiB block: 4,194,304 B)
        rounded = -(-4_000_000 // 512) * 512
        block = next(b["size"] for s in torch.cuda.memory_snapshot() for b in s["blocks"]
                     if b["state"] == "active_allocated" and b.get("address") == x.data_ptr())
        assert rounded <= block <= rounded + 2**20
        assert r["delta"] == block and r["peak_over_start"] == block
    else:  # RSS only (the allocator may reuse freed pages, so no size is promised): the documented rule
        assert r["delta"] == r["end"] - r["start"] and r["peak"] == max(r["start"], r["end"])
        assert r["reserved"] == r["end"]
    assert r["peak"] >= max(r["start"], r["end"])
    del x


def test_fp8_layer_roundtrip_bound_and_bytes():
    torch.manual_seed(0)
    k = torch.randn(2, 3, 17, 16)
    for fmt in ("e4m3fn", "e5m2"):
        layer = kvcache.FP8Layer(fmt)
        k_out, _ = layer.update(k, k.clone())
        assert ((k_out.float() - k).abs() <= kvcache.fp8_roundtrip_bound(k, fmt) + 1e-7).all()
        # exact bytes: 1 byte per element for K and V, plus one fp32 scale per KV head each
        assert kvcache.stored_bytes(kvcache.Cache(layers=[layer])) == 2 * k.numel() + 2 * 3 * 4
        assert layer.get_seq_length() == 17


def test_int4_layer_bytes_and_shapes():
    layer = kvcache.Int4Layer(q_group_size=16, residual_length=4)
    k = torch.randn(1, 2, 20, 16)
    out, _ = layer.update(k, k.clone())
    assert out.shape == k.shape
    for _ in range(5):
        out, _ = layer.update(k[:, :, :1], k[:, :, :1].clone())
    assert out.shape[2] == 25 and layer.get_seq_length() == 25
    # bytes: 24 tokens quantized (20 prefill + 4 re-quantized when the residual reached 4), 1 in fp32;
    # per quantized token and head: 16 codes in 8 bytes + an fp16 scale and an fp16 minimum (1 group)
    quantized, residual = 24 * 2 * (8 + 2 + 2), 1 * 2 * 16 * 4
    assert kvcache.stored_bytes(kvcache.Cache(layers=[layer])) == 2 * (quantized + residual)


def test_fp8_cache_generates_with_right_lengths():
    m = tiny()
    ids = torch.randint(0, 128, (2, 12))
    base = m.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    for kind in ("fp8-e4m3", "int4"):
        cache = kvcache.make_cache(kind, m.config)
        out = m.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0,
                         past_key_values=cache)
        assert out.shape == base.shape and cache.get_seq_length() == 12 + 6 - 1
        assert torch.equal(out[:, :12], ids)
    # tiny random model, e4m3 with margin: the greedy continuation is unchanged on this case
    cache = kvcache.make_cache("fp8-e4m3", m.config)
    out = m.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, past_key_values=cache)
    assert torch.equal(out, base)
    with pytest.raises(ValueError, match="unknown KV cache"):
        kvcache.make_cache("int3", m.config)


def test_compare_logits():
    a = torch.randn(1, 5, 10)
    r = generation.compare_logits(a, a)
    assert r["top1_agreement"] == 1.0 and abs(r["mean_kl"]) < 1e-6


@pytest.mark.parametrize("fn", [leaks.kept_graph, leaks.accumulated_list, leaks.global_reference])
def test_leaks_measured_and_fixed(fn):
    dev = torch.device("cpu")
    start = leaks.live_bytes(dev)
    bad, good = fn(dev, steps=4), fn(dev, steps=4, fix=True)
    assert bad >= 4 * 64 * 1024 * 4 and good < bad / 10
    assert leaks.live_bytes(dev) == start


def test_envcheck_reports_missing(tmp_path):
    req = tmp_path / "r.txt"
    req.write_text("torch>=1.0\nsurely-not-installed-pkg==1.0  # comment\n")
    rows = envcheck.check(req, echo=False)
    assert rows[0]["ok"] and not rows[1]["ok"] and rows[1]["installed"] is None


def test_missing_zero_grad_is_not_a_leak():
    r = leaks.missing_zero_grad(torch.device("cpu"), steps=4, batch=8)
    assert r["same_storages"] and r["bytes_after_last"] == r["bytes_after_first"] > 0
    assert r["grad_norm_growth"] == pytest.approx(4.0, rel=1e-4)   # identical steps: the sum of 4 gradients


def test_peak_meter_counts_what_the_block_allocated_over_its_base():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    keep = torch.ones(256, 1024, device=dev)                     # live before: part of the base, not the peak
    with measure.PeakMeter(dev) as m:
        tmp = torch.ones(1024, 1024, device=dev)                 # 4 MiB, freed inside the window
        del tmp
        first = m.read()
        m.restart()
        small = torch.ones(16, 1024, device=dev)
    if dev == "cpu":
        assert m.peak is None and first is None and m.base is None
    else:
        assert first >= 4 * 2**20 and m.base >= keep.numel() * 4
        assert 16 * 1024 * 4 <= m.peak < 4 * 2**20                # the restarted window saw only `small`
    del keep, small


def test_greedy_tokens_is_the_hand_written_loop():
    model = tiny().eval()
    ids = torch.randint(3, 127, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = kvcache.make_cache("baseline", model.config)
        nxt = generation.prefill(model, ids, cache)
        got = [t for _, t in zip(range(5), generation.greedy_tokens(model, cache, nxt))]
        want, out = [], model(ids, use_cache=True)
        tok, past = out.logits[:, -1:].argmax(-1), out.past_key_values
        assert torch.equal(tok, nxt)
        for _ in range(5):
            out = model(tok, past_key_values=past, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            want.append(tok)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and cache.get_seq_length() == 12 + 5


@pytest.mark.parametrize("kind", ["baseline", "fp8-e4m3"])
def test_tokens_until_oom_without_a_cap_decodes_max_new_and_times_it(kind):
    """No cap on a CPU: every format decodes all ``max_new`` tokens; the decode loop's time is kept
    (what a hunt costs per step), and a run that never decodes reports none."""
    model = tiny().eval()
    with torch.no_grad():
        r = generation.tokens_until_oom(model, kind, batch=2, prompt_len=8, max_new=6)
        none = generation.tokens_until_oom(model, kind, batch=2, prompt_len=8, max_new=0)
    assert r["generated"] == 6 and not r["oom"] and r["phase"] is None and r["decode_s"] > 0
    assert none["generated"] == 0 and none["decode_s"] >= 0
