"""GPTQ (Frantar, Ashkboos, Hoefler, Alistarh 2022, arXiv:2210.17323), written as the paper writes it.

Layer-wise problem: for a linear layer with weight ``W`` [rows, columns] and calibration inputs ``X``
[columns, N], find a quantized ``Ŵ`` minimising ``‖WX − ŴX‖²``. Its Hessian with respect to a row of
``W`` is ``H = 2/N · Σ XXᵀ`` (the same for every row). GPTQ (Algorithm 1) quantizes the columns in a
fixed order; after quantizing column i it spreads the error over the not-yet-quantized columns with
the inverse Hessian:

    err = (w_i − q_i) / Hinv[i, i]            W[:, i:] −= err ⊗ Hinv[i, i:]

where ``Hinv`` is the upper Cholesky factor of ``H⁻¹`` (the "Cholesky trick": all the rows of the
successive inverses that the OBQ update needs are rows of this one factor). Updates are applied
lazily in blocks of ``blocksize`` columns: inside a block column by column, to the rest of the
matrix once per block (``W[:, i2:] −= Err · Hinv[i1:i2, i2:]``), which is what makes it fast.
Dampening adds ``percdamp · mean(diag H)`` to the diagonal; "dead" inputs (diag H = 0) get weight 0.
``actorder`` processes columns by decreasing ``diag H``; ``static_groups`` fixes every group's
(scale, zero) from the original weights before any update (needed with act-order for a simple
kernel layout), otherwise a group's parameters are found when its first column is reached, from the
already-updated weights (the reference implementation's behaviour).

On CUDA, with static groups, each block's column loop is captured once as a CUDA graph and
replayed (:func:`_graphed`): the loop is launch-bound on a GPU, the graph makes it one launch.

The structure follows IST-DASLab/gptq ``gptq.py``; the quantization grid is :mod:`helpers.quant`'s.
"""
from __future__ import annotations

import math
import time

import torch

from . import calib as C
from .quant import allowed_group_sizes, check_bits, compute_qparams, quantize_with


def column_step(W1, Hinv1, i: int, scale, zero, bits: int, symmetric: bool):
    """One column of Algorithm 1 inside a block: quantize ``w = W1[:, i]`` with (scale, zero), then
    spread its error over the block's later columns, ``W1[:, i:] −= err ⊗ Hinv1[i, i:]`` with
    ``err = (w − q) / Hinv1[i, i]``. Returns ``(q, err)``."""
    w = W1[:, i]
    q = (quantize_with(w, scale, zero, bits, symmetric) - zero) * scale
    err = (w - q) / Hinv1[i, i]
    W1[:, i:] -= err[:, None] @ Hinv1[i, i:][None, :]
    return q, err


def quantize_columns(W1, Hinv1, S, Z, bits: int, symmetric: bool):
    """The inner loop over one block's columns when every column's (scale, zero) is given
    (``S``, ``Z`` [rows, block columns]); ``W1`` is updated in place. Returns ``(Q1, Err1)``."""
    Q1, Err1 = torch.zeros_like(W1), torch.zeros_like(W1)
    for i in range(W1.shape[1]):
        Q1[:, i], Err1[:, i] = column_step(W1, Hinv1, i, S[:, i], Z[:, i], bits, symmetric)
    return Q1, Err1


_GRAPHS: dict = {}


def _graphed(shape, bits: int, symmetric: bool, device):
    """:func:`quantize_columns` for one block shape, captured once as a CUDA graph and replayed.

    The column loop is sequential and made of tiny kernels, so on a GPU its cost is the launches
    (~10 per column from Python), not the arithmetic. A CUDA graph (PyTorch docs, "CUDA Graphs")
    records those launches once on static buffers; each block then copies its inputs in and replays
    the whole loop with one launch. Graphs are cached per (shape, bits, symmetric, device);
    :func:`free_graphs` releases them."""
    key = (tuple(shape), bits, symmetric, str(device))
    if key not in _GRAPHS:
        rows, cols = shape
        buf = {"W1": torch.zeros(rows, cols, device=device), "Hinv1": torch.eye(cols, device=device),
               "S": torch.ones(rows, cols, device=device), "Z": torch.zeros(rows, cols, device=device)}
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside the graph (allocator, lazy inits)
            quantize_columns(buf["W1"].clone(), buf["Hinv1"], buf["S"], buf["Z"], bits, symmetric)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            buf["Q1"], buf["Err1"] = quantize_columns(buf["W1"], buf["Hinv1"], buf["S"], buf["Z"], bits, symmetric)
        _GRAPHS[key] = (graph, buf)
    graph, buf = _GRAPHS[key]

    def run(W1, Hinv1, S, Z, _bits, _symmetric):
        for name, src in (("W1", W1), ("Hinv1", Hinv1), ("S", S), ("Z", Z)):
            buf[name].copy_(src)
        graph.replay()
        W1.copy_(buf["W1"])
        return buf["Q1"].clone(), buf["Err1"].clone()
    return run


