import pytest
import torch

from helpers import awq as A
from helpers import calib as C
from helpers import quant as Q
from helpers.models import decoder_layers
from helpers.qspec import QuantSpec


def search(blk, name, xs, kwargs, spec, n_grid=20, duo_scaling=False):
    """The readable path: the α grid scored by the paper's error, the inspected module run per α."""
    m = next(m for m in A.LLAMA.resolve(blk) if m.name == name)
    return A.search_scale(m, C.InputStats.of(xs).x_mean, A.OutputError(m, xs, kwargs, spec), spec, n_grid, duo_scaling)


def test_scale_folding_keeps_outputs(tiny_llama, tiny_calib):
    with torch.no_grad():
        ref = tiny_llama(tiny_calib).logits
    g = torch.Generator().manual_seed(0)
    for blk in decoder_layers(tiny_llama):
        for m in A.LLAMA.resolve(blk):
            A.apply_scale(m.smooth, m.balance, torch.rand(m.balance[0].in_features, generator=g) * 3 + 0.2)
    with torch.no_grad():
        out = tiny_llama(tiny_calib).logits
    assert torch.allclose(out, ref, atol=1e-4)


def test_gqa_has_no_v_to_o_mapping_but_mha_does(tiny_llama, tiny_llama_factory):
    assert [m.name for m in A.LLAMA.resolve(decoder_layers(tiny_llama)[0])] == ["qkv", "gate_up", "down"]
    mha = tiny_llama_factory(kv_heads=4)
    maps = A.LLAMA.resolve(decoder_layers(mha)[0])
    assert [m.name for m in maps] == ["qkv", "o", "gate_up", "down"]
    blk = decoder_layers(mha)[0]
    assert maps[0].smooth is blk.input_layernorm and maps[0].inspect is blk.self_attn and not maps[0].inspects_linear
    assert maps[1].balance == (blk.self_attn.o_proj,) and maps[1].inspects_linear


def test_uniform_activations_give_alpha_zero(tiny_llama, tiny_calib):
    blk = decoder_layers(tiny_llama)[0]
    xs = [torch.ones(2, 8, 128) * torch.where(torch.rand(2, 8, 128) > 0.5, 1.0, -1.0)]  # |x| uniform
    r = search(blk, "down", xs, [{}], QuantSpec(4, 32))                                  # up_proj → down_proj
    assert r["alpha"] == 0.0 and torch.allclose(r["scales"], torch.ones(128))
    assert max(r["errors"]) - min(r["errors"]) < 1e-12


def test_search_prefers_scaling_salient_channels(tiny_llama):
    blk = decoder_layers(tiny_llama)[0]
    x = torch.randn(4, 16, 128)
    x[..., :4] *= 50                                           # four salient input channels
    r = search(blk, "down", [x], [{}], QuantSpec(3, 32))
    assert r["alpha"] > 0 and r["errors"][0] > min(r["errors"])


def test_clip_never_increases_error():
    torch.manual_seed(0)
    w, x = torch.randn(32, 64), torch.randn(300, 64)
    w[:, 5] *= 8                                               # an outlier column: clipping can help
    mx = A.search_clip(w, x, QuantSpec(3, 32))
    lin = torch.nn.Linear(64, 32, bias=False); lin.weight.data.copy_(w)
    A.apply_clip(lin, mx, QuantSpec(3, 32))
    err = lambda q: ((x @ q.t()) - (x @ w.t())).pow(2).mean().item()
    assert err(Q.rtn(lin.weight.data, QuantSpec(3, 32))) <= err(Q.rtn(w, QuantSpec(3, 32))) + 1e-9
    assert (mx <= w.reshape(32, 2, 32).abs().amax(-1, keepdim=True) + 1e-7).all()


def test_salient_selection_and_errors():
    stats, w = torch.arange(100.0), torch.randn(4, 100)
    assert set(A.salient_channels(stats, w, 0.02).tolist()) == {98, 99}
    assert len(A.salient_channels(stats, w, 0.02, by="random")) == 2
    with pytest.raises(ValueError, match="by must be"):
        A.salient_channels(stats, w, by="size")


def test_two_block_model_end_to_end(tiny_llama, tiny_calib):
    x = tiny_calib[:2]
    with torch.no_grad():
        ref = tiny_llama(x).logits
    info = A.awq_model(tiny_llama, tiny_calib, bits=4, group_size=32, options=A.AWQOptions(n_grid=5),
                       calibration=C.CalibSpec(batch_size=2), progress=False)
    assert set(info["alphas"]) == {"model.layers.0", "model.layers.1"}
    for blk in decoder_layers(tiny_llama):
        for lin in C.linears(blk).values():
            assert all(len(torch.unique(r)) <= 16 for r in lin.weight.data.reshape(-1, 32))
    with torch.no_grad():
        out = tiny_llama(x).logits
    assert (out - ref).abs().max() < 0.5 * ref.abs().max()


