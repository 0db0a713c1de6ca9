"""GPTQ's column loop as one Triton kernel against the eager loop it replaces (Triton's interpreter on
a CPU, compiled on CUDA): the same weights bit for bit, and clear refusals."""
import pytest
import torch

from helpers import gptq as G
from helpers import gptq_kernel as K
from helpers.qspec import QuantSpec

pytest.importorskip("triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def hinv_of(cols, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(4 * cols, cols, generator=g) @ torch.randn(cols, cols, generator=g)
    H = X.t() @ X / len(X) + 0.01 * torch.eye(cols)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True).to(DEV)


@pytest.mark.parametrize("rows,cols,bits,symmetric", [(37, 128, 4, False), (20, 64, 3, True), (33, 100, 4, False),
                                                      (16, 1, 2, False)])
def test_block_kernel_equals_static_block(rows, cols, bits, symmetric):
    """Rows not a multiple of the tile, a block narrower than a power of two, one column."""
    torch.manual_seed(rows)
    W, Hinv = torch.randn(rows, cols, device=DEV), hinv_of(cols, cols)
    spec = QuantSpec(bits, 32, symmetric)
    S, Z = G.find_params(W, spec)
    S1, Z1 = S[:, None].expand(rows, cols).contiguous(), Z[:, None].expand(rows, cols).contiguous()
    Wa, Wb = W.clone(), W.clone()
    Qa, Ea = G.static_block(Wa, Hinv, S1, Z1, spec)
    Qb, Eb = K.quantize_block_static(Wb, Hinv, S1, Z1, bits, symmetric)
    assert torch.equal(Qa, Qb) and torch.equal(Ea, Eb) and torch.equal(Wa, Wb)


def test_block_kernel_updates_a_view_of_the_whole_weight_in_place():
    """``W[:, i1:i2]`` (row stride = all columns): only those columns change, as the eager view's."""
    W, Hinv = torch.randn(24, 96, device=DEV), hinv_of(32, 1)
    spec = QuantSpec(4, 32)
    S, Z = G.find_params(W[:, 32:64], spec)
    S1, Z1 = S[:, None].expand(24, 32).contiguous(), Z[:, None].expand(24, 32).contiguous()
    Wa, Wb = W.clone(), W.clone()
    G.static_block(Wa[:, 32:64], Hinv, S1, Z1, spec)
    K.quantize_block_static(Wb[:, 32:64], Hinv, S1, Z1, 4, False)
    assert torch.equal(Wa, Wb) and torch.equal(Wb[:, :32], W[:, :32]) and torch.equal(Wb[:, 64:], W[:, 64:])


def test_the_rounding_is_rint_ties_to_even():
    """Codes exactly halfway between two grid points round to the even one, as torch.round does
    (the kernel's ``(x + 1.5·2²³) − 1.5·2²³``); Hinv = I, so each column is quantized as it is."""
    x = torch.tensor([[0.5, 1.5, 2.5, 3.5, -0.5, 14.5, 15.5, 7.49999]], device=DEV)
    ones, zeros = torch.ones_like(x), torch.zeros_like(x)
    Q, _ = K.quantize_block_static(x.clone(), torch.eye(8, device=DEV), ones, zeros, 4, False)
    assert Q.tolist() == [[0.0, 2.0, 2.0, 4.0, 0.0, 14.0, 15.0, 7.0]]


def test_block_kernel_refuses_bad_input():
    W, H = torch.randn(8, 16, device=DEV), torch.eye(16, device=DEV)
    S, Z = torch.ones(8, 16, device=DEV), torch.zeros(8, 16, device=DEV)
    with pytest.raises(ValueError, match=r"Hinv1 must be float32 \(16, 16\)"):
        K.quantize_block_static(W, H[:8], S, Z, 4, False)
    with pytest.raises(ValueError, match=r"S1 must be float32 \(8, 16\)"):
        K.quantize_block_static(W, H, S.double(), Z, 4, False)
    with pytest.raises(ValueError, match="W1 must be float32 with contiguous rows"):
        K.quantize_block_static(W.t().contiguous().t(), H, S, Z, 4, False)
    with pytest.raises(ValueError, match="bits"):
        K.quantize_block_static(W, H, S, Z, 0, False)
