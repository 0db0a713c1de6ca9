"""AWQ: activation-aware weight quantization (Lin et al. 2024, arXiv:2306.00978), step by step.

Observation (paper §3.1): a few *input channels* of a linear layer see much larger activations than
the rest; their weights matter most. Keeping 1 % of them in FP16 recovers most of the loss, but mixed
precision is awkward; instead AWQ multiplies those weight columns by a scale ``s > 1`` before
quantization and divides the activation by ``s`` (folded into the previous op), which shrinks their
relative rounding error (§3.2). Per input channel ``j``:

    s_j = s_x,j ^ α          (s_x,j = mean |x_j| over the calibration tokens)

normalised by ``sqrt(max(s) · min(s))``, with ``α ∈ [0, 1)`` chosen on a 20-point grid to minimise the
output error of the block part that reads those layers, ``‖f(W, X) − f(Q(W·diag(s)), diag(s)⁻¹·X)‖²``
(eq. 4–5). (``duo_scaling`` divides by the weight magnitude too, ``s_j = s_x,j^α / s_w,j^(1−α)``: what
AutoAWQ later added and llm-compressor does by default.) The scales are folded into the previous
RMSNorm or linear, so the unquantized network computes the same function. Then ``auto_clip`` shrinks
each group's max on a grid to minimise the layer's output error (q/k projections are skipped: their
error is amplified by the softmax, as the reference notes).

Which op is scaled against which linears is declared once per architecture family by module names
(:class:`AWQMapping`, as llm-compressor's; the Llama list is llm-awq's ``auto_scale_block``) and
resolved against each block into the modules (:meth:`AWQFamily.resolve`). The α search
(:func:`search_scale`) scores each α with :class:`OutputError`, a forward pass of the inspected
module as llm-awq's ``_search_module_scale`` runs it; the speed layer :func:`scale_error` gives the
same ranking faster (:class:`GramError`; a bf16 copy, :func:`default_search_dtype`).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass

import torch

from . import calib as C
from .calib import InputStats
from .device import cpu_has_bf16
from .models import decoder_layers
from .qspec import QuantSpec, positive_int
from .quant import check_finite, quantizable_linears, rtn


@dataclass(frozen=True)
class AWQOptions:
    """AWQ's settings, validated once: ``n_grid`` (points of the α grid and of the clip search's shrink grid,
    :func:`search_clip`, which tries the shrinks ``1 − i/n_grid`` for ``i < n_grid/2``: none below 1 unless
    ``n_grid ≥ 4``; llm-awq's ``auto_scale`` and ``auto_clip`` both use 20), ``duo_scaling`` (scales from
    activations and weights, AutoAWQ's and llm-compressor's variant), ``clip`` (auto_clip after
    scaling), ``search_dtype`` (the α search's forward passes; ``None``: :func:`default_search_dtype`)."""
    n_grid: int = 20
    duo_scaling: bool = False
    clip: bool = True
    search_dtype: torch.dtype | None = None

    def __post_init__(self):
        object.__setattr__(self, "n_grid", positive_int(self.n_grid, "n_grid"))
        bad = [n for n in ("duo_scaling", "clip") if not isinstance(getattr(self, n), bool)]
        if bad:
            raise TypeError(f"{bad[0]} must be True or False, got {getattr(self, bad[0])!r}")
        if self.search_dtype is not None and not isinstance(self.search_dtype, torch.dtype):
            raise TypeError(f"search_dtype must be a torch.dtype or None, got {self.search_dtype!r}")


# ----------------------------------------------------------------- §3.1: salient channels, measured
@torch.no_grad()
def activation_stats(model, calib: torch.Tensor, batch_size: int = 8) -> dict[str, torch.Tensor]:
    """``mean |x_j|`` per input channel ``j`` of every decoder linear, over all calibration tokens."""
    lins = quantizable_linears(model)
    sums = {n: torch.zeros(m.in_features, dtype=torch.float64) for n, m in lins.items()}

    def make(name):
        def hook(_m, args, _o):
            sums[name] += args[0].reshape(-1, args[0].shape[-1]).abs().double().sum(0).cpu()
        return hook

    hooks = [m.register_forward_hook(make(n)) for n, m in lins.items()]
    try:
        C.forward_batches(model, calib, batch_size)
    finally:
        for h in hooks:
            h.remove()
    return {n: (s / calib.numel()).float() for n, s in sums.items()}


def salient_channels(stats: torch.Tensor, weight: torch.Tensor, fraction: float = 0.01, by: str = "act",
                     seed: int = 0) -> torch.Tensor:
    """Indices of the ``fraction`` most salient input channels (paper Table 1): by activation
    magnitude ``stats`` (AWQ's choice), by weight magnitude (the column's mean ``|w|``), or at random."""
    _check_fraction(fraction)
    k = max(1, int(round(fraction * weight.shape[1])))
    if by == "act":
        return stats.topk(k).indices
    if by == "weight":
        return weight.float().abs().mean(0).topk(k).indices
    if by == "random":
        return torch.randperm(weight.shape[1], generator=torch.Generator().manual_seed(seed))[:k]
    raise ValueError(f"by must be 'act', 'weight' or 'random', got {by!r}")


@torch.no_grad()
def rtn_keep_salient(model, stats: dict, spec: QuantSpec, fraction: float = 0.01, by: str = "act") -> None:
    """RTN every decoder linear but keep the salient input channels' weights in full precision."""
    _check_fraction(fraction)
    for n, lin in quantizable_linears(model).items():
        w = lin.weight.data.float()
        keep = salient_channels(stats[n], w, fraction, by)
        q = rtn(w, spec)
        q[:, keep] = w[:, keep]
        lin.weight.data.copy_(q.to(lin.weight.dtype))


@torch.no_grad()
def rtn_scale_salient(model, stats: dict, spec: QuantSpec, s: float, fraction: float = 0.01) -> None:
    """§3.2's experiment: multiply the salient columns by ``s`` before RTN, divide after
    (``Q(w·s)·x/s``; the quantizer's group scale barely moves, so their relative error falls by s —
    until the larger max of the group hurts the other channels)."""
    _check_fraction(fraction)
    if not s > 0:
        raise ValueError(f"the scale s must be positive, got {s}")
    for n, lin in quantizable_linears(model).items():
        w = lin.weight.data.float()
        scales = torch.ones(w.shape[1], device=w.device)
        scales[salient_channels(stats[n], w, fraction, "act")] = s
        lin.weight.data.copy_((rtn(w * scales, spec) / scales).to(lin.weight.dtype))


def _check_fraction(fraction: float) -> None:
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction of salient channels must be in (0, 1], got {fraction}")


# ---------------------------------------------------------------- §3.2: which ops scale which linears
@dataclass(frozen=True)
class AWQMapping:
    """One scaling of a decoder block, by module names inside the block: the output channels of
    ``smooth`` are divided by ``s`` and the input columns of the ``balance`` linears (which read that
    output) multiplied by ``s``; α is scored on the output of ``inspect`` (``None``: the one balance
    linear itself), called with the block's keyword arguments (rotary embeddings, attention mask)
    when ``with_block_kwargs``."""
    name: str
    smooth: str
    balance: tuple[str, ...]
    inspect: str | None = None
    with_block_kwargs: bool = False


@dataclass(frozen=True)
class ResolvedMapping:
    """An :class:`AWQMapping` resolved against one block: the modules themselves."""
    name: str
    smooth: torch.nn.Module
    balance: tuple[torch.nn.Linear, ...]
    balance_names: tuple[str, ...]
    inspect: torch.nn.Module
    with_block_kwargs: bool

    @property
    def input(self) -> str:
        """The linear whose input the statistics are gathered on (all balance linears read it)."""
        return self.balance_names[0]

    @property
    def inspects_linear(self) -> bool:
        """Whether the inspected module is the one balance linear (its error is then a quadratic form)."""
        return len(self.balance) == 1 and self.inspect is self.balance[0]

    def output(self, x: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """The inspected module's output for one batch ``x`` (the block's ``kwargs`` passed when it takes them)."""
        y = self.inspect(x, **(kwargs if self.with_block_kwargs else {}))
        return y[0] if isinstance(y, tuple) else y


@dataclass(frozen=True)
class AWQFamily:
    """What AWQ needs to know about one architecture family's decoder block: its ``mappings`` and the
    linears it does not clip (``unclipped``: q/k, whose error the softmax amplifies — llm-awq's
    ``auto_clip_block``)."""
    mappings: tuple[AWQMapping, ...]
    unclipped: tuple[str, ...]

    def resolve(self, block) -> list[ResolvedMapping]:
        """The mappings resolved against ``block``. A mapping whose smooth op's output width is not its
        balance linears' input width cannot fold its scales and is left out, as llm-awq leaves out
        v_proj → o_proj under grouped-query attention (v has fewer outputs than o has inputs)."""
        out = []
        for mp in self.mappings:
            try:
                smooth, balance = block.get_submodule(mp.smooth), tuple(block.get_submodule(n) for n in mp.balance)
                inspect = balance[0] if mp.inspect is None else block.get_submodule(mp.inspect)
            except AttributeError as e:
                raise ValueError(f"AWQ mapping {mp.name!r}: {type(block).__name__} lacks a module it names ({e}); "
                                 "the model is not of the family these mappings describe") from None
            width = smooth.out_features if isinstance(smooth, torch.nn.Linear) else smooth.weight.numel()
            if all(lin.in_features == width for lin in balance):
                out.append(ResolvedMapping(mp.name, smooth, balance, mp.balance, inspect, mp.with_block_kwargs))
        return out


LLAMA = AWQFamily(
    mappings=(
        AWQMapping("qkv", "input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                   inspect="self_attn", with_block_kwargs=True),
        AWQMapping("o", "self_attn.v_proj", ("self_attn.o_proj",)),
        AWQMapping("gate_up", "post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), inspect="mlp"),
        AWQMapping("down", "mlp.up_proj", ("mlp.down_proj",)),
    ),
    unclipped=("self_attn.q_proj", "self_attn.k_proj"))

FAMILIES = {"llama": LLAMA, "mistral": LLAMA, "qwen2": LLAMA, "qwen3": LLAMA}   # by config.model_type


def family_of(model) -> AWQFamily:
    """The AWQ family of ``model``'s architecture (``config.model_type``), or an error naming the known ones."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in FAMILIES:
        raise ValueError(f"AWQ has no mappings for model_type={kind!r}; known: {sorted(FAMILIES)} "
                         "(add an AWQFamily to helpers.awq.FAMILIES)")
    return FAMILIES[kind]


# -------------------------------------------------------------------------- §3.2: the search of α
def weight_scale(linears, spec: QuantSpec) -> torch.Tensor:
    """``s_w`` of duo scaling: per input channel, the mean over the linears' stacked rows of ``|w|``
    divided by the max ``|w|`` of its group (llm-awq's ``get_weight_scale``, AutoAWQ's ``w_mean``)."""
    W = torch.cat([lin.weight.data for lin in linears], 0).float()
    Wn = W.abs().reshape(W.shape[0], -1, spec.group_for(W.shape[1]))
    return (Wn / Wn.amax(-1, keepdim=True).clamp(min=1e-8)).reshape(W.shape).mean(0)


@torch.no_grad()
def search_scale(m: ResolvedMapping, x_mean: torch.Tensor, error, spec: QuantSpec, n_grid: int = 20,
                 duo_scaling: bool = False) -> dict:
    """Grid search of α (paper eq. 5; llm-awq's ``_search_module_scale``): for α = 0, 1/n, …, (n−1)/n,
    ``s = x_mean^α`` (``duo_scaling``: ``x_mean^α / s_w^(1−α)``, :func:`weight_scale`), clamped at 1e-4
    and normalised by ``sqrt(max s · min s)``; ``error(s)`` scores the candidate (:class:`OutputError`,
    or its faster equals from :func:`scale_error`) and the smallest wins. The block is left as it was.
    Returns ``{"alpha", "scales", "errors"}`` (errors per α)."""
    n_grid = positive_int(n_grid, "n_grid")
    w_mean = weight_scale(m.balance, spec) if duo_scaling else None
    errors, best = [], (float("inf"), 0.0, None)
    for k in range(n_grid):
        alpha = k / n_grid
        s = x_mean.pow(alpha) / (w_mean.pow(1 - alpha) if duo_scaling else 1)
        s = s.clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        err = error(s)
        errors.append(err)
        if err < best[0]:
            best = (err, alpha, s.clone())
    return {"alpha": best[1], "scales": best[2], "errors": errors}


class OutputError:
    """``error(s) = Σ_batches ‖f(x) − f_s(x)‖² / numel(f(X))`` (paper eq. 4): ``f`` is the mapping's
    inspected module, ``f_s`` the same with each balance weight ``W`` replaced by ``Q(W·diag(s))·diag(s)⁻¹``
    (``weights``: the ``W``, default the balance linears' own), on the inputs ``xs`` (one tensor per
    batch) and the block's ``kwargs``. The linears get their weights back after every call."""

    @torch.no_grad()
    def __init__(self, m: ResolvedMapping, xs: list, kwargs: list, spec: QuantSpec, weights=None):
        self.m, self.xs, self.kwargs, self.spec = m, xs, kwargs, spec
        self.weights = [w.clone() for w in (weights if weights is not None else [lin.weight.data for lin in m.balance])]
        self.ref = [m.output(x, kw) for x, kw in zip(xs, kwargs)]
        self.n = sum(r.numel() for r in self.ref)

    @torch.no_grad()
    def __call__(self, s: torch.Tensor) -> float:
        try:
            for lin, w in zip(self.m.balance, self.weights):
                lin.weight.data.copy_((rtn(w.float() * s, self.spec) / s).to(lin.weight.dtype))
            # one batch at a time: only the reference outputs are held, not a second set
            return sum((self.m.output(x, kw) - r).float().pow(2).sum().item()
                       for x, kw, r in zip(self.xs, self.kwargs, self.ref)) / self.n
        finally:
            for lin, w in zip(self.m.balance, self.weights):
                lin.weight.data.copy_(w)


class GramError:
    """:class:`OutputError` of one linear without running it: with ``E = Q(W·diag(s))·diag(s)⁻¹ − W`` and
    ``G = XᵀX`` over the N calibration tokens, ``‖X·Eᵀ‖² = tr(E·G·Eᵀ)``: ``error(s) = Σ(E·G ⊙ E) / (N·rows)``."""

    def __init__(self, weight: torch.Tensor, G: torch.Tensor, tokens: int, spec: QuantSpec):
        self.W, self.G, self.n, self.spec = weight.clone().float(), G, tokens * weight.shape[0], spec

    @torch.no_grad()
    def __call__(self, s: torch.Tensor) -> float:
        E = rtn(self.W * s, self.spec) / s - self.W
        return ((E @ self.G) * E).sum().item() / self.n


def default_search_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the α search runs its forward passes in: the weights' own, except fp32 weights on a
    CPU with bf16 matrix instructions (AVX512-BF16 / AMX), where bf16 matmuls are faster. The search
    only has to *rank* the candidates by output error, which bf16 does as a GPU run does; the
    folding, clipping and final rounding stay in the weights' dtype."""
    if weight.dtype == torch.float32 and weight.device.type == "cpu" and cpu_has_bf16():
        return torch.bfloat16
    return weight.dtype


def scale_error(m: ResolvedMapping, stats: InputStats, kwargs: list, spec: QuantSpec,
                search_dtype: torch.dtype | None = None):
    """The speed layer around :func:`search_scale`: the ``error(s)`` it minimises for mapping ``m``,
    computed the fast way from the streamed ``stats``. When the inspected module is the one balance
    linear (o, down): :class:`GramError` (no forward pass, no kept inputs). Otherwise
    :class:`OutputError`, run on a copy of the inspected module in ``search_dtype`` (default
    :func:`default_search_dtype`) when that is not the weights' dtype."""
    if stats.seen == 0:
        raise ValueError("scale_error got InputStats with no calibration inputs: call .add(x) per batch first")
    if m.inspects_linear:
        if not stats.want_gram:
            raise ValueError(f"scale_error for the {m.name!r} mapping needs InputStats(gram=True)")
        return GramError(m.balance[0].weight.data, stats.G, stats.seen, spec)
    if not stats.keep:
        raise ValueError(f"scale_error for the {m.name!r} mapping needs the inputs: InputStats(keep=True)")
    dtype = search_dtype or default_search_dtype(m.balance[0].weight)
    if dtype == m.balance[0].weight.dtype:
        return OutputError(m, stats.xs, kwargs, spec)
    part = copy.deepcopy(m.inspect).to(dtype)          # score on a copy in the search dtype
    names = {id(mod): n for n, mod in m.inspect.named_modules()}
    copied = dataclasses.replace(m, inspect=part, balance=tuple(part.get_submodule(names[id(lin)]) for lin in m.balance))
    return OutputError(copied, [x.to(dtype) for x in stats.xs], [C.cast_floats(kw, dtype) for kw in kwargs], spec,
                       weights=[lin.weight.data for lin in m.balance])


@torch.no_grad()
def apply_scale(smooth, balance, s: torch.Tensor) -> None:
    """Fold ``s`` (llm-awq's ``scale_ln_fcs`` / ``scale_fc_fc``): ``smooth``'s output channels ÷ s (a
    norm's weight and bias, or a linear's rows and bias), the ``balance`` linears' input columns × s.
    The unquantized function is unchanged: ``(x/s)·(W·s)ᵀ = x·Wᵀ``."""
    s = s.to(smooth.weight.device)
    smooth.weight.data.div_(s.reshape(-1, *[1] * (smooth.weight.dim() - 1)).to(smooth.weight.dtype))
    if getattr(smooth, "bias", None) is not None:
        smooth.bias.data.div_(s.to(smooth.bias.dtype))
    for lin in balance:
        lin.weight.data.mul_(s[None, :].to(lin.weight.dtype))


@torch.no_grad()
def search_clip(w: torch.Tensor, x: torch.Tensor, spec: QuantSpec, n_grid: int = 20,
                max_shrink: float = 0.5, n_tokens: int = 512) -> torch.Tensor:
    """``auto_clip``: per output row and group, the max |w| (shrunk by up to ``max_shrink`` on a grid)
    whose RTN minimises the error of the group's partial dot products with ``n_tokens`` sampled
    inputs ``x``. Returns the clip values [rows, n_groups, 1]; the unshrunk max is a grid point, so
    clipping never increases the measured error. (The reference broadcasts ``x * w`` over
    [rows, tokens, groups, g]; a batched matmul per group computes the same sums without the
    giant temporary.)"""
    g = spec.group_for(w.shape[1])
    if not 0 <= max_shrink < 1:
        raise ValueError(f"max_shrink must be in [0, 1), got {max_shrink}")
    rows, groups = w.shape[0], w.shape[1] // g
    x = x.reshape(-1, x.shape[-1])
    x = x[:: max(1, len(x) // n_tokens)][:n_tokens].float()
    xg = x.reshape(len(x), groups, g).transpose(0, 1)                        # [groups, n, g]
    wg = w.float().reshape(rows, groups, g)
    org_max = wg.abs().amax(-1, keepdim=True)                                # [rows, groups, 1]
    best, min_err = org_max.clone(), torch.full_like(org_max, float("inf"))
    for i in range(int(max_shrink * n_grid)):
        mx = org_max * (1 - i / n_grid)
        q = rtn(torch.clamp(wg, -mx, mx).reshape(rows, -1), spec).reshape(rows, groups, g)
        # the partial sums are linear in the weights: x·q − x·w = x·(q − w)   → [groups, n, rows]
        err = torch.bmm(xg, (q - wg).permute(1, 2, 0)).pow_(2).mean(1).t()[..., None]
        better = err < min_err
        min_err, best = torch.where(better, err, min_err), torch.where(better, mx, best)
    return best


@torch.no_grad()
def apply_clip(lin: torch.nn.Linear, max_val: torch.Tensor, spec: QuantSpec) -> None:
    """Clamp each group of ``lin``'s weight to ``±max_val`` (the clip values of :func:`search_clip`)."""
    w = lin.weight.data
    g = spec.group_for(w.shape[1])
    wg = w.float().reshape(w.shape[0], -1, g)
    lin.weight.data.copy_(torch.clamp(wg, -max_val, max_val).reshape(w.shape).to(w.dtype))


def block_input_stats(block, hidden: list, kwargs: list, maps: list[ResolvedMapping]) -> dict[str, InputStats]:
    """One pass of the calibration set through ``block``, gathering each *distinct* linear input's
    :class:`InputStats` (a mapping's balance linears read one input and share it; every other linear
    has its own): the inputs kept where :class:`OutputError` runs the inspected module, the Gram matrix
    where :class:`GramError` needs it, the clip-search sample everywhere. Returns ``{linear: stats}``."""
    total = sum(x.numel() // x.shape[-1] for x in hidden)
    first = {n: m.input for m in maps for n in m.balance_names}      # linear → the first reader of its input
    for n in C.linears(block):
        first.setdefault(n, n)
    searched = {m.input: m for m in maps}
    stats = {n: InputStats(total, keep=n in searched and not searched[n].inspects_linear,
                           gram=n in searched and searched[n].inspects_linear)
             for n in dict.fromkeys(first.values())}
    C.watch_linears(block, hidden, kwargs, lambda n, x: stats[n].add(x), names=list(stats))
    return {n: stats[f] for n, f in first.items()}


@torch.no_grad()
def awq_block(block, hidden: list, kwargs: list, spec: QuantSpec, options: AWQOptions = AWQOptions(),
              family: AWQFamily = LLAMA) -> dict:
    """AWQ on one block, in place: each linear input's statistics in one pass; mapping by mapping, α
    searched (:func:`search_scale` with :func:`scale_error`) and the scales folded (:func:`apply_scale`);
    then each group clipped (:func:`search_clip` on the same ``n_grid``; not the family's unclipped linears) and every linear
    rounded (RTN). Returns ``{mapping name: α}``."""
    maps = family.resolve(block)
    stats = block_input_stats(block, hidden, kwargs, maps)
    clip_x = {n: st.sample for n, st in stats.items()}        # the clip search's tokens, per linear
    alphas = {}
    for m in maps:
        st = stats[m.input]
        r = search_scale(m, st.x_mean, scale_error(m, st, kwargs, spec, options.search_dtype), spec,
                         options.n_grid, options.duo_scaling)
        st.release()                       # the kept inputs are not needed again
        apply_scale(m.smooth, m.balance, r["scales"])
        for n in m.balance_names:          # the inputs the scaled linears now receive are x / s
            clip_x[n] = [x / r["scales"].to(x.dtype) for x in clip_x[n]]
        alphas[m.name] = r["alpha"]
    del stats
    lins = C.linears(block)
    if options.clip:
        for n, lin in lins.items():
            if n not in family.unclipped:
                apply_clip(lin, search_clip(lin.weight.data, torch.cat(clip_x[n]), spec, options.n_grid), spec)
    for lin in lins.values():
        lin.weight.data.copy_(rtn(lin.weight.data.float(), spec).to(lin.weight.dtype))
    return alphas


@torch.no_grad()
def awq_model(model, calib: torch.Tensor, spec: QuantSpec | None = None, options: AWQOptions | None = None,
              calibration: C.CalibSpec | None = None, progress: bool = True, **spec_kw) -> dict:
    """AWQ over a whole decoder, block by block (:func:`helpers.calib.sequential`), in place. ``spec``
    (or ``bits=``, ``group_size=``, ``symmetric=``) is the grid, ``options`` the algorithm's settings
    (default :class:`AWQOptions`), ``calibration`` how the pass runs (:class:`helpers.calib.CalibSpec`:
    its ``next_inputs="full_precision"`` calibrates each block on the full-precision outputs, as
    llm-awq does). The model's family (:func:`family_of`) must resolve against every block: checked
    before calibrating. Returns ``{"seconds", "calib_tokens", "search_dtype", "alphas": {layer: {mapping: α}}}``."""
    spec = QuantSpec.of(spec, **spec_kw)
    options = AWQOptions() if options is None else options
    if not isinstance(options, AWQOptions):
        raise TypeError(f"options must be an AWQOptions, got {type(options).__name__}")
    C.check_calib(model, calib)
    for name, lin in quantizable_linears(model).items():
        check_finite(lin.weight.data, f"{name}.weight")
    family = family_of(model)
    for block in decoder_layers(model):
        family.resolve(block)
    options = dataclasses.replace(options, search_dtype=options.search_dtype or
                                  default_search_dtype(next(model.parameters())))
    t0 = time.perf_counter()
    recs = C.sequential(model, calib, lambda i, b, h, k: awq_block(b, h, k, spec, options, family), calibration,
                        desc=f"AWQ {spec.label}", progress=progress)
    return {"seconds": time.perf_counter() - t0, "calib_tokens": C.tokens_of(calib),
            "search_dtype": str(options.search_dtype).replace("torch.", ""),
            "alphas": {f"model.layers.{i}": r for i, r in enumerate(recs)}}
