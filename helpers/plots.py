"""Plots the notebooks share: budget bars, allocator segments, memory timelines, stage profiles."""
from __future__ import annotations

import matplotlib.pyplot as plt

from .units import GiB, MiB

COLORS = {"weights": "#4C72B0", "kv_cache": "#DD8452", "activations": "#55A868", "overhead": "#8172B3"}


def budget_bars(rows: list[dict], labels: list[str], measured: list[float | None] | None = None, ax=None,
                unit: float = GiB, title: str = "Predicted memory"):
    """Stacked bars of weights / KV / activations / overhead per row; optional measured peaks (dots)."""
    ax = ax or plt.subplots(figsize=(max(4, 1.2 * len(rows)), 3.5))[1]
    bottom = [0.0] * len(rows)
    for part in ("weights", "kv_cache", "activations", "overhead"):
        vals = [r.get(part, 0) / unit for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=part, color=COLORS[part])
        bottom = [b + v for b, v in zip(bottom, vals)]
    if measured:
        xs = [i for i, m in enumerate(measured) if m is not None]
        ax.scatter(xs, [measured[i] / unit for i in xs], color="black", zorder=3, label="measured peak")
    ax.set_ylabel("GiB" if unit == GiB else f"× {unit:g} B")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax


def segments(snapshot: list[dict], ax=None, title: str = "allocator segments", unit: float = MiB):
    """Draw segments (rows) and their blocks (allocated = filled, free = hatched) from a
    ``torch.cuda.memory_snapshot()`` or the simulator's ``snapshot()``."""
    snapshot = [s for s in snapshot if s["total_size"] > 0]
    ax = ax or plt.subplots(figsize=(8, 0.45 * max(2, len(snapshot)) + 1))[1]
    for row, seg in enumerate(snapshot):
        x = 0
        for blk in seg["blocks"]:
            used = blk["state"].startswith("active")
            ax.barh(row, blk["size"] / unit, left=x / unit, height=0.7,
                    color="#C44E52" if used else "white", edgecolor="black", hatch=None if used else "//")
            x += blk["size"]
    ax.set_yticks(range(len(snapshot)))
    ax.set_yticklabels([f"{s['segment_type']} {s['total_size'] / unit:.0f} MiB" for s in snapshot], fontsize=7)
    ax.set_xlabel("offset in segment (MiB)")
    ax.set_title(title)
    ax.invert_yaxis()
    return ax


def timeline(history: dict, ax=None, title: str = "memory over allocator events"):
    """Allocated bytes after each alloc/free event of ``torch.cuda.memory._snapshot()``'s trace."""
    ax = ax or plt.subplots(figsize=(8, 3))[1]
    trace = [e for dev in history.get("device_traces", []) for e in dev]
    level, ys = 0, []
    for e in trace:
        if e["action"] == "alloc":
            level += e["size"]
        elif e["action"] in ("free_completed",):
            level -= e["size"]
        else:
            continue
        ys.append(level / GiB)
    ax.plot(ys)
    ax.set_xlabel("allocator event")
    ax.set_ylabel("allocated (GiB, relative to start)")
    ax.set_title(title)
    return ax


def stages(table: list[dict], ax=None, unit: float = GiB):
    """Peak-over-start and delta per stage of a :class:`helpers.measure.StageProfiler`."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    names = [r["stage"] for r in table]
    ax.bar(names, [r["peak_over_start"] / unit for r in table], label="peak over start", color="#DD8452")
    ax.bar(names, [r["delta"] / unit for r in table], label="kept (delta)", color="#4C72B0", width=0.5)
    ax.set_ylabel("GiB")
    ax.legend(fontsize=8)
    return ax


def memory_lines(series: dict, ax=None, cap: float | None = None, unit: float = GiB, xlabel: str = "step",
                 title: str = "memory over time"):
    """One line per ``label → list of bytes`` (memory after each step), and the cap as a dashed line."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    for label, ys in series.items():
        ax.plot(range(len(ys)), [y / unit for y in ys], label=label)
    if cap is not None:
        ax.axhline(cap / unit, color="red", linestyle="--", linewidth=1, label="cap")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("GiB" if unit == GiB else "MiB" if unit == MiB else f"× {unit:g} B")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax
