"""The Triton W4A16 kernel against the readable reference (Triton's interpreter on CPU, compiled on CUDA)."""
import pytest
import torch

from helpers import quant, w4_kernel

pytestmark = pytest.mark.skipif(w4_kernel.triton is None, reason="triton is not installed")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def weight(n=48, k=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g)


def test_pack_rows_is_notebook_03s_packing():
    p = w4_kernel.pack_w4(weight(), 64)
    codes = w4_kernel.unpack_w4(p)
    assert torch.equal(w4_kernel.pack_rows(codes).flatten(), quant.pack_codes(codes, 4))
    q = quant.quantize_tensor(weight(), bits=4, symmetric=False, granularity="group", group_size=64)
    assert torch.equal(codes.long(), q.codes.long())
    assert torch.allclose(w4_kernel.dequantize_w4(p, torch.float32), q.dequantize(), atol=1e-2, rtol=1e-3)


def test_bytes_are_half_a_byte_plus_group_params():
    p = w4_kernel.pack_w4(weight(64, 1024), 128)
    assert p.nbytes == 64 * 1024 // 2 + 2 * (64 * 1024 // 128) * 2


@pytest.mark.parametrize("cfg", [dict(BLOCK_N=16, BLOCK_K=128, SPLIT_K=1, MAGIC=False),
                                 dict(BLOCK_N=32, BLOCK_K=256, SPLIT_K=2, MAGIC=True)])
def test_gemv_matches_reference(cfg):
    p = w4_kernel.pack_w4(weight(48, 512).to(DEV), 128)
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(1)).to(DEV)
    got = w4_kernel.w4a16_matmul(x, p, cfg, out_dtype=torch.float32)
    ref = w4_kernel.reference_matmul(x, p)
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("m", [3, 16, 20])
def test_tensor_core_path_matches_reference(m):
    p = w4_kernel.pack_w4(weight(40, 512).to(DEV), 128)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m)).to(torch.float16).to(DEV)
    got = w4_kernel.w4a16_matmul(x, p, dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=2), out_dtype=torch.float32)
    ref = w4_kernel.reference_matmul(x.float(), p)
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_w4linear_swaps_and_matches():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to(DEV)
    x = torch.randn(1, 256, device=DEV)
    assert w4_kernel.swap_linears(net, 32 if DEV == "cpu" else 128, skip=("2",)) == 1
    assert isinstance(net[0], w4_kernel.W4Linear) and isinstance(net[2], torch.nn.Linear)
    ref = net[2](torch.relu(w4_kernel.reference_matmul(x, net[0].p) + net[0].bias))
    assert torch.allclose(net(x), ref, atol=1e-4)
    assert "0.words" in net.state_dict()  # packed bytes are saved with the module


def test_candidate_configs_all_valid():
    p = w4_kernel.pack_w4(weight(64, 1024), 128)
    for m in (1, 16, 64):
        cfgs = w4_kernel.candidate_configs(p, m)
        assert cfgs and all(w4_kernel._check_config(c, p, m) for c in cfgs)


@pytest.mark.parametrize("bad, match", [
    (dict(BLOCK_K=100), "multiple of group_size"),
    (dict(SPLIT_K=3), "multiple of"),
    (dict(BLOCK_Q=4), "unknown keys"),
])
def test_bad_config_is_refused(bad, match):
    p = w4_kernel.pack_w4(weight(16, 512).to(DEV), 128)
    with pytest.raises(ValueError, match=match):
        w4_kernel.w4a16_matmul(torch.randn(1, 512, device=DEV), p, {**w4_kernel.DEFAULT_CONFIG, **bad})


def test_bad_input():
    with pytest.raises(ValueError, match="2-D weight"):
        w4_kernel.pack_w4(torch.randn(8))
    with pytest.raises(ValueError, match="multiple of 8 and of group_size"):
        w4_kernel.pack_w4(torch.randn(8, 100), 64)
    with pytest.raises(ValueError, match="non-finite"):
        w4_kernel.pack_w4(torch.full((4, 128), float("nan")), 64)
    p = w4_kernel.pack_w4(weight(16, 256), 64)
    with pytest.raises(ValueError, match=r"x must be \[M, K=256\]"):
        w4_kernel.w4a16_matmul(torch.randn(2, 128), p)


def test_w4linear_large_batches_take_the_dense_path():
    lin = torch.nn.Linear(256, 16, bias=False)
    w4 = w4_kernel.W4Linear(lin, 64, dense_above=4)
    x = torch.randn(8, 256)
    assert torch.allclose(w4(x), w4_kernel.reference_matmul(x, w4.p), atol=1e-4)
