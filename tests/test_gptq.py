import pytest
import torch

from helpers import gptq as G
from helpers import quant as Q
from helpers.models import decoder_layers


def correlated_inputs(n=512, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, 4, generator=g)
    return base @ torch.randn(4, d, generator=g) + 0.1 * torch.randn(n, d, generator=g)


def gptq_layer(W, X, **kw):
    lin = torch.nn.Linear(W.shape[1], W.shape[0], bias=False)
    lin.weight.data.copy_(W)
    g = G.GPTQ(lin)
    g.add_batch(X)
    info = g.quantize(**kw)
    return lin.weight.data.clone(), g, info


def obq_reference(W, H, bits, percdamp=0.01):
    """Straightforward OBQ-order update with the full inverse, one column at a time (no Cholesky,
    no lazy blocks), the same per-row grid from the original weights."""
    W, H = W.clone().double(), H.clone().double()
    H += percdamp * H.diag().mean() * torch.eye(len(H), dtype=H.dtype)
    Hinv = torch.linalg.inv(H)
    scale, zero = Q.compute_qparams(W.amin(1), W.amax(1), bits, False)
    scale, zero = scale.double(), zero.double()
    Qw = torch.zeros_like(W)
    for i in range(W.shape[1]):
        q = (Q.quantize_with(W[:, i], scale, zero, bits, False) - zero) * scale
        Qw[:, i] = q
        err = (W[:, i] - q) / Hinv[i, i]
        W[:, i:] -= err[:, None] * Hinv[i, i:][None, :]
        Hinv = Hinv - Hinv[:, i:i + 1] @ Hinv[i:i + 1, :] / Hinv[i, i]   # remove column i (OBS)
    return Qw.float()


def test_matches_obq_reference_on_a_tiny_matrix():
    torch.manual_seed(0)
    W, X = torch.randn(6, 16), correlated_inputs(256, 16)
    for blocksize in (16, 4, 3):
        Wq, g, _ = gptq_layer(W, X, bits=3, group_size=None, blocksize=blocksize)
        ref = obq_reference(W, 2 * X.t() @ X / len(X), 3)
        assert torch.allclose(Wq, ref, atol=1e-4), blocksize


def test_error_below_rtn_on_correlated_inputs():
    torch.manual_seed(1)
    W, X = torch.randn(64, 32), correlated_inputs()
    rtn = Q.fake_quantize(W, bits=3, group_size=16)
    Wq, _, _ = gptq_layer(W, X, bits=3, group_size=16)
    assert G.layer_error(W, Wq, X) < 0.5 * G.layer_error(W, rtn, X)


@pytest.mark.parametrize("static", [True, False])
def test_actorder_roundtrip_and_group_boundaries(static):
    """With H diagonal there is no error feedback: every variant must equal RTN exactly, which
    checks the act-order permutation is undone and that groups start at the right columns."""
    torch.manual_seed(2)
    W = torch.randn(8, 32)
    X = torch.randn(1000, 32) * torch.linspace(0.1, 3, 32)   # distinct diag(H) → a real permutation
    lin = torch.nn.Linear(32, 8, bias=False); lin.weight.data.copy_(W)
    g = G.GPTQ(lin); g.add_batch(X)
    g.H = torch.diag(torch.diag(g.H))                          # make H exactly diagonal
    g.quantize(bits=4, group_size=8, actorder=True, static_groups=static, percdamp=0.0)
    assert torch.allclose(lin.weight.data, Q.fake_quantize(W, bits=4, group_size=8), atol=1e-6)


def test_grid_respected_per_group():
    torch.manual_seed(3)
    W, X = torch.randn(16, 64), correlated_inputs(400, 64)
    Wq, _, _ = gptq_layer(W, X, bits=3, group_size=16)
    for grp in Wq.reshape(16, 4, 16).reshape(-1, 16):
        assert len(torch.unique(grp)) <= 8


def test_dead_columns_zeroed():
    W, X = torch.randn(4, 16), correlated_inputs(200, 16)
    X[:, 3] = 0
    Wq, _, info = gptq_layer(W, X, bits=4, group_size=None)
    assert info["dead_columns"] == 1


def test_bad_input():
    lin = torch.nn.Linear(48, 4)
    g = G.GPTQ(lin)
    with pytest.raises(RuntimeError, match="before add_batch"):
        g.quantize()
    g.add_batch(torch.randn(10, 48))
    with pytest.raises(ValueError, match="does not divide"):
        g.quantize(group_size=32)
    with pytest.raises(ValueError, match="unsupported bit width"):
        g.quantize(bits=5)


def test_two_block_model_end_to_end(tiny_llama, tiny_calib):
    x = tiny_calib[:2]
    with torch.no_grad():
        ref = tiny_llama(x).logits
    info = G.gptq_model(tiny_llama, tiny_calib, bits=4, group_size=32, batch_size=2, progress=False)
    assert len(info["losses"]) == 2 * 7 and info["calib_tokens"] == tiny_calib.numel()
    for blk in decoder_layers(tiny_llama):
        w = blk.mlp.down_proj.weight.data                       # [64, 128] in groups of 32
        assert all(len(torch.unique(r)) <= 16 for r in w.reshape(-1, 32))
    with torch.no_grad():
        out = tiny_llama(x).logits
    assert (out - ref).abs().max() < 0.5 * ref.abs().max()       # quantized, not broken


def test_graphs_need_cuda_and_static_groups():
    lin = torch.nn.Linear(32, 8, bias=False)
    q = G.GPTQ(lin)
    q.add_batch(torch.randn(64, 32))
    with pytest.raises(ValueError, match="graphs=True"):
        q.quantize(bits=4, group_size=16, static_groups=False, graphs=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("bits,symmetric", [(4, False), (3, True)])
def test_cuda_graph_replay_equals_eager_loop(bits, symmetric):
    """The graphed column loop launches the same kernels as the eager one: identical weights,
    also for a last block narrower than blocksize and for several layers sharing one graph."""
    torch.manual_seed(0)
    X = (torch.randn(1024, 192) @ torch.randn(192, 192)).cuda()
    W0 = torch.randn(3, 96, 192).cuda()
    for k in range(3):
        outs = []
        for graphs in (False, True):
            lin = torch.nn.Linear(192, 96, bias=False).cuda()
            lin.weight.data.copy_(W0[k])
            q = G.GPTQ(lin)
            q.add_batch(X)
            q.quantize(bits=bits, group_size=64, symmetric=symmetric, blocksize=128, actorder=True,
                       static_groups=True, graphs=graphs)
            outs.append(lin.weight.data.clone())
        assert torch.equal(outs[0], outs[1])
    G.free_graphs()
