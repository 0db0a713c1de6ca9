import json

import pytest
import torch

from helpers import variants
from helpers.course_model import Bench
from helpers.qspec import QuantSpec


def make_bench(model, seed=0, real_text=True):
    """A bench of random ids (``real_text=False``: calibration windows are random ids too, no tokenizer)."""
    ids = torch.randint(0, 128, (400,), generator=torch.Generator().manual_seed(seed))
    return Bench(model, None, True, real_text, ids, "tiny",
                 {"calib_samples": 2, "seq_len": 32, "eval_tokens": 128, "n_grid": 4})


def test_scores_are_keyed_by_what_determines_them(tiny_llama, tmp_path, monkeypatch):
    """Another text, another dtype, other weights or another protocol: never a remembered value."""
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    bench = make_bench(tiny_llama)
    m, meta, key = variants.variant(bench, "rtn", spec=QuantSpec(4, 32))
    assert meta["cached"] is False
    p = variants.perplexity(bench, m, key)
    table = variants.remembered_scores()
    assert [r["ppl"] for r in table.values()] == [p] and next(iter(table.values()))["label"] == key
    assert variants.perplexity(bench, m, key) == p and len(variants.remembered_scores()) == 1
    # another text (the case a stale key missed: COURSE_WIKITEXT pointed elsewhere)
    other_text = make_bench(m, seed=1)
    assert variants.perplexity(other_text, m) != p
    # another dtype of the same weights
    m16 = m.to(torch.bfloat16)
    assert variants.perplexity(bench, m16) != p
    m.float()
    # another protocol
    assert variants.perplexity(bench, m, key, max_tokens=64) != p
    # other weights under the same label
    with torch.no_grad():
        m.model.layers[0].mlp.down_proj.weight[0, 0] += 1.0
    assert variants.perplexity(bench, m, key) != p
    assert len(variants.remembered_scores()) == 5


def test_variant_store_roundtrip_and_rebuild_of_a_bad_file(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    bench = make_bench(tiny_llama)
    m1, meta1, key = variants.variant(bench, "rtn", spec=QuantSpec(4, 32))
    m2, meta2, key2 = variants.variant(bench, "rtn", spec=QuantSpec(4, 32))
    assert key == key2 and meta2["cached"] is True
    for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), n
    path = tmp_path / "variants" / f"{key}.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])        # truncate it
    m3, meta3, _ = variants.variant(bench, "rtn", spec=QuantSpec(4, 32))
    assert meta3["cached"] is False and "unusable" in capsys.readouterr().out
    assert json.loads(path.with_suffix(".json").read_text())["file_bytes"] == path.stat().st_size


@pytest.mark.parametrize("impl", ["ours", "llmcompressor"])
def test_a_stored_awq_variant_comes_back_as_built(tiny_llama, tmp_path, monkeypatch, impl):
    """AWQ folds its scales into the norms before each scaled group: a variant loaded from the store is the
    model that was built, every tensor of it (the store once kept the linears only, and a loaded AWQ variant of
    ours scored a perplexity ~40× the built one's on the CI model). On this tiny random model llm-compressor's
    search keeps α = 0 (scales of 1), so its case checks only that the loaded model equals the built one;
    compared on the CPU, wherever ``oneshot`` left the built model's tensors."""
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    bench = make_bench(tiny_llama, real_text=False)
    built, meta, key = variants.variant(bench, "awq", impl, QuantSpec(4, 32), n_grid=4)
    before = tiny_llama.state_dict()
    after = {n: t.detach().cpu() for n, t in built.state_dict().items()}   # (llm-compressor adds scales and zeros)
    if impl == "ours":
        assert any("norm" in n and not torch.equal(after[n], t) for n, t in before.items()), "scales in the norms"
    loaded, meta2, key2 = variants.variant(bench, "awq", impl, QuantSpec(4, 32), n_grid=4)
    assert key2 == key and meta2["cached"] is True
    for n, t in loaded.state_dict().items():
        assert torch.equal(t.cpu(), after[n]), n


