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
kernel layout; llm-compressor always does this).

**Where a group's (scale, zero) come from without static groups.** Ours: when the loop reaches the
first column of a group, from the weights *as they are then*, including the updates that earlier
columns of the same block made (``W1``). The reference (IST-DASLab ``gptq.py``,
``find_params(W[:, i1+i : i1+i+groupsize])``) reads them from ``W``, whose columns inside the current
block have not yet received those in-block updates (they reach ``W`` only at the end of the block).
The two agree when every group starts a block (``group_size`` a multiple of ``blocksize``) and differ
otherwise, e.g. g64 with blocks of 128 (``tests/test_gptq.py`` shows both).

One loop, :func:`quantize_block`, is the paper's inner loop; on CUDA with static groups the same
function is replayed as a CUDA graph by the speed layer :class:`helpers.cuda_graphs.GraphedCalls`.
The structure follows IST-DASLab/gptq ``gptq.py``; the quantization grid is :mod:`helpers.quant`'s.
"""
from __future__ import annotations

import contextlib
import functools
import math
import time

import torch

from . import calib as C
from .cuda_graphs import GraphedCalls
from .device import cpu_threads
from .qspec import QuantSpec, positive_int
from .quant import check_finite, compute_qparams, quantize_with


def find_params(w: torch.Tensor, spec: QuantSpec):
    """Per-row (scale, zero) of a slice of columns ``w`` [rows, cols]: min/max over the slice."""
    return compute_qparams(w.amin(1), w.amax(1), spec.bits, spec.symmetric)


def column_step(W1, Hinv1, i: int, scale, zero, spec: QuantSpec):
    """One column of Algorithm 1 inside a block: quantize ``w = W1[:, i]`` with (scale, zero), then
    spread its error over the block's later columns, ``W1[:, i:] −= err ⊗ Hinv1[i, i:]`` with
    ``err = (w − q) / Hinv1[i, i]``. Returns ``(q, err)``."""
    w = W1[:, i]
    q = (quantize_with(w, scale, zero, spec.bits, spec.symmetric) - zero) * scale
    err = (w - q) / Hinv1[i, i]
    W1[:, i:] -= err[:, None] @ Hinv1[i, i:][None, :]
    return q, err


def quantize_block(W1, Hinv1, grid, spec: QuantSpec):
    """The inner loop of Algorithm 1 over one block's columns; ``W1`` is updated in place.
    ``grid(i, W1) -> (scale, zero)`` gives column ``i``'s quantization grid. Returns ``(Q1, Err1)``."""
    Q1, Err1 = torch.zeros_like(W1), torch.zeros_like(W1)
    for i in range(W1.shape[1]):
        scale, zero = grid(i, W1)
        Q1[:, i], Err1[:, i] = column_step(W1, Hinv1, i, scale, zero, spec)
    return Q1, Err1


def quantize_block_static(W1, Hinv1, S1, Z1, spec: QuantSpec):
    """:func:`quantize_block` when every column's (scale, zero) is known up front (``S1``, ``Z1``
    [rows, block columns]): the form a CUDA graph can replay."""
    return quantize_block(W1, Hinv1, lambda i, _W1: (S1[:, i], Z1[:, i]), spec)


def column_loop_graphs(spec: QuantSpec, share_pool: bool = True) -> GraphedCalls:
    """:func:`quantize_block_static` replayed as CUDA graphs (one per block shape, their temporaries in
    one shared memory pool unless ``share_pool=False``); close it after use."""
    return GraphedCalls(functools.partial(quantize_block_static, spec=spec), mutated=(0,), share_pool=share_pool)


