"""GPTQ (Frantar, Ashkboos, Hoefler, Alistarh 2022, arXiv:2210.17323), Algorithm 1 in the reference's names.

Layer-wise problem: for a linear layer with weight ``W`` [rows, columns] and calibration inputs ``X``
[columns, N], find a quantized ``Ŵ`` minimising ``‖WX − ŴX‖²``. Its Hessian with respect to a row of
``W`` is ``H = 2/N · Σ XXᵀ`` (the same for every row). GPTQ quantizes the columns in one order for
all rows; after quantizing column j it spreads the error over the columns not yet quantized with the
inverse Hessian (the OBS update, the paper's eq. 2–3):

    err = (w_j − q_j) / Hinv[j, j]            W[:, j:] −= err ⊗ Hinv[j, j:]

where ``Hinv`` is the upper Cholesky factor of ``H⁻¹`` (§3 "Cholesky reformulation": every row of the
successive inverses that the updates need is a row of this one factor). Updates are applied lazily
in blocks of ``blocksize`` columns (§3 "Lazy batch-updates"): inside a block column by column, to
the rest of the matrix once per block, ``W[:, i2:] −= Err1 · Hinv[i1:i2, i2:]``. Dampening adds
``percdamp · mean(diag H)`` to the diagonal; "dead" inputs (diag H = 0) get weight 0. ``actorder``
processes the columns by decreasing ``diag H``; ``static_groups`` fixes every group's (scale, zero)
from the original weights before any update (with act-order each group keeps one grid, a simple
kernel layout; llm-compressor always does this).

The code follows IST-DASLab ``gptq.py``'s ``GPTQ.fasterquant`` (names ``W1, Q1, Err1, Hinv1``,
``find_params``), split where Algorithm 1 nests: :func:`quantize_weight` is the algorithm — Hessian,
act-order, grids, the blocks and their lazy update — :func:`quantize_block` its inner loop over one
block, :func:`column_step` one column. :class:`GPTQ` accumulates ``H`` from a layer's inputs, as the
reference's class does. The grid is :mod:`helpers.quant`'s.

**Where a group's (scale, zero) come from without static groups.** When the loop reaches the first
column of a group, from the weights as they are then (:func:`find_params` on ``W[:, j:j+g]``). Ours
updates the block in place (``W1`` is a view of ``W``, as in the paper's Algorithm 1), so this
includes the updates that earlier columns of the same block made; the reference's ``W1`` is a copy,
so its ``find_params(W[:, i1+i : i1+i+groupsize])`` reads those columns without them (they reach
``W`` only at the end of the block). The two agree when every group starts a block (``group_size``
a multiple of ``blocksize``) and differ otherwise, e.g. g64 with blocks of 128 (``tests/test_gptq.py``
shows both).

Speed layer, kept apart: for static grids, :class:`KernelBlock` runs :func:`quantize_block` as one
Triton kernel per block (:mod:`helpers.gptq_kernel`: the rows are independent, so one program takes
a tile of rows through all of the block's columns), and :class:`BlockGraphs` replays it as CUDA graphs
(:class:`helpers.cuda_graphs.GraphedCalls`); :func:`quantize_weight` takes either in place of
:func:`quantize_block` and does not know the difference (the same weights, bit for bit, tested).
On CUDA, :meth:`GPTQ.add_batch` forms a half-precision batch's ``xᵀx`` on tensor cores with float32
sums (``torch.mm(..., out_dtype=torch.float32)``: the products of two bf16/fp16 numbers are exact in
float32), instead of first widening ``x`` to float32.
"""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass

import torch

from . import calib as C
from . import gptq_kernel
from .cuda_graphs import GraphedCalls
from .device import cpu_threads
from .qspec import QuantSpec, positive_int
from .quant import check_finite, compute_qparams, quantize_with