def test_activation_stats_shapes(tiny_llama, tiny_calib):
    s = A.activation_stats(tiny_llama, tiny_calib, batch_size=2)
    assert s["model.layers.1.mlp.down_proj"].shape == (128,) and (s["model.layers.0.self_attn.q_proj"] > 0).all()


def test_capture_inputs(tiny_llama, tiny_calib):
    x = C.capture_inputs(tiny_llama, decoder_layers(tiny_llama)[1].mlp.down_proj, tiny_calib, batch_size=3)
    assert x.shape == (tiny_calib.numel(), 128)


def test_linear_inputs(tiny_llama, tiny_calib):
    hidden, kw = C.capture_block_inputs(tiny_llama, tiny_calib, batch_size=2)
    feats = C.linear_inputs(decoder_layers(tiny_llama)[0], hidden, kw)
    assert len(feats["mlp.down_proj"]) == 2 and feats["mlp.down_proj"][0].shape == (2, 32, 128)
    assert feats["self_attn.q_proj"][0] is feats["self_attn.k_proj"][0]   # one input, shared


@pytest.mark.parametrize("name", ["qkv", "gate_up"])
def test_bf16_search_scores_a_copy_and_ranks_like_fp32(tiny_llama, tiny_calib, name):
    """The search in bf16 (the speed layer) runs on a copy (the fp32 block is untouched) and its error
    curve follows the fp32 one closely enough to pick a neighbouring α."""
    blk = decoder_layers(tiny_llama)[0]
    hidden, kwargs = C.capture_block_inputs(tiny_llama, tiny_calib)
    feats = C.linear_inputs(blk, hidden, kwargs)
    m = next(m for m in A.LLAMA.resolve(blk) if m.name == name)
    st, spec = C.InputStats.of(feats[m.input]), QuantSpec(4, 32)
    before = {n: p.clone() for n, p in blk.state_dict().items()}
    r32 = A.search_scale(m, st.x_mean, A.scale_error(m, st, kwargs, spec, torch.float32), spec, n_grid=10)
    r16 = A.search_scale(m, st.x_mean, A.scale_error(m, st, kwargs, spec, torch.bfloat16), spec, n_grid=10)
    assert all(torch.equal(p, before[n]) for n, p in blk.state_dict().items())
    assert blk.mlp.up_proj.weight.dtype == torch.float32
    e32, e16 = torch.tensor(r32["errors"]), torch.tensor(r16["errors"])
    assert torch.allclose(e16, e32, rtol=0.1)
    assert abs(r16["alpha"] - r32["alpha"]) <= 0.2
    slow = search(blk, name, feats[m.input], kwargs, spec, n_grid=10)   # in the weights' dtype: the readable path
    assert r32["errors"] == slow["errors"] and torch.equal(r32["scales"], slow["scales"])


@pytest.mark.parametrize("kv_heads,name", [(2, "down"), (4, "o")])
def test_gram_error_is_the_output_error_of_one_linear(tiny_llama_factory, tiny_calib, kv_heads, name):
    """The speed layer's quadratic form tr(E·XᵀX·Eᵀ) equals the forward-pass error of the linear
    (the readable path) to rounding, α by α, so both pick the same α."""
    model = tiny_llama_factory(kv_heads=kv_heads)
    blk = decoder_layers(model)[0]
    hidden, kwargs = C.capture_block_inputs(model, tiny_calib)
    m = next(m for m in A.LLAMA.resolve(blk) if m.name == name)
    xs = C.linear_inputs(blk, hidden, kwargs)[m.input]
    spec = QuantSpec(3, 16)
    fast = A.search_scale(m, C.InputStats.of(xs).x_mean, A.scale_error(m, C.InputStats.of(xs, gram=True), kwargs, spec),
                          spec, n_grid=8, duo_scaling=True)
    slow = search(blk, name, xs, kwargs, spec, n_grid=8, duo_scaling=True)
    assert torch.allclose(torch.tensor(fast["errors"]), torch.tensor(slow["errors"]), rtol=1e-4)
    assert fast["alpha"] == slow["alpha"] and torch.equal(fast["scales"], slow["scales"])