class GPTQ:
    """Accumulates ``H`` for one linear layer from its inputs, then quantizes its weight."""

    def __init__(self, layer: torch.nn.Linear):
        self.layer = layer
        self.rows, self.columns = layer.weight.shape
        self.H = torch.zeros(self.columns, self.columns, device=layer.weight.device, dtype=torch.float32)
        self.nsamples = 0  # tokens seen

    @torch.no_grad()
    def add_batch(self, inp: torch.Tensor) -> None:
        """H ← running mean of 2·x xᵀ over all N tokens seen so far (H = 2/N · Σ XXᵀ)."""
        if inp.shape[-1] != self.columns:
            raise ValueError(f"add_batch got inputs with {inp.shape[-1]} features; the layer has "
                             f"{self.columns} input columns")
        check_finite(inp, "the calibration inputs passed to add_batch")
        x = inp.reshape(-1, inp.shape[-1]).float()
        n = x.shape[0]
        self.H *= self.nsamples / (self.nsamples + n)
        self.nsamples += n
        x = math.sqrt(2 / self.nsamples) * x
        self.H += x.t() @ x

    @torch.no_grad()
    def fasterquant(self, spec: QuantSpec, blocksize: int = 128, percdamp: float = 0.01,
                    actorder: bool = False, static_groups: bool = False,
                    graphs: GraphedCalls | None = None, free_hessian: bool = False) -> dict:
        """Run Algorithm 1 on the layer's weight in place (the reference's name); returns the loss.

        ``graphs`` (from :func:`column_loop_graphs`, static groups on CUDA only) replays each block's
        column loop as one CUDA graph: the same function, the same numbers, one launch.
        ``free_hessian`` consumes ``self.H`` instead of copying it (as the reference does,
        ``H = self.H; del self.H``): for a ``columns²`` Hessian — 256 MiB for an 8192-wide
        ``down_proj`` — one copy fewer at the peak; ``self.H`` is None afterwards."""
        if self.nsamples == 0:
            raise RuntimeError("GPTQ.fasterquant called before add_batch: no calibration inputs seen")
        spec = QuantSpec.of(spec)
        blocksize = positive_int(blocksize, "blocksize")
        if not 0 <= percdamp < 1:
            raise ValueError(f"percdamp must be in [0, 1), got {percdamp}")
        W = self.layer.weight.data.clone().float()
        check_finite(W, "the layer's weight")
        check_finite(self.H, "the Hessian H (calibration inputs)")
        g = spec.group_for(self.columns)
        if graphs is not None and not (W.is_cuda and static_groups):
            raise ValueError("graphs need a CUDA weight and static_groups=True")
        H = self.H if free_hessian else self.H.clone()
        if free_hessian:
            self.H = None
        dead = torch.diag(H) == 0
        H[dead, dead] = 1
        W[:, dead] = 0
        groups = [find_params(W[:, j:j + g], spec) for j in range(0, self.columns, g)] if static_groups else None
        perm = None
        if actorder:
            perm = torch.argsort(torch.diag(H), descending=True)
            W = W[:, perm]
            H = H[perm]        # one permuted copy at a time: the previous one is freed by the rebinding
            H = H[:, perm]

        damp = percdamp * torch.mean(torch.diag(H))
        H[range(self.columns), range(self.columns)] += damp
        # Hinv = chol(H⁻¹)ᵀ, each step rebinding the name so that only two columns² matrices live at once
        H = torch.linalg.cholesky(H)
        H = torch.cholesky_inverse(H)
        Hinv = torch.linalg.cholesky(H, upper=True)
        del H

        if static_groups:  # every group's (scale, zero) up front, [rows, groups]; gi: each column's group,
            # in processing order (a block's columns gather theirs: [rows, blocksize], not [rows, columns])
            gi = torch.tensor([c // g for c in (perm.tolist() if perm is not None else range(self.columns))],
                              device=W.device)
            S_grp = torch.stack([s for s, _ in groups], 1)
            Z_grp = torch.stack([z for _, z in groups], 1)
            del groups
        Q = torch.zeros_like(W)
        Losses = torch.zeros(self.rows, device=W.device)
        current: dict = {}  # the dynamic grid of the group in progress (a group may span blocks)
        for i1 in range(0, self.columns, blocksize):
            i2 = min(i1 + blocksize, self.columns)
            W1, Hinv1 = W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2]
            # the column loop is many tiny ops: on a CPU one thread beats several (device.cpu_threads)
            with cpu_threads(1) if W.device.type == "cpu" else contextlib.nullcontext():
                if static_groups:
                    S1, Z1 = S_grp[:, gi[i1:i2]], Z_grp[:, gi[i1:i2]]
                    loop = graphs or functools.partial(quantize_block_static, spec=spec)
                    Q1, Err1 = loop(W1, Hinv1, S1, Z1)
                else:
                    Q1, Err1 = quantize_block(W1, Hinv1, self._dynamic_grid(W, i1, i2, g, spec, current), spec)
            Q[:, i1:i2] = Q1
            Losses += Err1.pow(2).sum(1) / 2          # Σ (w − q)² / Hinv[i,i]² / 2, per row
            W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]      # the lazy batch update of the later blocks

        if perm is not None:
            Q = Q[:, torch.argsort(perm)]
        self.layer.weight.data.copy_(Q.to(self.layer.weight.dtype))
        self.row_losses = Losses
        return {"loss": Losses.sum().item(), "dead_columns": int(dead.sum()), "damp": damp.item()}

    @staticmethod
    def _dynamic_grid(W, i1: int, i2: int, g: int, spec: QuantSpec, current: dict):
        """Column ``i``'s grid inside block ``[i1, i2)``: a group's (scale, zero) found when its first
        column is reached, from the weights as updated so far (``W1`` for this block's columns, ``W``
        beyond it; see the module docstring for how the reference differs). ``current`` carries the
        grid of a group that spans blocks."""
        def grid(i, W1):
            if (i1 + i) % g == 0:
                current["p"] = find_params(torch.cat([W1[:, i:], W[:, i2:]], 1)[:, :g], spec)
            return current["p"]
        return grid