@dataclass(frozen=True)
class GPTQOptions:
    """The reference's ``fasterquant`` settings, validated once: ``blocksize`` (columns per lazy batch
    update), ``percdamp`` (dampening, the fraction of ``mean(diag H)`` added to the diagonal),
    ``actorder`` (columns by decreasing ``diag H``), ``static_groups`` (every group's grid from the
    original weights)."""
    blocksize: int = 128
    percdamp: float = 0.01
    actorder: bool = False
    static_groups: bool = False

    def __post_init__(self):
        object.__setattr__(self, "blocksize", positive_int(self.blocksize, "blocksize"))
        if isinstance(self.percdamp, bool) or not isinstance(self.percdamp, (int, float)) or not 0 <= self.percdamp < 1:
            raise ValueError(f"percdamp must be in [0, 1), got {self.percdamp!r}")
        for name in ("actorder", "static_groups"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")


@dataclass
class Grids:
    """Every group's grid, ``scale`` and ``zero`` [rows, groups], and ``group_of[j]``: the group of the
    j-th column in processing order (with act-order and static groups, the group of the column's
    original position). ``static``: the table was filled from the original weights before the loop;
    otherwise :func:`quantize_block` fills a group's entry when it reaches the group's first column."""
    scale: torch.Tensor
    zero: torch.Tensor
    group_of: list[int]
    size: int
    static: bool

    @functools.cached_property
    def group_index(self) -> torch.Tensor:
        """``group_of`` as a tensor on the table's device (to gather a block's grids in one op)."""
        return torch.tensor(self.group_of, device=self.scale.device)


@dataclass(frozen=True)
class GPTQResult:
    """``Q``: the quantized weight [rows, columns] (float32, original column order); ``losses``: per
    row, ``Σ_j (w_j − q_j)² / Hinv[j, j]² / 2`` (the reference's ``Losses`` summed over the columns);
    ``dead_columns``: inputs with ``diag H = 0``; ``damp``: what was added to the diagonal."""
    Q: torch.Tensor
    losses: torch.Tensor
    dead_columns: int
    damp: float


def find_params(w: torch.Tensor, spec: QuantSpec):
    """Per-row (scale, zero) of a slice of columns ``w`` [rows, cols] from its min and max (the
    reference's ``Quantizer.find_params``; the formulas of :func:`helpers.quant.compute_qparams`)."""
    return compute_qparams(w.amin(1), w.amax(1), spec.bits, spec.symmetric)


def column_step(W1, Hinv1, i: int, scale, zero, spec: QuantSpec):
    """One column of Algorithm 1: ``q = quant(w)`` for ``w = W1[:, i]`` on the grid (scale, zero), then
    its error spread over the block's later columns, ``err = (w − q) / Hinv1[i, i]``,
    ``W1[:, i:] −= err ⊗ Hinv1[i, i:]`` (in place). Returns ``(q, err)``."""
    w = W1[:, i]
    q = (quantize_with(w, scale, zero, spec.bits, spec.symmetric) - zero) * scale
    err = (w - q) / Hinv1[i, i]
    W1[:, i:] -= err[:, None] @ Hinv1[i, i:][None, :]
    return q, err


def quantize_block(W, Hinv, i1: int, i2: int, grids: Grids, spec: QuantSpec):
    """Algorithm 1's inner loop over the columns ``i1 … i2−1`` of ``W``, in place: each column on its
    group's grid (a dynamic group's grid found at its first column, from the weights as they are
    then), its error spread over the block's later columns. Returns ``(Q1, Err1)`` [rows, i2 − i1]:
    the block's quantized columns and their errors ``(w − q) / Hinv[j, j]``."""
    W1, Hinv1 = W[:, i1:i2], Hinv[i1:i2, i1:i2]      # W1 is a view: the in-block updates land in W
    Q1, Err1 = torch.zeros_like(W1), torch.zeros_like(W1)
    g = grids.size
    for i in range(i2 - i1):
        j = i1 + i
        if not grids.static and j % g == 0:            # a group begins: its grid from the weights now
            grids.scale[:, j // g], grids.zero[:, j // g] = find_params(W[:, j:j + g], spec)
        k = grids.group_of[j]
        Q1[:, i], Err1[:, i] = column_step(W1, Hinv1, i, grids.scale[:, k], grids.zero[:, k], spec)
    return Q1, Err1


def quantize_weight(W: torch.Tensor, H: torch.Tensor, spec: QuantSpec, options: GPTQOptions = GPTQOptions(),
                    block=quantize_block) -> GPTQResult:
    """Algorithm 1 on a weight ``W`` [rows, columns] (not modified) with the Hessian of its inputs
    ``H`` [columns, columns], which is **consumed** — overwritten and freed as the steps go, like the
    reference's ``H = self.H; del self.H``: pass a copy to keep it (and hold no other reference to
    free it). ``block`` runs the inner loop over one block (:func:`quantize_block`, or the same
    replayed as CUDA graphs, :class:`BlockGraphs`). Autograd-free by construction (both detached;
    no ``torch.no_grad`` decorator, whose wrapper would hold ``H`` for the whole call)."""
    spec = QuantSpec.of(spec)
    if not isinstance(options, GPTQOptions):
        raise TypeError(f"options must be a GPTQOptions, got {type(options).__name__}")
    rows, columns = W.shape
    g = spec.group_for(columns)
    W, H = W.detach().clone().float(), H.detach()
    check_finite(W, "the layer's weight")
    check_finite(H, "the Hessian H (calibration inputs)")
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    if options.static_groups:                          # every group's grid from the original weights
        found = [find_params(W[:, j:j + g], spec) for j in range(0, columns, g)]
        S, Z = torch.stack([s for s, _ in found], 1), torch.stack([z for _, z in found], 1)
        del found
    perm = None
    if options.actorder:
        perm = torch.argsort(torch.diag(H), descending=True)
        W = W[:, perm]
        H = H[perm]        # one permuted copy at a time: the previous one is freed by the rebinding
        H = H[:, perm]
    order = perm.tolist() if perm is not None else range(columns)
    grids = Grids(S, Z, [c // g for c in order], g, True) if options.static_groups else \
        Grids(W.new_zeros(rows, columns // g), W.new_zeros(rows, columns // g), [j // g for j in range(columns)], g, False)

    damp = options.percdamp * torch.mean(torch.diag(H))
    H[range(columns), range(columns)] += damp
    # Hinv = chol(H⁻¹)ᵀ, each step rebinding the name so that only two columns² matrices live at once
    H = torch.linalg.cholesky(H)
    H = torch.cholesky_inverse(H)
    Hinv = torch.linalg.cholesky(H, upper=True)
    del H

    Q = torch.zeros_like(W)
    Losses = torch.zeros(rows, device=W.device)
    for i1 in range(0, columns, options.blocksize):
        i2 = min(i1 + options.blocksize, columns)
        # the column loop is many tiny ops: on a CPU one thread beats several (device.cpu_threads)
        with cpu_threads(1) if W.device.type == "cpu" else contextlib.nullcontext():
            Q1, Err1 = block(W, Hinv, i1, i2, grids, spec)
        Q[:, i1:i2] = Q1
        Losses += Err1.pow(2).sum(1) / 2          # Σ (w − q)² / Hinv[j, j]² / 2 per row: the reference's Losses1
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]      # the lazy batch update of the later blocks

    if perm is not None:
        Q = Q[:, torch.argsort(perm)]
    return GPTQResult(Q, Losses, int(dead.sum()), damp.item())


def gram(x: torch.Tensor) -> torch.Tensor:
    """``xᵀx`` in float32 for ``x`` [tokens, features]: bf16/fp16 on CUDA on tensor cores with float32
    sums (exact products), otherwise in float32."""
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(x.t(), x, out_dtype=torch.float32)
    x = x.float()
    return x.t() @ x


class GPTQ:
    """One linear layer's ``H``, accumulated from its inputs (:meth:`add_batch`), then its weight
    quantized in place (:meth:`fasterquant`): the reference's class."""

    def __init__(self, layer: torch.nn.Linear):
        self.layer = layer
        self.rows, self.columns = layer.weight.shape
        self.H = torch.zeros(self.columns, self.columns, device=layer.weight.device, dtype=torch.float32)
        self.nsamples = 0  # tokens seen

    @torch.no_grad()
    def add_batch(self, inp: torch.Tensor) -> None:
        """H ← running mean of 2·x xᵀ over all N tokens seen so far (H = 2/N · Σ XXᵀ)."""
        if self.H is None:
            raise RuntimeError("GPTQ.add_batch after fasterquant: H was consumed; start a new GPTQ(layer)")
        if inp.shape[-1] != self.columns:
            raise ValueError(f"add_batch got inputs with {inp.shape[-1]} features; the layer has "
                             f"{self.columns} input columns")
        check_finite(inp, "the calibration inputs passed to add_batch")
        x = inp.reshape(-1, inp.shape[-1])
        n = x.shape[0]
        self.H *= self.nsamples / (self.nsamples + n)
        self.nsamples += n
        self.H.add_(gram(x), alpha=2 / self.nsamples)

    def _check_ready(self) -> None:
        if self.nsamples == 0:
            raise RuntimeError("GPTQ.fasterquant called before add_batch: no calibration inputs seen")
        if self.H is None:
            raise RuntimeError("GPTQ's H was already consumed by fasterquant; start a new GPTQ(layer)")

    def take_hessian(self) -> torch.Tensor:
        """``H``, handed over: this object keeps no reference, so :func:`quantize_weight` can consume it."""
        self._check_ready()
        H, self.H = self.H, None
        return H

    @torch.no_grad()
    def fasterquant(self, spec: QuantSpec, blocksize: int = 128, percdamp: float = 0.01, actorder: bool = False,
                    static_groups: bool = False) -> dict:
        """:func:`quantize_weight` on the layer's weight, written back in place; consumes ``H``, as the
        reference does. Returns ``{"loss", "dead_columns", "damp"}``."""
        self._check_ready()
        options, spec = GPTQOptions(blocksize, percdamp, actorder, static_groups), QuantSpec.of(spec)
        spec.group_for(self.columns)                  # a bad group size fails before H is consumed
        r = quantize_weight(self.layer.weight.data, self.take_hessian(), spec, options)
        self.layer.weight.data.copy_(r.Q.to(self.layer.weight.dtype))
        return {"loss": r.losses.sum().item(), "dead_columns": r.dead_columns, "damp": r.damp}


def layer_error(W: torch.Tensor, Wq: torch.Tensor, X: torch.Tensor) -> float:
    """The layer-wise objective ``‖WX − ŴX‖² / ‖WX‖²`` for inputs ``X`` [tokens, columns]."""
    ref = X.float() @ W.float().t()
    return ((X.float() @ Wq.float().t() - ref).pow(2).sum() / ref.pow(2).sum()).item()


@torch.no_grad()
def gptq_block(block, hidden: list, kwargs: list, spec: QuantSpec, options: GPTQOptions = GPTQOptions(),
               quantize=quantize_block) -> dict:
    """GPTQ on every linear of one decoder block, in place. One calibration pass accumulates the ``H``
    of each distinct input (linears reading the same input tensor — q/k/v, gate/up — share one); then
    the rows of the linears sharing an ``H`` are stacked and quantized together: GPTQ treats rows
    independently, so that is the same as one by one, in one column loop. ``quantize`` is the inner
    loop :func:`quantize_weight` runs. Autograd stays off: with it on, ``H += xᵀx`` would become part
    of a graph that keeps every batch's inputs alive. Returns ``{linear name: loss}``."""
    lins = C.linears(block)
    hessians: dict[str, GPTQ] = {}     # the first linear reading an input → the GPTQ accumulating its H
    reader: dict[str, str] = {}        # linear → the first linear that read the same input tensor
    batch: dict[int, tuple] = {}       # id(input) → (input, its first reader) in one batch; holding it keeps ids unique

    def make_hook(name):
        def hook(_m, args, _out):
            x = args[0]
            seen = batch.get(id(x))
            if seen is not None and seen[0] is x:
                reader[name] = seen[1]
                return
            batch[id(x)] = (x, name)
            reader[name] = name
            if name not in hessians:
                hessians[name] = GPTQ(lins[name])
            hessians[name].add_batch(x)
        return hook

    hooks = [m.register_forward_hook(make_hook(n)) for n, m in lins.items()]
    try:
        dev = C.block_device(block)
        for x, kw in zip(hidden, kwargs):
            batch.clear()
            block(x.to(dev), use_cache=False, **kw)
    finally:
        for h in hooks:
            h.remove()
    batch.clear()
    unused = [n for n in lins if n not in reader]
    if unused:
        raise RuntimeError(f"gptq_block: linears {unused} received no input in the calibration pass")
    stacks: dict[str, list[str]] = {}
    for n in lins:
        stacks.setdefault(reader[n], []).append(n)
    losses = {}
    for first, names in stacks.items():
        weights = [lins[n].weight for n in names]
        r = quantize_weight(torch.cat([w.data for w in weights]), hessians.pop(first).take_hessian(), spec,
                            options, quantize)
        r0 = 0
        for n, w in zip(names, weights):
            w.data.copy_(r.Q[r0:r0 + w.shape[0]].to(w.dtype))
            losses[n] = r.losses[r0:r0 + w.shape[0]].sum().item()
            r0 += w.shape[0]
    return losses


INNER = ("eager", "graphs", "kernel")    # how gptq_model runs the column loop of each block


def inner_loop(inner, spec: QuantSpec, options: GPTQOptions, cuda: bool):
    """A context manager giving the column loop :func:`quantize_weight` runs: ``"eager"``
    (:func:`quantize_block`), ``"graphs"`` (:class:`BlockGraphs`), ``"kernel"`` (:class:`KernelBlock`);
    ``None`` picks the fastest the model allows (the kernel on CUDA with static groups where Triton is
    installed, else graphs there, else eager); an object with :func:`quantize_block`'s signature is
    used as given (and left open)."""
    if inner is None:
        inner = "eager" if not (cuda and options.static_groups) else "kernel" if gptq_kernel.available() else "graphs"
    if callable(inner):
        return contextlib.nullcontext(inner)
    if inner not in INNER:
        raise ValueError(f"inner must be None, one of {INNER} or a quantize_block-like callable, got {inner!r}")
    if inner != "eager" and not (cuda and options.static_groups):
        raise ValueError(f"inner={inner!r} needs a CUDA model and GPTQOptions(static_groups=True)")
    return {"eager": lambda: contextlib.nullcontext(quantize_block), "graphs": lambda: BlockGraphs(spec),
            "kernel": lambda: KernelBlock(spec)}[inner]()


@torch.no_grad()
def gptq_model(model, calib: torch.Tensor, spec: QuantSpec | None = None, options: GPTQOptions | None = None,
               calibration: C.CalibSpec | None = None, progress: bool = True, inner=None, **spec_kw) -> dict:
    """GPTQ over a whole decoder, block by block (:func:`helpers.calib.sequential`), in place.

    ``calib`` is [n_samples, seq_len] token ids from the calibration split; ``spec`` (or ``bits=``,
    ``group_size=``, ``symmetric=``) the grid; ``options`` the algorithm's settings (default
    :class:`GPTQOptions`); ``calibration`` how the pass runs (:class:`helpers.calib.CalibSpec`).
    Embeddings and lm_head are kept, as in the paper. ``inner``: how the column loops run
    (:func:`inner_loop`: by default the Triton kernel on CUDA with static groups, the same weights as
    the eager loop). Returns ``{"seconds", "calib_tokens", "losses": {layer: loss}}``.
    """
    spec = QuantSpec.of(spec, **spec_kw)
    options = GPTQOptions() if options is None else options
    if not isinstance(options, GPTQOptions):
        raise TypeError(f"options must be a GPTQOptions, got {type(options).__name__}")
    C.check_calib(model, calib)
    loop = inner_loop(inner, spec, options, next(model.parameters()).is_cuda)
    t0 = time.perf_counter()
    with loop as quantize:
        recs = C.sequential(model, calib, lambda i, b, h, k: gptq_block(b, h, k, spec, options, quantize),
                            calibration, desc=f"GPTQ {spec.label}", progress=progress)
    losses = {f"model.layers.{i}.{n}": v for i, r in enumerate(recs) for n, v in r.items()}
    return {"seconds": time.perf_counter() - t0, "calib_tokens": C.tokens_of(calib), "losses": losses}


# ------------------------------------------------------------------------ speed layer: CUDA graphs
def static_block(W1, Hinv1, S1, Z1, spec: QuantSpec):
    """:func:`quantize_block` over all of ``W1`` when every column's grid is given (``S1``, ``Z1``
    [rows, columns of ``W1``]): a function of fixed-shape tensors, the form a CUDA graph replays."""
    n = W1.shape[1]
    return quantize_block(W1, Hinv1, 0, n, Grids(S1, Z1, list(range(n)), 1, True), spec)


def block_inputs(W, Hinv, i1: int, i2: int, grids: Grids, spec: QuantSpec, made: tuple[str, QuantSpec]):
    """What a static-grid speed layer runs on for the block ``i1 … i2−1``: ``W1`` (a view, updated in
    place), ``Hinv1`` and the block's columns' grids gathered ``S1``, ``Z1`` [rows, i2 − i1]. ``made``
    is the layer's (name, spec): a call for another spec or for dynamic grids is refused."""
    name, own = made
    if spec != own:
        raise ValueError(f"{name} for {own.label} was called for {spec.label}")
    if not grids.static:
        raise ValueError(f"{name.split()[0]} runs static grids only: use GPTQOptions(static_groups=True)")
    idx = grids.group_index[i1:i2]
    return W[:, i1:i2], Hinv[i1:i2, i1:i2], grids.scale[:, idx], grids.zero[:, idx]


class BlockGraphs:
    """:func:`quantize_block` for static grids, replayed as CUDA graphs: pass it to
    :func:`quantize_weight` in its place. Each call copies the block's columns, its ``Hinv`` block
    and its columns' grids into the buffers of a graph recorded once per block shape, which runs
    :func:`static_block` — the same kernels in the same order as the eager loop, so the same weights,
    in one launch instead of ~10 per column (a column loop on a GPU is bound by kernel launches).
    The graphs' temporaries share one memory pool unless ``share_pool=False``; ``graphed`` is the
    replayer (:class:`helpers.cuda_graphs.GraphedCalls`). Close it, or leave its ``with`` block, to
    free the graphs."""

    def __init__(self, spec: QuantSpec, share_pool: bool = True, graphed=GraphedCalls):
        self.spec = QuantSpec.of(spec)
        self.calls = graphed(functools.partial(static_block, spec=self.spec), mutated=(0,), share_pool=share_pool)

    def __call__(self, W, Hinv, i1: int, i2: int, grids: Grids, spec: QuantSpec):
        return self.calls(*block_inputs(W, Hinv, i1, i2, grids, spec, ("BlockGraphs recorded", self.spec)))

    @property
    def n_graphs(self) -> int:
        """How many block shapes have a recorded graph."""
        return self.calls.n_graphs

    def close(self) -> None:
        self.calls.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------------------ speed layer: one Triton kernel
class KernelBlock:
    """:func:`quantize_block` for static grids as one Triton kernel per block
    (:func:`helpers.gptq_kernel.quantize_block_static`): pass it to :func:`quantize_weight` in its
    place. Each call gathers the block's columns' grids and runs all of the block's columns in one
    launch — the eager loop's weights, bit for bit. A context manager, like :class:`BlockGraphs`
    (nothing to free)."""

    def __init__(self, spec: QuantSpec):
        self.spec = QuantSpec.of(spec)

    def __call__(self, W, Hinv, i1: int, i2: int, grids: Grids, spec: QuantSpec):
        W1, Hinv1, S1, Z1 = block_inputs(W, Hinv, i1, i2, grids, spec, ("KernelBlock made", self.spec))
        return gptq_kernel.quantize_block_static(W1, Hinv1, S1, Z1, spec.bits, spec.symmetric)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None
