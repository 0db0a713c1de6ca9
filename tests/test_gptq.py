import pytest
import torch

from helpers import gptq as G
from helpers import quant as Q
from helpers.calib import CalibSpec
from helpers.models import decoder_layers
from helpers.qspec import QuantSpec


def correlated_inputs(n=512, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, 4, generator=g)
    return base @ torch.randn(4, d, generator=g) + 0.1 * torch.randn(n, d, generator=g)


def gptq_layer(W, X, **kw):
    """GPTQ on one layer through the reference's interface; returns (quantized weight, H, info)."""
    lin = torch.nn.Linear(W.shape[1], W.shape[0], bias=False)
    lin.weight.data.copy_(W)
    g = G.GPTQ(lin)
    g.add_batch(X)
    H = g.H.clone()
    spec = QuantSpec(kw.pop("bits", 4), kw.pop("group_size", 64), kw.pop("symmetric", False))
    info = g.fasterquant(spec, **kw)
    return lin.weight.data.clone(), H, info


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
    g.fasterquant(QuantSpec(4, 8), actorder=True, static_groups=static, percdamp=0.0)
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
    assert torch.equal(Wq[:, 3], torch.zeros(4))            # a dead input's weights are set to 0
    assert (Wq[:, [0, 1, 2, 4]] != 0).any()


def test_bad_input():
    lin = torch.nn.Linear(48, 4)
    g = G.GPTQ(lin)
    with pytest.raises(RuntimeError, match="before add_batch"):
        g.fasterquant(QuantSpec())
    g.add_batch(torch.randn(10, 48))
    with pytest.raises(ValueError, match="does not divide"):
        g.fasterquant(QuantSpec(4, 32))
    with pytest.raises(ValueError, match="unsupported bit width"):
        g.fasterquant(QuantSpec(5, 16))


def test_two_block_model_end_to_end(tiny_llama, tiny_calib):
    x = tiny_calib[:2]
    with torch.no_grad():
        ref = tiny_llama(x).logits
    info = G.gptq_model(tiny_llama, tiny_calib, bits=4, group_size=32, calibration=CalibSpec(batch_size=2),
                        progress=False)
    assert len(info["losses"]) == 2 * 7 and info["calib_tokens"] == tiny_calib.numel()
    for blk in decoder_layers(tiny_llama):
        w = blk.mlp.down_proj.weight.data                       # [64, 128] in groups of 32
        assert all(len(torch.unique(r)) <= 16 for r in w.reshape(-1, 32))
    with torch.no_grad():
        out = tiny_llama(x).logits
    assert (out - ref).abs().max() < 0.5 * ref.abs().max()       # quantized, not broken


def test_graphs_need_cuda_and_static_groups(tiny_llama, tiny_calib):
    W, H = torch.randn(8, 32), 2 * torch.eye(32)
    spec = QuantSpec(4, 16)
    with pytest.raises(ValueError, match="static grids only"):
        G.quantize_weight(W, H.clone(), spec, G.GPTQOptions(), block=G.BlockGraphs(spec))
    with pytest.raises(ValueError, match="CUDA tensor"):
        G.quantize_weight(W, H.clone(), spec, G.GPTQOptions(static_groups=True), block=G.BlockGraphs(spec))
    with pytest.raises(ValueError, match="recorded for w4g16 was called for w3g16"):
        G.quantize_weight(W, H.clone(), QuantSpec(3, 16), G.GPTQOptions(static_groups=True), block=G.BlockGraphs(spec))
    with pytest.raises(ValueError, match="inner must be None, one of"):
        G.gptq_model(tiny_llama, tiny_calib, spec, inner="on", progress=False)
    for inner in ("graphs", "kernel"):
        with pytest.raises(ValueError, match=f"inner='{inner}' needs a CUDA model"):
            G.gptq_model(tiny_llama.cpu(), tiny_calib, spec, G.GPTQOptions(static_groups=inner == "graphs"),
                         inner=inner, progress=False)


class PlainCalls:
    """A stand-in for GraphedCalls that calls the function eagerly: the adapter around it runs on a CPU."""

    def __init__(self, fn, mutated=(), share_pool=True):
        self.fn = fn

    def __call__(self, *tensors):
        return self.fn(*tensors)