def layer_error(W: torch.Tensor, Wq: torch.Tensor, X: torch.Tensor) -> float:
    """The layer-wise objective ``‖WX − ŴX‖² / ‖WX‖²`` for inputs ``X`` [tokens, columns]."""
    ref = X.float() @ W.float().t()
    return ((X.float() @ Wq.float().t() - ref).pow(2).sum() / ref.pow(2).sum()).item()


@torch.no_grad()
def gptq_block(block, hidden: list, kwargs: list, **quant_kw) -> dict:
    """Quantize every linear of one decoder block with GPTQ (autograd off: with it on, ``H += xᵀx``
    would make ``H`` part of an autograd graph that keeps every batch's inputs alive — 10 GB on a
    1B model's 128 × 512 calibration tokens, measured on the H200): one calibration pass collects ``H`` of
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
        dev = C.block_device(block)
        for x, kw in zip(hidden, kwargs):
            shared.clear()
            block(x.to(dev), use_cache=False, **kw)
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
        owner.H = None                      # the joint GPTQ holds the only reference: it may consume it
        joint.fasterquant(**quant_kw, free_hessian=True)
        r0 = 0
        for n, w in zip(names, weights):
            w.data.copy_(stacked.weight.data[r0:r0 + w.shape[0]])
            out[n] = joint.row_losses[r0:r0 + w.shape[0]].sum().item()
            r0 += w.shape[0]
    return out


@torch.no_grad()
def gptq_model(model, calib: torch.Tensor, spec: QuantSpec | None = None, blocksize: int = 128,
               percdamp: float = 0.01, actorder: bool = False, static_groups: bool = False,
               batch_size: int = 8, progress: bool = True, graphs: bool | None = None,
               offload: bool | str = "auto", **spec_kw) -> dict:
    """GPTQ over a whole decoder, block by block (see :mod:`helpers.calib`), in place.

    ``calib`` is [n_samples, seq_len] token ids from the calibration split; ``spec`` (or ``bits=``,
    ``group_size=``, ``symmetric=``) the grid. Embeddings and lm_head are kept, as in the paper.
    ``graphs`` (default: on CUDA with static groups) replays column loops as CUDA graphs, freed at
    the end. ``offload`` keeps the block inputs on the CPU between blocks (default: when the model is
    on a GPU; :func:`helpers.calib.store_device`). Returns ``{"seconds", "calib_tokens", "losses": {layer: loss}}``.
    """
    spec = QuantSpec.of(spec, **spec_kw)
    C.check_calib(model, calib)
    cuda = next(model.parameters()).is_cuda
    graphs = (cuda and static_groups) if graphs is None else graphs
    t0 = time.perf_counter()
    with column_loop_graphs(spec) if graphs else contextlib.nullcontext() as replay:
        kw = dict(spec=spec, blocksize=blocksize, percdamp=percdamp, actorder=actorder,
                  static_groups=static_groups, graphs=replay)
        recs = C.sequential(model, calib, lambda i, b, h, k: gptq_block(b, h, k, **kw),
                            desc=f"GPTQ {spec.label}", batch_size=batch_size, progress=progress,
                            offload=offload)
    losses = {f"model.layers.{i}.{n}": v for i, r in enumerate(recs) for n, v in r.items()}
    return {"seconds": time.perf_counter() - t0, "calib_tokens": C.tokens_of(calib), "losses": losses}

