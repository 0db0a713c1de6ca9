"""Interactive widgets: move seq_len and batch, see predicted (and on CUDA, measured) memory; an
allocator playground (allocations and frees → segments and blocks).

A :class:`BudgetExplorer` owns the model it measures (one architecture at a time), so nothing is
cached at module level: make one per notebook, drop it to free the GPU.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from . import budget, device, generation, measure, models, plots
from .device import has_cuda

GiB = 1024**3


class BudgetExplorer:
    """Predicts one (arch, seq_len, batch) point and, on CUDA, measures it on a model it keeps."""

    def __init__(self):
        self.arch, self.model, self.weights = None, None, None

    def _load(self, arch: str) -> None:
        if self.arch != arch:
            self.model = None
            measure.free_memory()
            self.model, self.weights = generation.measure_weights(arch)
            self.arch = arch

    def point(self, arch: str, seq_len: int, batch: int, dtype: str = "bf16", kv_dtype: str = "bf16",
              new_tokens: int = 16, measure_on_device: bool | None = None, run_anyway: bool = False) -> dict:
        return budget_point(arch, seq_len, batch, dtype, kv_dtype, new_tokens, measure_on_device,
                            run_anyway, explorer=self)


def budget_point(arch: str, seq_len: int, batch: int, dtype: str = "bf16", kv_dtype: str = "bf16",
                 new_tokens: int = 16, measure_on_device: bool | None = None, run_anyway: bool = False,
                 explorer: BudgetExplorer | None = None) -> dict:
    """Predicted parts for one point and, on CUDA, the measured peak of a real ``generate``.

    A point that does not fit is reported, not raised: ``{"oom": "predicted"}`` when the prediction
    exceeds free memory (nothing is run), ``{"oom": "observed", ...}`` when the real run hit
    ``torch.OutOfMemoryError`` (caught; memory returns to where it was). ``run_anyway`` skips the
    prediction check, to watch a real OOM happen and be caught. ``explorer`` keeps the measured
    model between calls (a fresh one is made, and dropped, otherwise)."""
    cfg = models.architecture_config(arch)
    parts = budget.budget(cfg, dtype, seq_len, batch, kv_dtype, new_tokens=new_tokens)
    out = {"parts": parts, "measured_peak": None, "oom": None}
    measure_on_device = has_cuda() if measure_on_device is None else measure_on_device
    if not measure_on_device:
        out["note"] = "prediction only: no CUDA device here to measure on"
        return out
    explorer = explorer or BudgetExplorer()
    explorer._load(arch)
    room = device.free_bytes()
    if parts["total"] - parts["weights"] > room and not run_anyway:
        out["oom"] = "predicted"
        return out
    before = torch.cuda.memory_allocated()
    r = measure.oom_guard(generation.measure_generate, explorer.model, seq_len, batch, new_tokens)
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
        p = explorer.point(arch, seq_len, batch, dtype, kv_dtype,
                           measure_on_device=has_cuda() and dtype == "bf16" and kv_dtype == "bf16")
        ax = plots.budget_bars([p["parts"]], [f"{arch}\n{seq_len}×{batch}"],
                               measured=[p["measured_peak"]], title="predicted parts vs measured peak")
        if p["oom"]:
            ax.set_title(f"OOM ({p['oom']}) at seq {seq_len} × batch {batch}", color="red")
        plt.show()
        print(f"{arch}, seq_len {seq_len} × batch {batch}, weights {dtype}, KV {kv_dtype}:")
        print({k: (f"{v / GiB:.3f} GiB" if k != "overhead" or has_cuda() else "measured on a GPU only")
               for k, v in p["parts"].items()})
        print("measured peak:", f"{p['measured_peak'] / GiB:.3f} GiB" if p["measured_peak"] is not None
              else "not measured: " + p.get("note", "this setting is predicted only (bf16/bf16 is measured)"))

    return W.interactive(draw, arch=list(archs),
                         seq_len=W.IntSlider(value=2048, min=128, max=32768, step=128, continuous_update=False),
                         batch=W.IntSlider(value=1, min=1, max=64, continuous_update=False),
                         dtype=["bf16", "fp32", "int8", "int4"], kv_dtype=["bf16", "fp8", "int4"])


def kv_formats(arch: str, seq_len: int, batch: int) -> dict:
    """Bytes of the KV cache at ``seq_len × batch`` in each format the course stores, with their
    scales and minimums (:func:`helpers.budget.kv_bytes`)."""
    c = models.architecture_config(arch)
    return {"bf16": budget.kv_bytes(c, seq_len, batch, "bf16"), "fp8": budget.kv_bytes(c, seq_len, batch, "fp8"),
            "int4 (g64)": budget.kv_bytes(c, seq_len, batch, "int4")}


def kv_widget(archs=tuple(models.ARCHITECTURES)):
    """Sliders for context and batch: the KV cache's bytes per format, as a bar chart (predicted)."""
    import ipywidgets as W  # optional (the course extra): only the interactive views need it

    def draw(arch, seq_len, batch):
        vals = kv_formats(arch, seq_len, batch)
        plt.bar(list(vals), [v / GiB for v in vals.values()])
        plt.ylabel("GiB")
        plt.title(f"{arch} KV @ {seq_len}×{batch} (predicted from the config)")
        plt.show()
        print(f"{arch}, seq_len {seq_len} × batch {batch} — predicted from the config (formulas; nothing runs): "
              + ", ".join(f"{k} {v / GiB:.3f} GiB" for k, v in vals.items()))

    return W.interactive(draw, arch=list(archs),
                         seq_len=W.IntSlider(value=4096, min=256, max=131072, step=256, continuous_update=False),
                         batch=W.IntSlider(value=8, min=1, max=128, continuous_update=False))


def allocator_run(ops_text: str, cap_mib: float | None = None, expandable: bool = False,
                  on_device: bool | None = None) -> dict:
    """One run of the allocator playground: the ops (:func:`helpers.allocator_sim.parse_ops`) in the
    simulator and, on a CUDA machine, on the real allocator (a fresh process). Returns
    ``{"sim": …, "real": … or None, "note": …}``."""
    from . import allocator_sim

    ops = allocator_sim.parse_ops(ops_text)
    cap = None if cap_mib in (None, 0) else int(cap_mib * allocator_sim.MB)
    on_device = has_cuda() if on_device is None else on_device
    out = {"sim": allocator_sim.simulate(ops, cap, expandable), "real": None,
           "note": "the real allocator, in a fresh process, next to the simulator" if on_device else
           "no CUDA device here: the simulator only (it predicts; notebook 02 shows where it agrees with the GPU)"}
    if on_device:
        out["real"] = allocator_sim.run_real(ops, cap, expandable)
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
                plots.segments(res["snapshot"], ax=ax, title=f"{name}: allocated {res['allocated'] / 2**20:.0f} MiB, "
                               f"reserved {res['reserved'] / 2**20:.0f} MiB" + (" — OOM at op "
                               f"{res['failed_at'] + 1}" if res["oom"] else ""))
            plt.tight_layout()
            plt.show()

    button.on_click(draw)
    draw()
    return W.VBox([text, W.HBox([cap, expandable, button]), out])
