import pytest
import torch

from helpers import quant as Q


def test_known_values_asymmetric():
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    q = Q.quantize_tensor(x, bits=2, symmetric=False, granularity="channel")
    assert q.scale.item() == pytest.approx(1.0) and q.zero.item() == 0
    assert q.codes.tolist() == [[0, 1, 2, 3]] and torch.equal(q.dequantize(), x)


def test_known_values_symmetric():
    x = torch.tensor([[-1.0, -0.6, 0.3, 1.0]])
    q = Q.quantize_tensor(x, bits=4, symmetric=True, granularity="tensor")
    assert q.scale.item() == pytest.approx(1 / 7)
    assert q.codes.tolist() == [[-7, -4, 2, 7]]   # −4.2 → −4, 2.1 → 2


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("gran,g", [("tensor", None), ("channel", None), ("group", 32)])
def test_roundtrip_error_within_half_scale(bits, sym, gran, g):
    torch.manual_seed(bits)
    x = torch.randn(16, 128)
    q = Q.quantize_tensor(x, bits=bits, symmetric=sym, granularity=gran, group_size=g)
    err = (q.dequantize() - x).abs().reshape(q.scale.shape[0], q.scale.shape[1], -1)
    assert (err <= q.scale[..., None] / 2 + 1e-6).all()


def test_group_size_errors():
    with pytest.raises(ValueError, match=r"allowed group sizes: \[16, 32, 64\]"):
        Q.quantize_tensor(torch.randn(4, 576), group_size=128)
    with pytest.raises(ValueError, match="unsupported bit width"):
        Q.quantize_tensor(torch.randn(4, 64), bits=5)
    with pytest.raises(ValueError, match="unknown granularity"):
        Q.quantize_tensor(torch.randn(4, 64), granularity="row")
    with pytest.raises(TypeError, match="floating"):
        Q.quantize_tensor(torch.ones(4, 64, dtype=torch.int32))


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_packing_roundtrip_and_bytes(bits):
    codes = torch.randint(0, 2 ** bits, (1001,))
    packed = Q.pack_codes(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.numel() == (1001 * bits + 7) // 8 + (0 if bits != 3 else (3 - ((1001 * 3 + 7) // 8) % 3) % 3)
    assert torch.equal(Q.unpack_codes(packed, bits, 1001), codes)
    with pytest.raises(ValueError, match="must lie in"):
        Q.pack_codes(torch.tensor([2 ** bits]), bits)


def test_nibbles_are_pack_codes_row_by_row_and_refuse_what_does_not_fit():
    codes = torch.randint(0, 16, (6, 64), generator=torch.Generator().manual_seed(0))
    packed = Q.pack_nibbles(codes)
    assert packed.shape == (6, 32) and packed.dtype == torch.uint8
    assert torch.equal(packed.flatten(), Q.pack_codes(codes, 4))
    assert torch.equal(Q.unpack_nibbles(packed).long(), codes)
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        Q.pack_nibbles(torch.tensor([3, 16]))
    with pytest.raises(ValueError, match="even"):
        Q.pack_nibbles(torch.zeros(3, 5, dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8"):
        Q.unpack_nibbles(torch.zeros(4, dtype=torch.int32))


def test_storage_bytes_matches_formula():
    q = Q.quantize_tensor(torch.randn(64, 512), bits=4, symmetric=False, group_size=64)
    b = Q.storage_bytes(q)
    assert b["codes"] == 64 * 512 // 2 and b["scales"] == 64 * 8 * 2 and b["zeros"] == 64 * 8 // 2
    assert b["bits_per_weight"] == pytest.approx(Q.bits_per_weight(4, 64, symmetric=False))
    assert Q.bits_per_weight(4, 128, symmetric=True) == pytest.approx(4.125)


def test_all_positive_group_keeps_zero_code_valid():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    q = Q.quantize_tensor(x, bits=2, granularity="channel")
    assert q.zero.item() == 0 and (q.dequantize() - x).abs().max() <= q.scale.item() / 2 + 1e-6


def test_float_zero_reproduces_grid_exactly():
    # a Q4_1-style tensor: each group is min + d·k for integer k in [0, 15], both ends present
    torch.manual_seed(0)
    mins, d = torch.randn(8, 4, 1) * 0.1, torch.rand(8, 4, 1) * 0.01 + 0.001
    k = torch.randint(0, 16, (8, 4, 32)).float(); k[..., 0], k[..., 1] = 0, 15
    x = (mins + d * k).reshape(8, 128)
    exact = Q.quantize_tensor(x, bits=4, group_size=32, integer_zero=False).dequantize()
    assert torch.allclose(exact, x, atol=1e-6)
    rounded = Q.quantize_tensor(x, bits=4, group_size=32).dequantize()
    assert (rounded - x).abs().max() > 1e-4   # an integer zero point shifts the grid


def test_fp8_ranges_and_cast():
    assert Q.fp8_range("e4m3fn")["max"] == 448.0 and Q.fp8_range("e5m2")["max"] == 57344.0
    if "e4m3fnuz" in Q.FP8_FORMATS:
        assert Q.fp8_range("e4m3fnuz")["max"] == 240.0
    x = torch.randn(32, 64) * 10
    q, s = Q.to_fp8(x, "e4m3fn")
    assert (Q.from_fp8(q, s) - x).abs().max() <= x.abs().max() * 2 ** -4
    with pytest.raises(ValueError, match="unknown FP8"):
        Q.to_fp8(x, "e3m4")


def test_rtn_model_changes_only_decoder_linears():
    from transformers import LlamaConfig

    from helpers.models import model_from_config
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    m = model_from_config(cfg, dtype=torch.float32)
    emb = m.model.embed_tokens.weight.clone()
    changed = Q.rtn_model(m, bits=4, group_size=32)
    assert len(changed) == 2 * 7 and torch.equal(emb, m.model.embed_tokens.weight)
    w = m.model.layers[0].mlp.down_proj.weight
    assert torch.allclose(Q.fake_quantize(w, bits=4, group_size=32), w, atol=1e-6)  # idempotent on its grid


def test_smoothquant_keeps_product_and_helps_outliers():
    torch.manual_seed(0)
    x, W = torch.randn(256, 64), torch.randn(32, 64) * 0.1
    x[:, 3] *= 60                                             # one outlier channel
    s = Q.smoothquant_scales(x.abs().amax(0), W.abs().amax(0), 0.5)
    assert torch.allclose((x / s) @ (W * s).t(), x @ W.t(), atol=1e-3)
    assert Q.w8a8_error(x, W, s) < 0.5 * Q.w8a8_error(x, W)
    with pytest.raises(ValueError, match="alpha"):
        Q.smoothquant_scales(x.abs().amax(0), W.abs().amax(0), 1.5)


def test_int8_activation_quant_bounds():
    x = torch.tensor([[1.0, -0.5, 0.25], [100.0, 1.0, -2.0]])
    per_tok = Q.quantize_activations_int8(x, per_token=True)
    assert (per_tok - x).abs().max(1).values.tolist() <= (x.abs().amax(1) / 254 + 1e-6).tolist()
    assert torch.equal(Q.quantize_activations_int8(torch.zeros(2, 3)), torch.zeros(2, 3))


def test_quantized_model_bytes_matches_storage_bytes(tiny_llama):
    r = Q.quantized_model_bytes(tiny_llama, 4, 32)
    measured = sum(Q.storage_bytes(Q.quantize_tensor(m.weight.data, bits=4, group_size=32))["total"]
                   for m in Q.quantizable_linears(tiny_llama).values())
    assert r["linears"] == measured
    full = Q.quantized_model_bytes(tiny_llama, None)
    assert full["total"] == 2 * sum(p.numel() for p in tiny_llama.parameters())
    with pytest.raises(ValueError, match="allowed"):
        Q.quantized_model_bytes(tiny_llama, 4, 48)