def free_graphs() -> None:
    """Release the cached CUDA graphs of :func:`_graphed` and their buffers."""
    _GRAPHS.clear()


class GPTQ:
    """Accumulates ``H`` for one linear layer from its inputs, then quantizes its weight."""

    def __init__(self, layer: torch.nn.Linear):
        self.layer = layer
        self.rows, self.columns = layer.weight.shape
        self.H = torch.zeros(self.columns, self.columns, device=layer.weight.device, dtype=torch.float32)
        self.nsamples = 0  # tokens seen

    def add_batch(self, inp: torch.Tensor) -> None:
        """H ← running mean of 2·x xᵀ over all N tokens seen so far (H = 2/N · Σ XXᵀ)."""
        x = inp.reshape(-1, inp.shape[-1]).float()
        n = x.shape[0]
        self.H *= self.nsamples / (self.nsamples + n)
        self.nsamples += n
        x = math.sqrt(2 / self.nsamples) * x
        self.H += x.t() @ x

    @torch.no_grad()
    def quantize(self, bits: int = 4, group_size: int | None = 64, symmetric: bool = False,
                 blocksize: int = 128, percdamp: float = 0.01, actorder: bool = False,
                 static_groups: bool = False, graphs: bool | None = None) -> dict:
        """Run Algorithm 1 on the layer's weight in place; returns the loss and the parameters.

        ``graphs`` (default: on CUDA with static groups) replays each block's column loop as one
        CUDA graph instead of launching its ~10 small kernels per column from Python; same kernels,
        same numbers (see :func:`_graphed`)."""
        if self.nsamples == 0:
            raise RuntimeError("GPTQ.quantize called before add_batch: no calibration inputs seen")
        check_bits(bits)
        W = self.layer.weight.data.clone().float()
        g = group_size or self.columns
        if self.columns % g:
            raise ValueError(f"group_size={group_size} does not divide {self.columns} columns; "
                             f"allowed group sizes: {allowed_group_sizes(self.columns)}")
        H = self.H.clone()

        def params(w):  # per-row (scale, zero) of a slice of columns: min/max over the slice
            return compute_qparams(w.amin(1), w.amax(1), bits, symmetric)

        dead = torch.diag(H) == 0
        H[dead, dead] = 1
        W[:, dead] = 0
        groups = [params(W[:, j:j + g]) for j in range(0, self.columns, g)] if static_groups else None
        graphs = (W.is_cuda and static_groups) if graphs is None else graphs
        if graphs and not (W.is_cuda and static_groups):
            raise ValueError("graphs=True needs a CUDA weight and static_groups=True")
        perm = None
        if actorder:
            perm = torch.argsort(torch.diag(H), descending=True)
            W, H = W[:, perm], H[perm][:, perm]

        damp = percdamp * torch.mean(torch.diag(H))
        H[range(self.columns), range(self.columns)] += damp
        Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)

        # the group of each (possibly permuted) column, on the host: no device sync inside the loop
        col_group = [c // g for c in (perm.tolist() if perm is not None else range(self.columns))]
        if static_groups:  # every column's (scale, zero) is known up front: [rows, columns]
            gi = torch.tensor(col_group, device=W.device)
            S_all = torch.stack([s for s, _ in groups], 1)[:, gi]
            Z_all = torch.stack([z for _, z in groups], 1)[:, gi]
        Q = torch.zeros_like(W)
        Losses = torch.zeros(self.rows, device=W.device)
        for i1 in range(0, self.columns, blocksize):
            i2 = min(i1 + blocksize, self.columns)
            W1, Hinv1 = W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2]
            if static_groups:
                run = _graphed(W1.shape, bits, symmetric, W.device) if graphs else quantize_columns
                Q1, Err1 = run(W1, Hinv1, S_all[:, i1:i2], Z_all[:, i1:i2], bits, symmetric)
            else:
                Q1, Err1 = torch.zeros_like(W1), torch.zeros_like(W1)
                for i in range(i2 - i1):
                    if (i1 + i) % g == 0:  # a new group starts: its parameters from the updated weights
                        scale, zero = params(torch.cat([W1[:, i:], W[:, i2:]], 1)[:, :g])
                    Q1[:, i], Err1[:, i] = column_step(W1, Hinv1, i, scale, zero, bits, symmetric)
            Q[:, i1:i2] = Q1
            Losses += Err1.pow(2).sum(1) / 2          # Σ (w − q)² / Hinv[i,i]² / 2, per row
            W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]

        if perm is not None:
            Q = Q[:, torch.argsort(perm)]
        self.layer.weight.data.copy_(Q.to(self.layer.weight.dtype))
        self.row_losses = Losses
        return {"loss": Losses.sum().item(), "dead_columns": int(dead.sum()), "damp": damp.item()}