def test_default_search_dtype(monkeypatch):
    assert A.default_search_dtype(torch.zeros(1, dtype=torch.bfloat16)) == torch.bfloat16
    monkeypatch.setattr(A, "cpu_has_bf16", lambda: False)
    assert A.default_search_dtype(torch.zeros(1)) == torch.float32
    monkeypatch.setattr(A, "cpu_has_bf16", lambda: True)
    assert A.default_search_dtype(torch.zeros(1)) == torch.bfloat16


def test_cast_floats_reaches_nested_tensors_only():
    kw = {"position_embeddings": (torch.ones(2), torch.zeros(2)), "position_ids": torch.arange(3),
          "attention_mask": None, "flag": True}
    out = C.cast_floats(kw, torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in out["position_embeddings"])
    assert out["position_ids"].dtype == torch.int64 and out["attention_mask"] is None and out["flag"] is True


@pytest.mark.parametrize("batch_size", [1, 3])
def test_input_stats_streamed_equal_the_concatenated_inputs(tiny_llama, tiny_calib, batch_size):
    """Batch by batch, InputStats gathers what the search and the clip read from all inputs at once:
    mean |x|, XᵀX and the clip search's every (N // 512)-th token."""
    blk = decoder_layers(tiny_llama)[0]
    hidden, kw = C.capture_block_inputs(tiny_llama, tiny_calib, batch_size=batch_size)
    feats = C.linear_inputs(blk, hidden, kw)
    stats = A.block_input_stats(blk, hidden, kw, A.LLAMA.resolve(blk))
    for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"):
        X = torch.cat([x.reshape(-1, x.shape[-1]) for x in feats[name]]).float()
        st = stats[name]
        assert st.seen == tiny_calib.numel()
        assert torch.allclose(st.x_mean, X.abs().mean(0), rtol=1e-5)
        assert torch.equal(st.tokens, X[:: max(1, len(X) // 512)][:512])
        if name == "mlp.down_proj":
            assert torch.allclose(st.G, X.t() @ X, rtol=1e-4, atol=1e-4)
    assert stats["self_attn.v_proj"] is stats["self_attn.q_proj"] and stats["mlp.up_proj"] is stats["mlp.gate_proj"]
    assert stats["mlp.down_proj"].xs == [] and len(stats["mlp.gate_proj"].xs) == len(hidden)


def test_input_stats_samples_like_the_clip_search_over_many_batches():
    """More tokens than the clip search reads: the sampled tokens are the concatenation's
    ``[::N // 512][:512]``, wherever the batch borders fall."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(b, 37, 8, generator=g) for b in (3, 5, 2, 7)]      # 629 tokens: stride 1, first 512
    st = C.InputStats.of(xs)
    X = torch.cat([x.reshape(-1, 8) for x in xs])
    assert torch.equal(st.tokens, X[::1][:512])
    xs = [torch.randn(9, 131, 8, generator=g) for _ in range(3)]         # 3537 tokens: stride 6
    assert torch.equal(C.InputStats.of(xs).tokens, torch.cat([x.reshape(-1, 8) for x in xs])[::6][:512])


def test_scale_error_names_what_a_mapping_needs(tiny_llama):
    maps = {m.name: m for m in A.LLAMA.resolve(decoder_layers(tiny_llama)[0])}
    spec = QuantSpec(4, 32)
    st = C.InputStats(10)
    st.add(torch.randn(10, 128))
    with pytest.raises(ValueError, match="gram=True"):
        A.scale_error(maps["down"], st, [{}], spec)
    st = C.InputStats(10)
    st.add(torch.randn(10, 64))
    with pytest.raises(ValueError, match="keep=True"):
        A.scale_error(maps["qkv"], st, [{}], spec)
    with pytest.raises(ValueError, match="no calibration inputs"):
        A.scale_error(maps["down"], C.InputStats(10, gram=True), [{}], spec)
    with pytest.raises(ValueError, match="total_tokens"):
        C.InputStats(0)


def test_families_and_their_errors(tiny_llama):
    assert A.family_of(tiny_llama) is A.LLAMA
    tiny_llama.config.model_type = "gpt2"
    with pytest.raises(ValueError, match=r"no mappings for model_type='gpt2'; known: \['llama'"):
        A.family_of(tiny_llama)
    other = A.AWQFamily((A.AWQMapping("x", "pre_feedforward_layernorm", ("mlp.gate_proj",), "mlp"),), ())
    with pytest.raises(ValueError, match="mapping 'x'.*lacks a module"):
        other.resolve(decoder_layers(tiny_llama)[0])
    with pytest.raises(ValueError, match="n_grid must be a positive"):
        A.AWQOptions(n_grid=0)
    with pytest.raises(TypeError, match="clip must be True or False"):
        A.AWQOptions(clip="no")
    with pytest.raises(TypeError, match="search_dtype must be a torch.dtype"):
        A.AWQOptions(search_dtype="bf16")
    with pytest.raises(TypeError, match="options must be an AWQOptions"):
        A.awq_model(tiny_llama, torch.zeros(1, 4, dtype=torch.long), QuantSpec(4, 32), {"n_grid": 4})


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_every_family_resolves_folds_and_quantizes(model_type, tiny_calib):
    """Each model type in FAMILIES: the mappings resolve on a tiny model of it, folding random scales
    keeps its outputs, and AWQ runs end to end."""
    import transformers
    cfg = transformers.AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                                            max_position_embeddings=256, head_dim=16)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        ref = model(tiny_calib).logits
    g = torch.Generator().manual_seed(0)
    for blk in decoder_layers(model):
        maps = A.family_of(model).resolve(blk)
        assert [m.name for m in maps] == ["qkv", "o", "gate_up", "down"]
        for m in maps:
            A.apply_scale(m.smooth, m.balance, torch.rand(m.balance[0].in_features, generator=g) + 0.5)
    with torch.no_grad():
        assert torch.allclose(model(tiny_calib).logits, ref, atol=1e-4)
    info = A.awq_model(model, tiny_calib, QuantSpec(4, 32), A.AWQOptions(n_grid=3), progress=False)
    assert set(info["alphas"]["model.layers.1"]) == {"qkv", "o", "gate_up", "down"}


def test_options_and_calibration_split_settings():
    opts, cal = C.options_and_calibration(A.AWQOptions, {"n_grid": 5, "next_inputs": "full_precision"})
    assert opts == A.AWQOptions(n_grid=5) and cal == C.CalibSpec(next_inputs="full_precision")
    with pytest.raises(TypeError, match=r"unknown settings \['ngrid'\]: AWQOptions takes"):
        C.options_and_calibration(A.AWQOptions, {"ngrid": 5})


def test_awq_block_holds_less_than_every_linear_input(tiny_llama_factory):
    """The statistics are gathered batch by batch: AWQ on a block whose MLP is wide holds less, at its
    peak, than the inputs of all its linears (what it held before), measured with the CPU allocation
    tracker."""
    from helpers import host_alloc
    model = tiny_llama_factory(intermediate=1024)
    calib = torch.randint(0, 128, (64, 128), generator=torch.Generator().manual_seed(2))
    blk = decoder_layers(model)[0]
    hidden, kw = C.capture_block_inputs(model, calib, batch_size=4)
    every = sum(x.numel() * x.element_size() for n, xs in C.linear_inputs(blk, hidden, kw).items()
                if n in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj") for x in xs)
    peak = host_alloc.peak_bytes(lambda: A.awq_block(blk, hidden, kw, QuantSpec(4, 32), A.AWQOptions(n_grid=4)),
                                 warmup=False, no_grad=False)["peak"]     # autograd left on, as a caller may
    assert peak < every, (peak, every)      # (thread-independent: host_alloc runs fn on one thread)


def test_the_clip_search_shrinks_on_the_options_grid(tiny_llama_factory, monkeypatch):
    """awq_block hands AWQOptions.n_grid to search_clip (one grid for α and the clip, as llm-awq's 20 and 20),
    and search_clip tries the shrinks 1 − i/n_grid for i < n_grid/2: at n_grid 4, 1 and 0.75 only."""
    model = tiny_llama_factory()
    calib = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(3))
    blk = decoder_layers(model)[0]
    hidden, kw = C.capture_block_inputs(model, calib, batch_size=2)
    grids, real = [], A.search_clip
    monkeypatch.setattr(A, "search_clip", lambda w, x, spec, n_grid=20, **k: grids.append(n_grid) or real(w, x, spec, n_grid, **k))
    A.awq_block(blk, hidden, kw, QuantSpec(4, 32), A.AWQOptions(n_grid=4))
    assert grids and set(grids) == {4}
    w, x = torch.randn(8, 64, generator=torch.Generator().manual_seed(4)), torch.randn(16, 64)
    org = w.abs().reshape(8, 2, 32).amax(-1, keepdim=True)
    ratio = (real(w, x, QuantSpec(3, 32), n_grid=4) / org).flatten()
    assert all(min(abs(r - 1.0), abs(r - 0.75)) < 1e-6 for r in ratio.tolist())