def test_corrupt_score_table_is_set_aside(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    (tmp_path / "scores.json").write_text("{not json")
    assert variants.remembered_scores() == {}
    assert "scores.json" in capsys.readouterr().out and (tmp_path / "scores.json.corrupt").exists()
    p = variants.perplexity(make_bench(tiny_llama))
    assert p > 1 and len(variants.remembered_scores()) == 1


def test_keys_carry_the_spec():
    k4 = variants.variant_key("m", "gptq", "ours", QuantSpec(4, 64), 10)
    k3 = variants.variant_key("m", "gptq", "ours", QuantSpec(3, 64), 10)
    kc = variants.variant_key("m", "gptq", "ours", QuantSpec(4, None), 10)
    assert len({k4, k3, kc}) == 3 and "w4g64" in k4 and "w4ch" in kc


def test_a_key_tells_text_calibration_from_random_ids(tiny_llama):
    """Same model cut to its first layers (as the CI profile does: no quality either way), same count of
    calibration tokens, one bench on text and one on random ids (no text source): two variants, never one
    reused for the other."""
    import dataclasses
    calib = torch.zeros(2, 32, dtype=torch.long)
    on_text, on_ids = (dataclasses.replace(make_bench(tiny_llama, real_text=t), cut_from=30) for t in (True, False))
    assert on_text.quality_meaningful == on_ids.quality_meaningful
    for method in ("gptq", "awq"):
        assert variants.bench_key(on_text, method, "ours", QuantSpec(4, 32), calib) != \
            variants.bench_key(on_ids, method, "ours", QuantSpec(4, 32), calib)


def test_our_awq_key_carries_the_search_dtype_given_or_chosen(tiny_llama, monkeypatch):
    """The α search's dtype changes our AWQ's weights and depends on the CPU when not given
    (awq.default_search_dtype): it is in the key, and giving the default explicitly is the same variant."""
    from helpers import awq
    bench, calib = make_bench(tiny_llama), torch.zeros(2, 32, dtype=torch.long)
    key = lambda **kw: variants.bench_key(bench, "awq", "ours", QuantSpec(4, 32), calib, **kw)   # noqa: E731
    monkeypatch.setattr(awq, "default_search_dtype", lambda w: torch.float32)
    fp32 = key()
    assert key(search_dtype=torch.float32) == fp32 and key(search_dtype=torch.bfloat16) != fp32
    monkeypatch.setattr(awq, "default_search_dtype", lambda w: torch.bfloat16)
    assert key() == key(search_dtype=torch.bfloat16) != fp32


def test_stored_meta_reads_the_facts_without_the_weights(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    bench = make_bench(tiny_llama)
    assert variants.stored_meta(bench, "rtn", spec=QuantSpec(4, 32)) is None
    _, meta, _ = variants.variant(bench, "rtn", spec=QuantSpec(4, 32))
    stored = variants.stored_meta(bench, "rtn", spec=QuantSpec(4, 32))
    assert stored["seconds"] == meta["seconds"] and variants.stored_meta(bench, "rtn", spec=QuantSpec(3, 32)) is None


def test_library_settings_become_its_options(tiny_llama, monkeypatch):
    """Settings for llm-compressor's bridge replace fields of its defaults (the library's GPTQ and AWQ),
    and the bridge receives them as the options dataclass."""
    from helpers import awq, gptq, llm_compressor

    seen = {}

    def bridge(model, calib, method, spec, options):
        seen[method] = options
        return {}
    monkeypatch.setattr(llm_compressor, "oneshot_quantize", bridge)
    calib = torch.zeros(2, 8, dtype=torch.long)
    variants.apply_quantizer(tiny_llama, calib, "awq", "llmcompressor", QuantSpec(4, 32), n_grid=4)
    variants.apply_quantizer(tiny_llama, calib, "gptq", "llmcompressor", QuantSpec(4, 32), percdamp=0.1)
    assert seen["awq"] == awq.AWQOptions(n_grid=4, duo_scaling=True, clip=False)
    assert seen["gptq"] == gptq.GPTQOptions(percdamp=0.1, actorder=True, static_groups=True)