def layer_error(W: torch.Tensor, Wq: torch.Tensor, X: torch.Tensor) -> float:
    """The layer-wise objective ``‖WX − ŴX‖² / ‖WX‖²`` for inputs ``X`` [tokens, columns]."""
    ref = X.float() @ W.float().t()
    return ((X.float() @ Wq.float().t() - ref).pow(2).sum() / ref.pow(2).sum()).item()


def gptq_block(block, hidden: list, kwargs: list, **quant_kw) -> dict:
    """Quantize every linear of one decoder block with GPTQ: one calibration pass collects ``H`` of
    each linear (linears reading the same input — q/k/v, gate/up — share one ``H``), then each is
    quantized. Returns ``{linear name: loss}``."""
    lins = C.linears(block)
    gptq = {n: GPTQ(m) for n, m in lins.items()}
    shared: dict = {}  # id(input) → (input, the GPTQ that accumulated it); holding it keeps ids unique

    def make_hook(name):
        def hook(_m, args, _out):
            x = args[0]
            seen = shared.get(id(x))
            if seen is None or seen[0] is not x:
                shared[id(x)] = (x, gptq[name])
                gptq[name].add_batch(x)
            else:  # the same input tensor as a sibling linear: share its H
                gptq[name].twin = seen[1]
        return hook

    hooks = [m.register_forward_hook(make_hook(n)) for n, m in lins.items()]
    try:
        for x, kw in zip(hidden, kwargs):
            shared.clear()
            block(x, use_cache=False, **kw)
    finally:
        for h in hooks:
            h.remove()
    shared.clear()
    # Linears that read the same input share H, and GPTQ treats rows independently: stacking their
    # rows (q|k|v, gate|up) into one matrix gives the same result in one column loop instead of three.
    groups: dict = {}
    for n, q in gptq.items():
        groups.setdefault(id(getattr(q, "twin", q)), []).append(n)
    out = {}
    for names in groups.values():
        owner = gptq[names[0]]
        weights = [lins[n].weight for n in names]
        stacked = torch.nn.Linear(owner.columns, sum(w.shape[0] for w in weights), bias=False,
                                  device=weights[0].device, dtype=weights[0].dtype)
        stacked.weight.data.copy_(torch.cat([w.data for w in weights]))
        joint = GPTQ(stacked)
        joint.H, joint.nsamples = owner.H, owner.nsamples
        joint.quantize(**quant_kw)
        r0 = 0
        for n, w in zip(names, weights):
            w.data.copy_(stacked.weight.data[r0:r0 + w.shape[0]])
            out[n] = joint.row_losses[r0:r0 + w.shape[0]].sum().item()
            r0 += w.shape[0]
        owner.H = None
    return out


def gptq_model(model, calib: torch.Tensor, bits: int = 4, group_size: int | None = 64,
               symmetric: bool = False, blocksize: int = 128, percdamp: float = 0.01,
               actorder: bool = False, static_groups: bool = False, batch_size: int = 8,
               progress: bool = True) -> dict:
    """GPTQ over a whole decoder, block by block (see :mod:`helpers.calib`), in place.

    ``calib`` is [n_samples, seq_len] token ids from the calibration split. Embeddings and lm_head
    are kept, as in the paper. Returns ``{"seconds", "calib_tokens", "losses": {layer: loss}}``.
    """
    kw = dict(bits=bits, group_size=group_size, symmetric=symmetric, blocksize=blocksize,
              percdamp=percdamp, actorder=actorder, static_groups=static_groups)
    t0 = time.perf_counter()
    try:
        recs = C.sequential(model, calib, lambda i, b, h, k: gptq_block(b, h, k, **kw),
                            desc=f"GPTQ w{bits}g{group_size}", batch_size=batch_size, progress=progress)
    finally:
        free_graphs()
    losses = {f"model.layers.{i}.{n}": v for i, r in enumerate(recs) for n, v in r.items()}
    return {"seconds": time.perf_counter() - t0, "calib_tokens": C.tokens_of(calib), "losses": losses}