@pytest.mark.parametrize("actorder", [False, True])
def test_block_graphs_adapter_equals_the_eager_loop(actorder):
    """What BlockGraphs hands to the graph — the block's columns, its Hinv block, its columns' grids
    gathered — run through static_block gives the eager loop's weights and losses bit for bit (on a
    CPU, the graph replaced by a plain call; the graph itself: the CUDA test below)."""
    torch.manual_seed(5)
    W, X = torch.randn(24, 192), correlated_inputs(500, 192)
    H = 2 * X.t() @ X / len(X)
    spec, options = QuantSpec(4, 32), G.GPTQOptions(blocksize=128, actorder=actorder, static_groups=True)
    eager = G.quantize_weight(W, H.clone(), spec, options)
    adapted = G.quantize_weight(W, H.clone(), spec, options, block=G.BlockGraphs(spec, graphed=PlainCalls))
    assert torch.equal(eager.Q, adapted.Q) and torch.equal(eager.losses, adapted.losses)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("bits,symmetric", [(4, False), (3, True)])
def test_cuda_graph_replay_equals_eager_loop(bits, symmetric):
    """The graphed column loop launches the same kernels as the eager one: identical weights and
    losses, also for a last block narrower than blocksize and for several layers sharing one graph."""
    torch.manual_seed(0)
    X = (torch.randn(1024, 192) @ torch.randn(192, 192)).cuda()
    H = 2 * X.t() @ X / len(X)
    W0 = torch.randn(3, 96, 192).cuda()
    spec, options = QuantSpec(bits, 64, symmetric), G.GPTQOptions(blocksize=128, actorder=True, static_groups=True)
    with G.BlockGraphs(spec) as replay:
        for k in range(3):
            eager = G.quantize_weight(W0[k], H.clone(), spec, options)
            graphed = G.quantize_weight(W0[k], H.clone(), spec, options, block=replay)
            assert torch.equal(eager.Q, graphed.Q) and torch.equal(eager.losses, graphed.losses)
        assert replay.n_graphs == 2                          # one per block shape (128 and 64 columns)
    assert replay.n_graphs == 0                              # freed when the with block ends


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_gptq_model_inner_loops_give_the_same_weights(tiny_llama_factory):
    """The whole model on the GPU: the column loop as the Triton kernel (the default with static
    groups), as CUDA graphs and eager — the same weights, bit for bit, in fp32 and in bf16 (where
    add_batch forms xᵀx on tensor cores)."""
    calib = torch.randint(0, 128, (8, 64), generator=torch.Generator().manual_seed(3))
    for dtype in (torch.float32, torch.bfloat16):
        out = []
        for inner in (None, "graphs", "eager"):
            m = tiny_llama_factory().to("cuda", dtype)
            G.gptq_model(m, calib, QuantSpec(4, 32), G.GPTQOptions(actorder=True, static_groups=True), inner=inner,
                         progress=False)
            out.append({n: p.detach().cpu() for n, p in m.state_dict().items()})
        for other in out[1:]:
            assert all(torch.equal(out[0][n], p) for n, p in other.items())


def test_kernel_block_equals_the_eager_loop():
    """KernelBlock in quantize_weight (Triton's interpreter on a CPU, compiled on CUDA): the eager
    loop's weights and losses bit for bit, with act-order, a last block narrower than blocksize, 3
    and 4 bits; and it refuses dynamic grids and another spec."""
    pytest.importorskip("triton")
    torch.manual_seed(6)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    X = correlated_inputs(400, 160).to(dev)
    H = 2 * X.t() @ X / len(X)
    for bits, symmetric in ((4, False), (3, True)):
        W = torch.randn(40, 160, device=dev)
        spec = QuantSpec(bits, 32, symmetric)
        options = G.GPTQOptions(blocksize=128, actorder=True, static_groups=True)
        eager = G.quantize_weight(W, H.clone(), spec, options)
        kernel = G.quantize_weight(W, H.clone(), spec, options, block=G.KernelBlock(spec))
        assert torch.equal(eager.Q, kernel.Q) and torch.equal(eager.losses, kernel.losses)
    with pytest.raises(ValueError, match="static grids only"):
        G.quantize_weight(W, H.clone(), spec, G.GPTQOptions(), block=G.KernelBlock(spec))
    with pytest.raises(ValueError, match="made for w3g32s was called for w4g32"):
        G.quantize_weight(W, H.clone(), QuantSpec(4, 32), options, block=G.KernelBlock(spec))


