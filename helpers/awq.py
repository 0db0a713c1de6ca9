"""AWQ: activation-aware weight quantization (Lin et al. 2024, arXiv:2306.00978), step by step.

Observation (paper §3.1): a few *input channels* of a linear layer see much larger activations than
the rest; their weights matter most. Keeping 1 % of them in FP16 recovers most of the loss, but mixed
precision is awkward; instead AWQ multiplies those weight columns by a scale ``s > 1`` before
quantization and divides the activation by ``s`` (folded into the previous op), which shrinks their
relative rounding error (§3.2). Per input channel ``j``:

    s_j = s_x,j ^ α          (s_x,j = mean |x_j| over the calibration tokens)

normalised by ``sqrt(max(s) · min(s))``, with ``α ∈ [0, 1)`` chosen on a 20-point grid to minimise the
output error of the block part that reads those layers, ``‖f(W, X) − f(Q(W·diag(s)), diag(s)⁻¹·X)‖²``.
(``duo_scaling`` divides by the weight magnitude too, ``s_j = s_x,j^α / s_w,j^(1−α)``: what AutoAWQ
later added and llm-compressor does by default.) The scales are folded into the previous RMSNorm or
linear, so the unquantized network computes the same function. Then ``auto_clip`` shrinks each
group's max on a grid to minimise the layer's output error (q/k projections are skipped: their error
is amplified by the softmax, as the reference notes). Mappings for Llama/Qwen2-style blocks (the
reference's ``awq/models/llama.py``): input_layernorm → q,k,v (inspect self_attn); v_proj → o_proj
only when their shapes allow (MHA; not GQA); post_attention_layernorm → gate,up (inspect mlp);
up_proj → down_proj.
"""
from __future__ import annotations

import copy
import time

import torch

from . import calib as C
from .device import cpu_has_bf16
from .qspec import QuantSpec, positive_int
from .quant import check_finite, quantizable_linears, rtn


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
    """Indices of the ``fraction`` most salient input channels: by activation magnitude (AWQ), by
    weight magnitude (column L2 norm… the paper uses the mean |w|), or at random (Table 1)."""
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


# ------------------------------------------------------------------------------ §3.2: the search
def mappings(block) -> list[dict]:
    """(previous op → linears it feeds, the module whose output is compared) for one block."""
    a, m = block.self_attn, block.mlp
    out = [dict(prev=block.input_layernorm, linears=[a.q_proj, a.k_proj, a.v_proj], inspect="attn",
                input="self_attn.q_proj")]
    if a.v_proj.weight.shape == a.o_proj.weight.shape:  # MHA only: with GQA v's outputs ≠ o's inputs
        out.append(dict(prev=a.v_proj, linears=[a.o_proj], inspect="o", input="self_attn.o_proj"))
    out.append(dict(prev=block.post_attention_layernorm, linears=[m.gate_proj, m.up_proj], inspect="mlp",
                    input="mlp.gate_proj"))
    out.append(dict(prev=m.up_proj, linears=[m.down_proj], inspect="down", input="mlp.down_proj"))
    return out


def _inspect_fn(part, kind: str):
    """A function ``(x, kwargs) → output`` of the block part (self_attn or mlp) a mapping's error is measured on."""
    if kind == "attn":
        return lambda x, kw: part(hidden_states=x, **kw)[0]
    return lambda x, kw: part(x)


