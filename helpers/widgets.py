"""Interactive widgets: move seq_len and batch, see predicted (and on CUDA, measured) memory."""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from . import budget, device, measure, models, plots
from .device import has_cuda


def budget_point(arch: str, seq_len: int, batch: int, dtype: str = "bf16", kv_dtype: str = "bf16",
                 new_tokens: int = 16, measure_on_device: bool | None = None, run_anyway: bool = False,
                 _cache: dict = {}) -> dict:
    """Predicted parts for one point and, on CUDA, the measured peak of a real ``generate``.

    A point that does not fit is reported, not raised: ``{"oom": "predicted"}`` when the prediction
    exceeds free memory (nothing is run), ``{"oom": "observed", ...}`` when the real run hit
    ``torch.OutOfMemoryError`` (caught; memory returns to where it was). ``run_anyway`` skips the
    prediction check, to watch a real OOM happen and be caught."""
    cfg = models.architecture_config(arch)
    parts = budget.budget(cfg, dtype, seq_len, batch, kv_dtype, new_tokens=new_tokens)
    out = {"parts": parts, "measured_peak": None, "oom": None}
    measure_on_device = has_cuda() if measure_on_device is None else measure_on_device
    if not measure_on_device:
        return out
    if _cache.get("arch") != arch:
        _cache.clear()
        measure.free_memory()
        _cache["model"], _cache["weights"] = measure.measure_weights(arch)
        _cache["arch"] = arch
    room = device.free_bytes()
    if parts["total"] - parts["weights"] > room and not run_anyway:
        out["oom"] = "predicted"
        return out
    before = torch.cuda.memory_allocated()
    r = measure.oom_guard(measure.measure_generate, _cache["model"], seq_len, batch, new_tokens)
    if r["ok"]:
        out["measured_peak"] = _cache["weights"] + r["result"]["peak_meas"]
    else:
        out["oom"] = "observed"
        out["allocated_back_to_start"] = torch.cuda.memory_allocated() == before
    return out


def budget_widget(archs=("SmolLM2-135M", "Qwen2.5-0.5B", "TinyLlama-1.1B")):
    """Sliders for seq_len, batch, model, weight dtype and KV dtype, drawing a stacked bar."""
    import ipywidgets as W

    def draw(arch, seq_len, batch, dtype, kv_dtype):
        p = budget_point(arch, seq_len, batch, dtype, kv_dtype,
                         measure_on_device=has_cuda() and dtype == "bf16" and kv_dtype == "bf16")
        ax = plots.budget_bars([p["parts"]], [f"{arch}\n{seq_len}×{batch}"],
                               measured=[p["measured_peak"]], title="predicted parts vs measured peak")
        if p["oom"]:
            ax.set_title(f"OOM ({p['oom']}) at seq {seq_len} × batch {batch}", color="red")
        plt.show()
        print({k: f"{v / 2**30:.3f} GiB" for k, v in p["parts"].items()},
              "measured peak:", None if p["measured_peak"] is None else f"{p['measured_peak'] / 2**30:.3f} GiB")

    return W.interactive(draw, arch=list(archs),
                         seq_len=W.IntSlider(value=2048, min=128, max=32768, step=128),
                         batch=W.IntSlider(value=1, min=1, max=64),
                         dtype=["bf16", "fp32", "int8", "int4"], kv_dtype=["bf16", "fp8", "int4"])