def reference_fasterquant(W, H, spec, blocksize=128, percdamp=0.01, actorder=False, static_groups=False):
    """IST-DASLab ``gptq.py``'s ``GPTQ.fasterquant``, transcribed line for line (with the course's
    quantizer, ``find_params`` and ``quantize_with``): ``W1`` is a copy, so a dynamic group's grid
    ``find_params(W[:, i1+i : i1+i+groupsize])`` reads the block's columns without the updates of
    the block's earlier columns. Returns ``(Q, Losses)`` (Losses per row)."""
    W, H = W.clone().float(), H.clone()
    columns, groupsize = W.shape[1], spec.group_for(W.shape[1])
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    if static_groups:
        groups = [G.find_params(W[:, i:i + groupsize], spec) for i in range(0, columns, groupsize)]
    if actorder:
        perm = torch.argsort(torch.diag(H), descending=True)
        W = W[:, perm]
        H = H[perm][:, perm]
        invperm = torch.argsort(perm)
    Losses = torch.zeros_like(W)
    Qw = torch.zeros_like(W)
    damp = percdamp * torch.mean(torch.diag(H))
    diag = torch.arange(columns)
    H[diag, diag] += damp
    H = torch.linalg.cholesky(H)
    H = torch.cholesky_inverse(H)
    Hinv = torch.linalg.cholesky(H, upper=True)
    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        count = i2 - i1
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Losses1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(count):
            w = W1[:, i]
            d = Hinv1[i, i]
            if not static_groups:
                if (i1 + i) % groupsize == 0:
                    scale, zero = G.find_params(W[:, (i1 + i):(i1 + i + groupsize)], spec)
            else:
                idx = i1 + i
                if actorder:
                    idx = perm[idx]
                scale, zero = groups[idx // groupsize]
            q = (Q.quantize_with(w, scale, zero, spec.bits, spec.symmetric) - zero) * scale
            Q1[:, i] = q
            Losses1[:, i] = (w - q) ** 2 / d ** 2
            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err1
        Qw[:, i1:i2] = Q1
        Losses[:, i1:i2] = Losses1 / 2
        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
    if actorder:
        Qw = Qw[:, invperm]
    return Qw, Losses.sum(1)


@pytest.mark.parametrize("bits,symmetric", [(4, False), (3, True), (8, False)])
@pytest.mark.parametrize("group_size,blocksize,actorder,static", [
    (32, 128, True, True), (32, 128, False, True), (16, 40, True, True),      # static groups, ± act-order
    (128, 128, False, False), (128, 64, True, False), (None, 128, True, False),  # dynamic, groups start blocks
])
def test_bit_identical_to_the_reference_fasterquant(bits, symmetric, group_size, blocksize, actorder, static):
    """Wherever the two define the same grids — static groups, or dynamic groups that each start a
    block — ours is IST-DASLab's ``fasterquant`` bit for bit (a dead input included), and its loss
    is the reference's to rounding (``err²`` against ``(w − q)²/d²``)."""
    torch.manual_seed(6)
    W, X = torch.randn(20, 256), correlated_inputs(700, 256)
    X[:, 9] = 0
    H = 2 * X.t() @ X / len(X)
    spec = QuantSpec(bits, group_size, symmetric)
    ours = G.quantize_weight(W, H.clone(), spec, G.GPTQOptions(blocksize, 0.01, actorder, static))
    ref_Q, ref_losses = reference_fasterquant(W, H, spec, blocksize, 0.01, actorder, static)
    assert torch.equal(ours.Q, ref_Q)
    assert torch.allclose(ours.losses, ref_losses, rtol=1e-5) and ours.dead_columns == 1


@pytest.mark.parametrize("group_size,same", [(128, True), (64, False)])
def test_dynamic_group_params_vs_reference(group_size, same):
    """Block 128: with g128 every group starts a block and ours equals the reference exactly; with
    g64 the second group of each block takes its grid from the in-block-updated weights (ours) or
    from W (the reference), so the results differ (the module docstring says which is which)."""
    torch.manual_seed(4)
    W, X = torch.randn(32, 256), correlated_inputs(600, 256)
    spec = QuantSpec(4, group_size)
    Wq, H, _ = gptq_layer(W, X, bits=4, group_size=group_size, blocksize=128)
    ref, _ = reference_fasterquant(W, H, spec, 128)
    assert torch.equal(Wq, ref) is same
    first = Wq[:, :group_size]                         # the first group of the first block: identical
    assert torch.equal(first, ref[:, :group_size])


def test_consuming_H_saves_copies_at_the_peak():
    """quantize_weight consumes H (the reference's ``del self.H``): handed the only reference, it
    keeps at most two columns² matrices above what was there before (the Cholesky chain rebinds one
    name); given a copy to keep H, one H more. Measured with the CPU allocation tracker (a
    ``torch.no_grad`` decorator on quantize_weight would hold H for the whole call and fail this)."""
    from helpers import host_alloc

    torch.manual_seed(0)
    cols = 1024
    H_bytes = cols * cols * 4
    W = torch.randn(64, cols)
    X = torch.randn(2048, cols)
    H = 2 * X.t() @ X / len(X)
    spec, options = QuantSpec(4, 128), G.GPTQOptions(actorder=True)
    box = {"H": H.clone()}
    freed = host_alloc.peak_bytes(lambda: G.quantize_weight(W, box.pop("H"), spec, options), warmup=False)["peak"]
    kept = host_alloc.peak_bytes(lambda: G.quantize_weight(W, H.clone(), spec, options), warmup=False)["peak"]
    assert kept - freed >= 0.9 * H_bytes, (kept / H_bytes, freed / H_bytes)   # consuming saves one whole H
    assert freed <= 2 * H_bytes, freed / H_bytes


def test_fasterquant_consumes_H_and_says_so():
    lin = torch.nn.Linear(32, 8, bias=False)
    g = G.GPTQ(lin)
    g.add_batch(torch.randn(64, 32))
    g.fasterquant(QuantSpec(4, 16))
    assert g.H is None
    with pytest.raises(RuntimeError, match="already consumed"):
        g.fasterquant(QuantSpec(4, 16))
    with pytest.raises(RuntimeError, match="start a new GPTQ"):
        g.add_batch(torch.randn(4, 32))
    g = G.GPTQ(lin)
    g.add_batch(torch.randn(64, 32))
    with pytest.raises(ValueError, match="does not divide"):       # a bad spec fails before H is consumed
        g.fasterquant(QuantSpec(4, 48))
    assert g.H is not None


def test_options_are_checked():
    with pytest.raises(ValueError, match="blocksize must be a positive"):
        G.GPTQOptions(blocksize=0)
    with pytest.raises(ValueError, match="percdamp must be in"):
        G.GPTQOptions(percdamp=1.0)
    with pytest.raises(TypeError, match="actorder must be True or False"):
        G.GPTQOptions(actorder="yes")
    with pytest.raises(TypeError, match="options must be a GPTQOptions"):
        G.quantize_weight(torch.randn(4, 8), torch.eye(8), QuantSpec(4, None), {"blocksize": 8})
    with pytest.raises(ValueError, match="next_inputs must be one of"):
        CalibSpec(next_inputs="quantised")
    with pytest.raises(ValueError, match="batch_size must be a positive"):
        CalibSpec(batch_size=0)


def test_linears_sharing_an_input_are_quantized_as_one(tiny_llama, tiny_calib):
    """q/k/v (and gate/up) read one input tensor, share one H and are quantized stacked: the same
    weights as each alone with that H (GPTQ treats rows independently; to rounding, as the lazy
    update's matmul may sum in another order for another number of rows)."""
    from helpers import calib as C
    blk = decoder_layers(tiny_llama)[0]
    hidden, kw = C.capture_block_inputs(tiny_llama, tiny_calib, batch_size=2)
    acc = G.GPTQ(blk.self_attn.k_proj)
    for x in C.linear_inputs(blk, hidden, kw)["self_attn.q_proj"]:
        acc.add_batch(x)
    k_alone = G.quantize_weight(blk.self_attn.k_proj.weight.data, acc.take_hessian(), QuantSpec(4, 32)).Q
    losses = G.gptq_block(blk, hidden, kw, QuantSpec(4, 32))
    assert set(losses) == set(C.linears(blk))
    assert torch.allclose(blk.self_attn.k_proj.weight.data, k_alone, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offloading the block inputs matters on a GPU")
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_offloaded_block_inputs_same_weights_less_gpu_memory(tiny_llama_factory, method):
    """Keeping the calibration set's block inputs on the CPU between blocks (the default on a GPU)
    changes where they wait, not the numbers: the same quantized weights, a lower GPU peak."""
    from helpers import awq as A
    from helpers import gptq as G
    calib = torch.randint(0, 128, (64, 256), generator=torch.Generator().manual_seed(3))
    from helpers.calib import CalibSpec
    run = {"gptq": lambda m, off: G.gptq_model(m, calib, QuantSpec(4, 32), G.GPTQOptions(static_groups=True),
                                               CalibSpec(offload=off), progress=False),
           "awq": lambda m, off: A.awq_model(m, calib, QuantSpec(4, 32), A.AWQOptions(n_grid=4), CalibSpec(offload=off),
                                             progress=False)}[method]
    out = {}
    for off in (False, True):
        m = tiny_llama_factory(intermediate=512).cuda()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run(m, off)
        out[off] = (torch.cuda.max_memory_allocated() - before, {n: p.detach().cpu() for n, p in m.state_dict().items()})
        del m
        torch.cuda.empty_cache()
    assert all(torch.equal(out[True][1][n], p) for n, p in out[False][1].items())
    assert out[True][0] < out[False][0], (out[True][0], out[False][0])


def test_to_store_pins_what_leaves_the_gpu():
    """Block inputs leaving a GPU wait in pinned memory (the GPU copies them without staging); on a CPU,
    or staying on the device, they are the tensor as it is."""
    from helpers.calib import to_store
    x = torch.randn(3, 5)
    assert to_store(x, "cpu") is x
    if torch.cuda.is_available():
        y = to_store(x.cuda(), "cpu")
        assert y.is_pinned() and torch.equal(y, x)
        z = x.cuda()
        assert to_store(z, z.device) is z


def test_offload_setting_is_checked():
    from helpers import calib as C
    lin = torch.nn.Linear(2, 2)
    assert C.store_device(lin).type == "cpu" and C.store_device(lin, True).type == "cpu"
    with pytest.raises(ValueError, match="offload must be"):
        C.store_device(lin, "yes")


def test_gptq_block_keeps_no_autograd_history(tiny_llama_factory):
    """With autograd on (the caller's default) and weights that require grad (a fresh model's), GPTQ
    must not turn ``H += xᵀx`` into an autograd graph holding every batch's inputs: its peak stays
    below the inputs of the block's linears (measured with the CPU allocation tracker, autograd on)."""
    from helpers import calib as C
    from helpers import gptq as G
    from helpers import host_alloc
    from helpers.models import decoder_layers
    model = tiny_llama_factory(intermediate=1024)
    assert all(p.requires_grad for p in model.parameters())
    calib = torch.randint(0, 128, (64, 128), generator=torch.Generator().manual_seed(2))
    hidden, kw = C.capture_block_inputs(model, calib, batch_size=4)
    blk = decoder_layers(model)[0]
    every = sum(x.numel() * 4 for n, xs in C.linear_inputs(blk, hidden, kw).items()
                if n in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj") for x in xs)
    options = G.GPTQOptions(actorder=True, static_groups=True)
    peak = host_alloc.peak_bytes(lambda: G.gptq_block(blk, hidden, kw, QuantSpec(4, 32), options), warmup=False,
                                 no_grad=False)["peak"]
    assert peak < 0.5 * every, (peak, every)
    assert all(p.grad_fn is None for p in blk.parameters())