class InputStats:
    """What AWQ needs from one linear input over the whole calibration set, gathered one batch at a
    time (:meth:`add`) so the inputs themselves need not all be held: the per-channel mean ``|x|``
    (the ``s_x`` of eq. 5), the Gram matrix ``XᵀX`` when the inspected part is that linear alone
    (``gram``), the tokens the clip search reads (every ``N // n_sample``-th token, as
    :func:`search_clip` picks them from the concatenated inputs), and, when the inspected part is an
    attention or MLP that must be run again for each α, the inputs themselves (``keep``)."""

    def __init__(self, total_tokens: int, keep: bool = False, gram: bool = False, n_sample: int = 512):
        self.total, self.keep, self.n_sample = positive_int(total_tokens, "total_tokens"), keep, n_sample
        self.stride = max(1, self.total // n_sample)
        self.xs, self.sample, self.seen = [], [], 0
        self.abs_sum = self.G = None
        self.want_gram = gram

    @torch.no_grad()
    def add(self, x: torch.Tensor) -> None:
        flat = x.reshape(-1, x.shape[-1])
        f = flat.float()
        self.abs_sum = f.abs().sum(0) if self.abs_sum is None else self.abs_sum + f.abs().sum(0)
        if self.want_gram:
            self.G = f.t() @ f if self.G is None else self.G.addmm_(f.t(), f)
        del f
        first = (-self.seen) % self.stride                       # the first sampled token in this batch
        idx = torch.arange(first, len(flat), self.stride, device=flat.device)
        idx = idx[idx + self.seen < self.stride * self.n_sample]
        self.sample.append(flat[idx])
        if self.keep:
            self.xs.append(x)
        self.seen += len(flat)

    @classmethod
    def of(cls, xs: list, gram: bool = False) -> InputStats:
        """The statistics of inputs already captured (``xs``: one tensor per batch), kept."""
        st = cls(sum(x.numel() // x.shape[-1] for x in xs), keep=True, gram=gram)
        for x in xs:
            st.add(x)
        return st

    @property
    def x_mean(self) -> torch.Tensor:
        return self.abs_sum / self.seen

    @property
    def tokens(self) -> torch.Tensor:
        """The sampled tokens [≤ n_sample, features] for :func:`search_clip`."""
        return torch.cat(self.sample)


def default_search_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the α search runs its forward passes in: the weights' own, except fp32 weights on a
    CPU with bf16 matrix instructions (AVX512-BF16 / AMX), where bf16 matmuls run several times faster.
    The search only has to *rank* 20 candidates by output error, which bf16 does as a GPU run does;
    the folding, clipping and final rounding stay in the weights' dtype."""
    if weight.dtype == torch.float32 and weight.device.type == "cpu" and cpu_has_bf16():
        return torch.bfloat16
    return weight.dtype


@torch.no_grad()
def search_scale(block, mp: dict, xs, kwargs: list, spec: QuantSpec, n_grid: int = 20, duo_scaling: bool = False, search_dtype: torch.dtype | None = None) -> dict:
    """Grid search of α (paper eq. 5): returns ``{"alpha", "scales", "errors"}`` (errors per α).

    ``xs`` is the mapping's input, one tensor per calibration batch, or its :class:`InputStats`.
    When the inspected part is one linear (``o``, ``down``) its error is a quadratic form in the
    Gram matrix and no forward pass is needed; otherwise the attention or MLP part is run on every
    batch for each α. ``search_dtype`` (default :func:`default_search_dtype`) is the dtype of those
    forward passes; they run on a copy of that part in this dtype."""
    n_grid = positive_int(n_grid, "n_grid")
    linear_part = mp["inspect"] in ("o", "down")
    st = xs if isinstance(xs, InputStats) else InputStats.of(xs, gram=linear_part)
    if linear_part and not st.want_gram:
        raise ValueError(f"search_scale for the {mp['inspect']!r} mapping needs InputStats(gram=True)")
    if not linear_part and not st.keep:
        raise ValueError(f"search_scale for the {mp['inspect']!r} mapping needs the inputs: InputStats(keep=True)")
    if st.seen == 0:
        raise ValueError("search_scale got InputStats with no calibration inputs: call .add(x) per batch first")
    x_mean = st.x_mean
    if linear_part:  # the error of a linear is a quadratic form: ‖X Eᵀ‖² = tr(E XᵀX Eᵀ), E = Ŵ − W
        G, n_out = st.G, st.seen * mp["linears"][0].out_features
    else:
        part = block.self_attn if mp["inspect"] == "attn" else block.mlp
        dtype = search_dtype or default_search_dtype(mp["linears"][0].weight)
        names = {id(m): n for n, m in part.named_modules()}
        xs = st.xs
        if dtype != mp["linears"][0].weight.dtype:  # score on a copy in the search dtype
            part = copy.deepcopy(part).to(dtype)
            xs, kwargs = [x.to(dtype) for x in xs], [C.cast_floats(kw, dtype) for kw in kwargs]
        targets = [part.get_submodule(names[id(lin)]) for lin in mp["linears"]]
        f = _inspect_fn(part, mp["inspect"])
        ref = [f(x, kw) for x, kw in zip(xs, kwargs)]
        n_ref = sum(r.numel() for r in ref)
    originals = [lin.weight.data.clone() for lin in mp["linears"]]
    w_mean = None
    if duo_scaling:  # per-channel mean of |w| normalised within each group, as AutoAWQ/llm-compressor
        W = torch.cat(originals, 0).float()
        g = spec.group_for(W.shape[1])
        Wn = W.abs().reshape(W.shape[0], -1, g)
        w_mean = (Wn / Wn.amax(-1, keepdim=True).clamp(min=1e-8)).reshape(W.shape).mean(0)
        del W, Wn
    errors, best = [], (float("inf"), 0.0, None)
    for k in range(n_grid):
        alpha = k / n_grid
        s = x_mean.pow(alpha) / (w_mean.pow(1 - alpha) if duo_scaling else 1)
        s = s.clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        if linear_part:
            w = originals[0].float()
            E = rtn(w * s, spec) / s - w
            err = ((E @ G) * E).sum().item() / n_out
        else:
            for lin, w in zip(targets, originals):
                lin.weight.data.copy_((rtn(w.float() * s, spec) / s).to(lin.weight.dtype))
            # one batch at a time: only the reference outputs are held, not a second set
            err = sum((f(x, kw) - r).float().pow(2).sum().item() for x, kw, r in zip(xs, kwargs, ref)) / n_ref
        errors.append(err)
        if err < best[0]:
            best = (err, alpha, s.clone())
    for lin, w in zip(mp["linears"], originals):
        lin.weight.data.copy_(w)
    return {"alpha": best[1], "scales": best[2], "errors": errors}


@torch.no_grad()
def apply_scale(prev, linears: list, s: torch.Tensor) -> None:
    """Fold ``s``: ``prev``'s output channels ÷ s (norm weight, or linear rows and bias), the
    linears' input columns × s. The unquantized function is unchanged: ``(x/s)·(W·s)ᵀ = x·Wᵀ``."""
    s = s.to(prev.weight.device)
    if isinstance(prev, torch.nn.Linear):
        prev.weight.data.div_(s[:, None].to(prev.weight.dtype))
        if prev.bias is not None:
            prev.bias.data.div_(s.to(prev.bias.dtype))
    else:  # RMSNorm / LayerNorm: y = norm(x) · weight (+ bias)
        prev.weight.data.div_(s.to(prev.weight.dtype))
        if getattr(prev, "bias", None) is not None:
            prev.bias.data.div_(s.to(prev.bias.dtype))
    for lin in linears:
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


def block_input_stats(block, hidden: list, kwargs: list) -> dict[str, InputStats]:
    """One pass of the calibration set through ``block``, gathering each *distinct* linear input's
    :class:`InputStats` (q/k/v read one input, gate/up another): kept inputs where the α search runs
    the attention or MLP part again, the Gram matrix where it inspects one linear (o, down), the
    clip-search sample everywhere. Returns ``{linear name: stats}`` (linears sharing an input share
    one object)."""
    maps = mappings(block)
    total = sum(x.numel() // x.shape[-1] for x in hidden)
    first = {"self_attn.q_proj": maps[0], "self_attn.o_proj": None, "mlp.gate_proj": None, "mlp.down_proj": None}
    for mp in maps:
        first[mp["input"]] = mp
    stats = {n: InputStats(total, keep=mp is not None and mp["inspect"] in ("attn", "mlp"),
                           gram=mp is not None and mp["inspect"] in ("o", "down"))
             for n, mp in first.items()}
    C.watch_linears(block, hidden, kwargs, lambda n, x: stats[n].add(x), names=list(stats))
    readers = {"self_attn.q_proj": ("self_attn.k_proj", "self_attn.v_proj"), "mlp.gate_proj": ("mlp.up_proj",)}
    for n, others in readers.items():
        stats.update({o: stats[n] for o in others})
    return stats


@torch.no_grad()
def awq_block(block, hidden: list, kwargs: list, spec: QuantSpec, n_grid: int = 20, duo_scaling: bool = False, clip: bool = True, quantize: bool = True,
              search_dtype: torch.dtype | None = None) -> dict:
    """AWQ on one block, in place: gather each linear input's statistics in one pass, search and
    fold scales mapping by mapping, clip, then RTN every linear of the block. Returns the α chosen
    per mapping."""
    names = {id(m): n for n, m in C.linears(block).items()}
    stats = block_input_stats(block, hidden, kwargs)
    clip_x = {n: st.sample for n, st in stats.items()}        # the clip search's tokens, per linear
    alphas = {}
    for mp in mappings(block):
        r = search_scale(block, mp, stats[mp["input"]], kwargs, spec, n_grid, duo_scaling, search_dtype)
        stats[mp["input"]].xs = []          # the kept inputs are not needed again
        apply_scale(mp["prev"], mp["linears"], r["scales"])
        for lin in mp["linears"]:  # the inputs the scaled linears now receive are x / s
            n = names[id(lin)]
            clip_x[n] = [x / r["scales"].to(x.dtype) for x in clip_x[n]]
        alphas[mp["inspect"]] = r["alpha"]
    del stats
    if clip:
        for n, lin in C.linears(block).items():
            if n.endswith(("q_proj", "k_proj")):
                continue
            x = torch.cat(clip_x[n])
            apply_clip(lin, search_clip(lin.weight.data, x, spec), spec)
    if quantize:
        for lin in C.linears(block).values():
            lin.weight.data.copy_(rtn(lin.weight.data.float(), spec).to(lin.weight.dtype))
    return alphas


@torch.no_grad()
def awq_model(model, calib: torch.Tensor, spec: QuantSpec | None = None, n_grid: int = 20,
              duo_scaling: bool = False, clip: bool = True, batch_size: int = 8, progress: bool = True,
              search_dtype: torch.dtype | None = None, next_inputs: str = "quantized",
              offload: bool | str = "auto", **spec_kw) -> dict:
    """AWQ over a whole decoder, block by block, in place. ``next_inputs="quantized"`` (default)
    calibrates block k on the outputs of the already-quantized blocks before it; llm-awq calibrates
    on the full-precision outputs instead (``"full_precision"``, see :func:`helpers.calib.sequential`).
    ``spec`` (or ``bits=``, ``group_size=``, ``symmetric=``) is the grid; ``offload`` keeps the
    block inputs on the CPU between blocks (default: when the model is on a GPU).
    Returns ``{"seconds", "calib_tokens", "search_dtype", "alphas": {layer: {mapping: α}}}``."""
    spec = QuantSpec.of(spec, **spec_kw)
    C.check_calib(model, calib)
    for name, lin in quantizable_linears(model).items():
        check_finite(lin.weight.data, f"{name}.weight")
    dtype = search_dtype or default_search_dtype(next(model.parameters()))
    t0 = time.perf_counter()
    recs = C.sequential(model, calib, lambda i, b, h, k: awq_block(b, h, k, spec, n_grid, duo_scaling, clip,
                                                                   search_dtype=dtype),
                        desc=f"AWQ {spec.label}", batch_size=batch_size, progress=progress,
                        next_inputs=next_inputs, offload=offload)
    return {"seconds": time.perf_counter() - t0, "calib_tokens": C.tokens_of(calib),
            "search_dtype": str(dtype).replace("torch.", ""), "alphas": {f"model.layers.{i}": r for i, r in enumerate(recs)}}
