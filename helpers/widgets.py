"""Interactive widgets: move seq_len and batch, see predicted (and on CUDA, measured) memory; an
allocator playground (allocations and frees → segments and blocks).

A :class:`BudgetExplorer` owns the model it measures (one architecture at a time), so nothing is
cached at module level: make one per notebook, drop it to free the GPU.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from . import budget, device, generation, measure, models, plots
from . import validate as v
from .device import has_cuda
from .qspec import allowed_group_sizes
from .units import GiB, MiB

# the KV formats of the widget and the caches that store them on the device (helpers.kvcache)
KV_CACHE_KIND = {"bf16": "baseline", "fp8": "fp8-e4m3", "int4": "int4"}
# weight formats a real model can be built in: int4 is the course's packed W4 layer (notebook 08)
MEASURED_WEIGHTS = ("bf16", "fp32", "int4")


class BudgetExplorer:
    """Predicts one (arch, seq_len, batch) point and, on CUDA, measures it on a model it keeps (one
    architecture and weight format at a time)."""

    def __init__(self):
        self.key, self.model, self.weights = None, None, None

    def _load(self, arch: str, dtype: str = "bf16") -> None:
        if self.key != (arch, dtype):
            self.model = None
            measure.free_memory()
            self.model, self.weights = load_measured(arch, dtype)
            self.key = (arch, dtype)

    def point(self, arch: str, seq_len: int, batch: int, dtype: str = "bf16", kv_dtype: str = "bf16",
              new_tokens: int = 16, measure_on_device: bool | None = None, run_anyway: bool = False) -> dict:
        return budget_point(arch, seq_len, batch, dtype, kv_dtype, new_tokens, measure_on_device,
                            run_anyway, explorer=self)


def int4_format(config) -> tuple[str, int]:
    """The budget's int4 format name and group size the course's W4 layer can use for this model: g128
    where every linear's input width allows it (:func:`helpers.qspec.allowed_group_sizes`), else g64
    (SmolLM2's 576), as notebook 03 teaches."""
    s = budget.Shape.from_config(config)
    widths = {s.hidden, s.intermediate, s.heads * s.head_dim}
    for fmt, g in (("int4", 128), ("int4-g64", 64)):
        if all(g in allowed_group_sizes(w) for w in widths):
            return fmt, g
    raise ValueError(f"no int4 group size (128 or 64) divides the input widths {sorted(widths)} of this model")


def load_measured(arch: str, dtype: str = "bf16"):
    """``(model, weight bytes it added to allocated)`` on the GPU (:func:`helpers.generation.measure_weights`).
    ``dtype`` bf16 or fp32: the architecture in that dtype; ``"int4"``: bf16, then every ``nn.Linear``
    but ``lm_head`` replaced by the course's packed :class:`~helpers.w4_linear.W4Linear` (group size
    from :func:`int4_format`, fp16 scale and zero per group: 4.25 bits per weight at g128, where the
    budget counts a 4-bit zero: 4.16)."""
    if dtype not in MEASURED_WEIGHTS:
        raise ValueError(f"dtype {dtype!r} cannot be built to measure; measured formats: {MEASURED_WEIGHTS}")
    prepare = None
    if dtype == "int4":
        from . import w4_linear  # imported when used: it imports Triton

        def prepare(model):
            w4_linear.swap_linears(model, int4_format(model.config)[1])
    return generation.measure_weights(arch, dtype=torch.float32 if dtype == "fp32" else torch.bfloat16,
                                      prepare=prepare)


def budget_point(arch: str, seq_len: int, batch: int, dtype: str = "bf16", kv_dtype: str = "bf16",
                 new_tokens: int = 16, measure_on_device: bool | None = None, run_anyway: bool = False,
                 explorer: BudgetExplorer | None = None) -> dict:
    """Predicted parts for one point and, on CUDA, the measured peak of a real ``generate`` with the
    weights in ``dtype`` (:data:`MEASURED_WEIGHTS`) and the KV cache in ``kv_dtype``
    (:data:`KV_CACHE_KIND`: the course's fp8 and int4 caches).

    A point that does not fit is reported, not raised: ``{"oom": "predicted"}`` when the prediction
    exceeds free memory (nothing is run), ``{"oom": "observed", ...}`` when the real run hit
    ``torch.OutOfMemoryError`` (caught; memory returns to where it was). ``run_anyway`` skips the
    prediction check, to watch a real OOM happen and be caught. ``explorer`` keeps the measured
    model between calls (a fresh one is made, and dropped, otherwise). ``note`` says in words when
    the point is predicted only."""
    if kv_dtype not in KV_CACHE_KIND:
        raise ValueError(f"kv_dtype must be one of {sorted(KV_CACHE_KIND)}, got {kv_dtype!r}")
    cfg = models.architecture_config(arch)
    fmt = int4_format(cfg)[0] if dtype == "int4" else dtype     # the group size the W4 layer will use
    parts = budget.budget(cfg, fmt, seq_len, batch, kv_dtype, new_tokens=new_tokens)
    out = {"parts": parts, "weight_format": fmt, "measured_peak": None, "measured_weights": None, "oom": None}
    measure_on_device = has_cuda() if measure_on_device is None else v.flag(measure_on_device, "measure_on_device")
    run_anyway = v.flag(run_anyway, "run_anyway")
    if not measure_on_device:
        out["note"] = "prediction only: no CUDA device here to measure on"
        return out
    if dtype not in MEASURED_WEIGHTS:
        out["note"] = f"prediction only: the course has no {dtype} layer to run (measured: {', '.join(MEASURED_WEIGHTS)})"
        return out
    explorer = explorer or BudgetExplorer()
    explorer._load(arch, dtype)
    out["measured_weights"] = explorer.weights
    room = device.free_bytes()
    if parts["total"] - parts["weights"] > room and not run_anyway:
        out["oom"] = "predicted"
        return out
    before = torch.cuda.memory_allocated()
    r = measure.oom_guard(generation.measure_generate, explorer.model, seq_len, batch, new_tokens,
                          cache=KV_CACHE_KIND[kv_dtype])
    if r["ok"]:
        out["measured_peak"] = explorer.weights + r["result"]["peak_meas"]
    else:
        out["oom"] = "observed"
        out["allocated_back_to_start"] = torch.cuda.memory_allocated() == before
    return out


def budget_widget(archs=("SmolLM2-135M", "Qwen2.5-0.5B", "TinyLlama-1.1B")):
    """Sliders for seq_len, batch, model, weight dtype and KV dtype, drawing a stacked bar."""
    import ipywidgets as W  # optional (the course extra): only the interactive views need it

    explorer = BudgetExplorer()

    def draw(arch, seq_len, batch, dtype, kv_dtype):
        p = explorer.point(arch, seq_len, batch, dtype, kv_dtype)
        ax = plots.budget_bars([p["parts"]], [f"{arch}\n{seq_len}×{batch}"],
                               measured=[p["measured_peak"]], title="predicted parts vs measured peak")
        if p["oom"]:
            ax.set_title(f"OOM ({p['oom']}) at seq {seq_len} × batch {batch}", color="red")
        plt.show()
        print(f"{arch}, seq_len {seq_len} × batch {batch}, weights {p['weight_format']}, KV {kv_dtype}:")
        print({k: (f"{v / GiB:.3f} GiB" if k != "overhead" or has_cuda() else "measured on a GPU only")
               for k, v in p["parts"].items()})
        if p["measured_weights"] is not None:
            print(f"measured weights: {p['measured_weights'] / GiB:.3f} GiB (predicted {p['parts']['weights'] / GiB:.3f})")
        print("measured peak:", f"{p['measured_peak'] / GiB:.3f} GiB" if p["measured_peak"] is not None
              else p.get("note") or f"not measured (OOM: {p['oom']})")

    return W.interactive(draw, arch=list(archs),
                         seq_len=W.IntSlider(value=2048, min=128, max=32768, step=128, continuous_update=False),
                         batch=W.IntSlider(value=1, min=1, max=64, continuous_update=False),
                         dtype=["bf16", "fp32", "int8", "int4"], kv_dtype=["bf16", "fp8", "int4"])


def kv_formats(arch, seq_len: int, batch: int) -> dict:
    """Bytes of the KV cache at ``seq_len × batch`` in each format the course stores, with their
    scales and minimums (:func:`helpers.budget.kv_bytes`); NaN where the course's caches cannot store
    that format for this model (an MLA latent cache in fp8/int4). ``arch``: a name or a config."""
    c = models.architecture_config(arch) if isinstance(arch, str) else v.model_config(arch, "arch")
    seq_len, batch = v.positive_int(seq_len, "seq_len"), v.positive_int(batch, "batch")
    out = {"bf16": budget.kv_bytes(c, seq_len, batch, "bf16")}     # a bad config or size fails here, clearly
    for label, fmt in (("fp8", "fp8"), ("int4 (g64)", "int4")):
        try:
            out[label] = budget.kv_bytes(c, seq_len, batch, fmt)
        except ValueError:        # a format the course's caches cannot store for this model (MLA latents)
            out[label] = float("nan")
    return out


KV_POINT_ROOM = 64   # kv_point's default room under the cap: bf16 KV tokens beyond the baseline prefill's peak


def kv_point(model, seq_len: int, batch: int, new_tokens: int = 16, extra: int = KV_POINT_ROOM, max_new: int | None = None,
             kinds=("baseline", "fp8-e4m3", "int4")) -> dict:
    """Measured on the GPU, per KV format: the peak of a ``generate`` at ``seq_len × batch`` (over the
    weights), and how many tokens it decodes before running out of memory under one cap for all
    (:func:`helpers.generation.oom_points`: the baseline prefill's reserved peak plus the bf16 KV of
    ``extra`` tokens), up to ``max_new``. The room for decoding is ``extra`` tokens plus what the
    prefill's freed activations held — for a decoder, less than ``seq_len`` tokens' worth of KV — so the
    default ``max_new = extra + seq_len`` lets the baseline reach its OOM. A run that cannot even
    prefill is reported with 0 tokens."""
    seq_len, batch = v.positive_int(seq_len, "seq_len"), v.positive_int(batch, "batch")
    new_tokens = v.positive_int(new_tokens, "new_tokens")
    extra = v.non_negative_int(extra, "extra", "bf16 KV tokens of room under the cap")
    max_new = extra + seq_len if max_new is None else v.positive_int(max_new, "max_new")
    if not has_cuda():
        raise RuntimeError("kv_point measures on a CUDA device; without one, kv_formats(...) predicts the bytes")
    oom = generation.oom_points(model, batch, seq_len, extra, max_new, kinds)
    rows = []
    for kind, o in zip(kinds, oom["rows"]):
        r = measure.oom_guard(generation.measure_generate, model, seq_len, batch, new_tokens, cache=kind)
        rows.append({"kv": kind, "peak": r["result"]["peak_meas"] if r["ok"] else None,
                     "tokens_before_oom": o["generated"], "ran_out": o["oom"]})
    return {"cap_gib": oom["cap_gib"], "rows": rows}


def kv_widget(archs=tuple(models.ARCHITECTURES), model=None):
    """Sliders for context and batch: the KV cache's bytes per format (predicted, as a bar chart) and,
    with ``model`` on a CUDA device and **measure** ticked, per format the measured peak and the tokens
    decoded before an OOM under one cap (:func:`kv_point`; it starts unticked: a measurement is one
    decode step per token, minutes at long contexts)."""
    import ipywidgets as W  # optional (the course extra): only the interactive views need it

    measuring = model is not None and has_cuda()

    def draw(arch, seq_len, batch, measure=False):
        cfg = model.config if measuring else models.architecture_config(arch)
        vals = kv_formats(cfg, seq_len, batch)
        plt.bar(list(vals), [v / GiB for v in vals.values()])
        plt.ylabel("GiB")
        plt.title(f"{arch} KV @ {seq_len}×{batch} (predicted from the config)")
        plt.show()
        print(f"{arch}, seq_len {seq_len} × batch {batch} — predicted: "
              + ", ".join(f"{k} {v / GiB:.3f} GiB" if v == v else f"{k} n/a (not stored for this model)"
                          for k, v in vals.items()))
        if not measuring:
            print("Predicted only: " + ("no CUDA device here, nothing runs." if model is None or not has_cuda()
                                        else "pass the notebook's model to measure."))
            return
        if not measure:
            print(f"Tick 'measure' to run it on this GPU: three generates and three OOM hunts of up to {seq_len + KV_POINT_ROOM}"
                  " tokens, one decode step each.")
            return
        m = kv_point(model, seq_len, batch)
        print(f"measured on this GPU (cap {m['cap_gib']:.2f} GiB for the OOM point):")
        for r in m["rows"]:
            peak = f"{r['peak'] / GiB:.3f} GiB" if r["peak"] is not None else "OOM"
            print(f"  {r['kv']:<10} peak over the weights {peak:>12}; decoded {r['tokens_before_oom']} tokens"
                  + (" before running out" if r["ran_out"] else " (no OOM)"))

    arch = W.fixed(archs[0] if len(archs) == 1 else "this model") if measuring else list(archs)
    return W.interactive(draw, arch=arch,
                         seq_len=W.IntSlider(value=4096 if not measuring else 1024, min=256, max=131072, step=256,
                                             continuous_update=False),
                         batch=W.IntSlider(value=8, min=1, max=128, continuous_update=False),
                         measure=W.Checkbox(value=False, description="measure") if measuring else W.fixed(False))


def allocator_run(ops_text: str, cap_mib: float | None = None, expandable: bool = False,
                  on_device: bool | None = None) -> dict:
    """One run of the allocator playground: the ops (:func:`helpers.allocator_ops.parse_ops`) in the
    simulator and, on a CUDA machine, on the real allocator (a fresh process). Returns
    ``{"sim": …, "real": … or None, "note": …}``."""
    from . import allocator_ops, allocator_replay, allocator_sim

    ops = allocator_ops.parse_ops(ops_text)
    if cap_mib is not None:
        cap_mib = v.non_negative_number(cap_mib, "cap_mib", "0 or None: no cap")
    cap = None if cap_mib in (None, 0) else int(cap_mib * MiB)
    expandable = v.flag(expandable, "expandable")
    on_device = has_cuda() if on_device is None else v.flag(on_device, "on_device")
    out = {"sim": allocator_sim.simulate(ops, cap, expandable), "real": None,
           "note": "the real allocator, in a fresh process, next to the simulator" if on_device else
           "no CUDA device here: the simulator only (it predicts; notebook 02 shows where it agrees with the GPU)"}
    if on_device:
        out["real"] = allocator_replay.run_real(ops, cap, expandable)
    return out


def allocator_playground(ops_text: str = "a=300MiB; b=20MiB; c=300MiB; free a; d=310MiB"):
    """Type allocations and frees, see segments and blocks: the simulator everywhere, the real
    allocator beside it on a GPU. One run per click of "run" (nothing runs while typing)."""
    import ipywidgets as W  # optional (the course extra): only the interactive views need it

    text = W.Text(value=ops_text, description="ops", layout=W.Layout(width="90%"))
    cap = W.FloatText(value=0, description="cap MiB (0 = none)")
    expandable = W.Checkbox(value=False, description="expandable_segments")
    button, out = W.Button(description="run"), W.Output()

    def draw(_=None):
        out.clear_output(wait=True)
        with out:
            try:
                r = allocator_run(text.value, cap.value, expandable.value)
            except ValueError as e:
                print(e)
                return
            print(r["note"])
            runs = [("simulator", r["sim"])] + ([("real allocator", r["real"])] if r["real"] else [])
            fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 2.4), squeeze=False)
            for ax, (name, res) in zip(axes[0], runs):
                plots.segments(res["snapshot"], ax=ax, title=f"{name}: allocated {res['allocated'] / MiB:.0f} MiB, "
                               f"reserved {res['reserved'] / MiB:.0f} MiB" + (" — OOM at op "
                               f"{res['failed_at'] + 1}" if res["oom"] else ""))
            plt.tight_layout()
            plt.show()

    button.on_click(draw)
    draw()
    return W.VBox([text, W.HBox([cap, expandable, button]), out])
