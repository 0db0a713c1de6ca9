"""Measuring memory: the views, a stage profiler, the biggest tensors, and an OOM diagnosis.

The views of GPU memory (PyTorch docs, "CUDA semantics → memory management"; NVML reference):

1. ``torch.cuda.memory_allocated()`` — bytes in live tensors (rounded up to the allocator's blocks);
2. ``torch.cuda.memory_reserved()`` — bytes the caching allocator holds from the driver (allocated +
   cached free blocks);
3. NVML per process (``nvmlDeviceGetComputeRunningProcesses``, what ``nvidia-smi`` lists per pid) —
   this process's device memory: reserved + its CUDA context + library workspaces;
4. ``torch.cuda.mem_get_info()`` — the driver's free/total for the *whole device* (every process).

``process − reserved`` is this process's memory outside PyTorch (vLLM's "non-torch memory");
``device used − process`` is the other processes'. On a shared GPU the two differ by everything the
others hold, so the device's total is never read as this process's memory.
"""
from __future__ import annotations

import contextlib
import gc
import shutil
import time
import warnings
from dataclasses import dataclass, field

import psutil
import torch

from .device import memory_cap, process_gpu_bytes, process_memory
from .units import GiB, KiB, MiB


def views(device=None) -> dict:
    """The views of memory right now (bytes); on CPU, the process RSS only.

    ``allocated`` and ``reserved`` are this process's caching allocator; ``process`` is what the driver
    reports for *this process* (NVML by pid, what ``nvidia-smi`` lists per process: reserved + CUDA
    context + library workspaces), ``None`` where the driver reports no per-process memory;
    ``device_used`` / ``device_free`` / ``device_total`` are the whole device (``mem_get_info``: every
    process on it). ``non_torch = process − reserved`` (vLLM's "non-torch memory") and
    ``others = device_used − process`` follow from them, ``None`` where ``process`` is unknown — the
    device total is never substituted for this process's memory. ``process_source`` says where
    ``process`` came from, or why it is missing."""
    if not torch.cuda.is_available():
        return {"rss": psutil.Process().memory_info().rss}
    idx = torch.cuda.current_device() if device is None else torch.device(device).index or 0
    free, total = torch.cuda.mem_get_info(idx)
    proc = process_memory(idx)
    out = {"allocated": torch.cuda.memory_allocated(idx), "reserved": torch.cuda.memory_reserved(idx),
           "process": proc.bytes, "device_used": total - free, "device_free": free, "device_total": total}
    out["non_torch"] = None if proc.bytes is None else proc.bytes - out["reserved"]
    out["others"] = None if proc.bytes is None else max(0, out["device_used"] - proc.bytes)
    out["process_source"] = proc.source
    return out


def show_views(v: dict | None = None) -> None:
    """Print :func:`views` one line each, bytes readable, and where this process's number came from."""
    v = views() if v is None else v
    for k, x in v.items():
        if k != "process_source":
            print(f"{k:>14}: {fmt_bytes(x)}")
    if "process_source" in v:
        print(f"{'process from':>14}: {v['process_source']}")


def overhead(device=None) -> dict:
    """Framework overhead of this process, measured now: ``context`` = this process's device memory
    outside PyTorch's allocator (NVML per process − reserved: the CUDA context, loaded kernels, library
    handles) and ``slack`` = reserved − allocated. ``context`` is None (with ``source`` saying why)
    where the driver reports no per-process memory: other processes' memory is never counted in."""
    v = views(device)
    if "allocated" not in v:
        return {"context": 0, "slack": 0, "source": "no CUDA device: overhead not measurable here"}
    return {"context": v["non_torch"], "slack": v["reserved"] - v["allocated"], "source": v["process_source"]}


def non_torch_bytes(device_index: int = 0) -> int | None:
    """This process's GPU memory outside PyTorch's caching allocator: what NVML reports for the process
    minus ``memory_reserved`` — the CUDA context, the kernels loaded so far, cuBLAS/cuDNN handles
    (vLLM's "non-torch memory"). It grows as new kernels load, so measure it after a warm-up that ran
    the kernels the workload will use. None without a GPU or per-process NVML."""
    if not torch.cuda.is_available():
        return None
    used = process_gpu_bytes(device_index)
    return None if used is None else used - torch.cuda.memory_reserved(device_index)


def fmt_bytes(n: float | None) -> str:
    """Human-readable bytes (binary units); ``"unavailable"`` for None (a number the driver does not report)."""
    if n is None:
        return "unavailable"
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def reset_peak(device=None) -> None:
    """Start a new peak window: ``max_memory_allocated`` (and ``max_memory_reserved``) restart from now."""
    if torch.cuda.is_available():
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


class PeakMeter:
    """The CUDA allocator's peak above a base: ``peak = max_memory_allocated() − base``.

    ``base`` is ``memory_allocated()`` when the meter starts (after a synchronize and a reset of the
    peak statistics, PyTorch "CUDA semantics → memory management"), so the peak counts what the
    measured code allocated on top of what was already live. Use::

        with PeakMeter() as m:
            work()
        m.peak          # bytes; None without CUDA

    ``read()`` gives the peak so far, ``restart()`` opens a new window over the same base (per-call
    peaks inside one measurement). ``read_requested()`` is the same peak in the bytes the tensors
    asked for (``requested_bytes.all.peak``): ``memory_allocated`` counts whole blocks, and a large-pool
    block is not split when less than 1 MiB would remain (:func:`requested_bytes`), so the allocated
    peak can exceed the tensors' bytes by up to 1 MiB per tensor. Without CUDA every reading is None."""

    def __init__(self, device=None):
        self.device = device
        self.cuda = torch.cuda.is_available() and torch.device(device or "cuda").type == "cuda"
        self.base = None
        self.base_requested = None
        self.peak = None

    def __enter__(self) -> PeakMeter:
        if self.cuda:
            reset_peak(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            self.base_requested = requested_bytes(self.device)
        return self

    def read(self) -> int | None:
        if not self.cuda:
            return None
        return torch.cuda.max_memory_allocated(self.device) - self.base   # allocator statistics: host-side, no sync needed

    def read_requested(self) -> int | None:
        if not self.cuda:
            return None
        return torch.cuda.memory_stats(self.device).get("requested_bytes.all.peak", 0) - self.base_requested

    def restart(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.peak = self.read()


def requested_bytes(device=None) -> int:
    """Bytes the live CUDA tensors asked for (``requested_bytes.all.current`` of
    ``torch.cuda.memory_stats``). ``memory_allocated`` counts the allocator's *blocks* instead, and a
    block from the large pool (> 1 MiB) is not split when less than 1 MiB would remain (PyTorch
    ``CUDACachingAllocator``), so it can exceed the request by up to 1 MiB per tensor."""
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.memory_stats(device).get("requested_bytes.all.current", 0))


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes a module's own tensors hold: every distinct storage of its parameters and buffers counted
    once (tied weights and views once), ``Σ storage.nbytes()``. A tensor subclass (torchao's quantized
    weights) is counted by the inner tensors it is made of (``__tensor_flatten__``: packed codes,
    scales, zeros) — its ``numel · element_size`` and even its ``untyped_storage()`` report the dense
    weight's size. Other live tensors (inputs, earlier cells' results) are not counted, unlike
    ``memory_allocated()``."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    seen, total = set(), 0
    stack = list(module.parameters()) + list(module.buffers())
    while stack:
        t = stack.pop()
        if hasattr(type(t), "__tensor_flatten__"):      # a wrapper subclass: count what it wraps
            names, _ = t.__tensor_flatten__()
            stack.extend(inner for inner in (getattr(t, n) for n in names) if isinstance(inner, torch.Tensor))
            continue
        storage = t.untyped_storage()
        key = (storage.device, storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def free_memory() -> None:
    """Drop Python garbage and return cached blocks to the driver (what ``empty_cache`` can do)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@dataclass
class StageRecord:
    name: str
    seconds: float
    start_allocated: int
    end_allocated: int
    peak_allocated: int
    reserved: int
    backend: str

    @property
    def delta(self) -> int:
        return self.end_allocated - self.start_allocated

    @property
    def peak_over_start(self) -> int:
        return self.peak_allocated - self.start_allocated


@dataclass
class StageProfiler:
    """Records allocated / peak / reserved per named stage (load, warm-up, prefill, decode …).

    On CUDA: ``memory_allocated`` at entry and exit, ``max_memory_allocated`` within (the peak stats
    are reset at entry), ``memory_reserved`` at exit. On CPU: process RSS at entry/exit (the peak is
    the larger of the two — CPU allocations are not tracked by PyTorch), and ``backend='cpu-rss'``.
    """
    records: list[StageRecord] = field(default_factory=list)

    @contextlib.contextmanager
    def stage(self, name: str):
        meter, proc = PeakMeter(), psutil.Process()
        t0 = time.perf_counter()
        try:
            with meter:
                start = meter.base if meter.cuda else proc.memory_info().rss
                yield self
        finally:       # a stage that raised (an OOM) is recorded all the same
            if meter.cuda:
                end, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
                peak = start + meter.peak
            else:
                end = proc.memory_info().rss
                peak, reserved = max(start, end), end
            self.records.append(StageRecord(name, time.perf_counter() - t0, start, end, peak, reserved,
                                            "cuda" if meter.cuda else "cpu-rss"))

    def table(self) -> list[dict]:
        return [{"stage": r.name, "seconds": round(r.seconds, 3), "start": r.start_allocated,
                 "end": r.end_allocated, "delta": r.delta, "peak": r.peak_allocated,
                 "peak_over_start": r.peak_over_start, "reserved": r.reserved, "backend": r.backend}
                for r in self.records]

    def report(self) -> None:
        if self.records and self.records[0].backend == "cpu-rss":
            print("(CPU: numbers are process RSS — PyTorch tracks no CPU allocations; peaks are not seen)")
        print(f"{'stage':<12}{'seconds':>9}{'delta':>12}{'peak':>12}{'peak-start':>12}{'reserved':>12}")
        for r in self.records:
            print(f"{r.name:<12}{r.seconds:>9.2f}{fmt_bytes(r.delta):>12}{fmt_bytes(r.peak_allocated):>12}"
                  f"{fmt_bytes(r.peak_over_start):>12}{fmt_bytes(r.reserved):>12}")


def top_tensors(n: int = 10, device: str | None = None) -> list[dict]:
    """The ``n`` largest tensors alive (gc walk), one row per *storage* (views deduplicated).

    Each row: bytes, shape, dtype, device, whether it is a parameter (or a buffer-like leaf that
    requires grad), and how many live tensor objects share that storage.
    """
    rows: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on some module objects warns (deprecations)
        objs = [o for o in gc.get_objects() if _is_tensor(o)]
    for obj in objs:
        if obj.is_meta:
            continue
        if device is not None and obj.device.type != device:
            continue
        st = obj.untyped_storage()
        try:
            key = (st.data_ptr(), str(obj.device))
        except RuntimeError:   # a FakeTensor a torch.compile left behind (no memory of its own)
            continue
        r = rows.get(key)
        if r is None:
            rows[key] = {"bytes": st.nbytes(), "shape": tuple(obj.shape), "dtype": str(obj.dtype),
                         "device": str(obj.device), "parameter": isinstance(obj, torch.nn.Parameter),
                         "views": 1}
        else:
            r["views"] += 1
            r["parameter"] |= isinstance(obj, torch.nn.Parameter)
            if obj.numel() * obj.element_size() > r["bytes"] / max(1, r["views"]):
                r["shape"] = tuple(obj.shape)
    return sorted(rows.values(), key=lambda r: -r["bytes"])[:n]


def _is_tensor(o) -> bool:
    try:
        return isinstance(o, torch.Tensor)
    except Exception:  # objects that break isinstance (weakref proxies etc.)
        return False


def shm_bytes() -> int | None:
    """Size of /dev/shm (DataLoader workers and NCCL need it; Docker's default is 64 MB)."""
    try:
        return shutil.disk_usage("/dev/shm").total
    except OSError:
        return None


def oom_stats() -> dict:
    """The numbers :func:`diagnose_oom` reads, from the live device (CUDA only): this process's
    allocator (``allocated``, ``reserved``; ``total`` = its cap where one is set, else the device),
    this process's device memory by NVML (``process_bytes``, ``None`` where unavailable, with
    ``source``), the device's free memory and what other processes hold (``others_bytes`` = device
    used − this process), /dev/shm, and the largest live tensors."""
    if not torch.cuda.is_available():
        raise RuntimeError("oom_stats() needs a CUDA device; on a CPU pass diagnose_oom(stats={...}) explicitly")
    v = views()
    cap = memory_cap()
    return {"total": cap or v["device_total"], "capped": cap is not None, "allocated": v["allocated"],
            "reserved": v["reserved"], "device_free": v["device_free"], "device_total": v["device_total"],
            "process_bytes": v["process"], "others_bytes": v["others"], "source": v["process_source"],
            "shm": shm_bytes(), "top": top_tensors(5, "cuda")}


def diagnose_oom(stats: dict | None = None, request: int | None = None, need: float | None = None,
                 echo: bool = True) -> dict:
    """The OOM decision tree with live (or given) numbers; returns the branch taken and why.

    ``stats`` (bytes; :func:`oom_stats` reads them from the live device when omitted): ``total`` (what
    this process's allocator may hold: its cap, or the device), ``allocated``, ``reserved``; optional
    ``capped`` (``total`` is an allocator cap), ``device_free`` (the driver's free memory on the whole
    device), ``device_total``, ``others_bytes`` (device memory held by *other* processes, NVML per
    process; None where the driver cannot tell), ``shm``, ``top`` (:func:`top_tensors` rows).

    0. Who refused? Under a cap that the request would cross (``reserved + request > total``) the cap
       did — other processes cannot be the cause. Otherwise, if the device's free memory is below the
       request, the *device* is full:
    1. … and other processes hold over a quarter of it → **other-process** (check ``nvidia-smi``; one
       model copy per GPU); where per-process memory is not reported → **device-full**, said so.
    1b. ``need`` (what the failing phase needs in all, predicted by :mod:`helpers.budget`: the weights
       for a load, weights + activations for a prefill, weights + the KV of the target length for a
       decode) exceeds the budget → **too-big**, whatever the allocator's state at that instant (a heap
       can look fragmented on the way to a wall it would hit anyway).
    2. ``reserved − allocated`` ≥ the request → **fragmentation**: cached but split free blocks;
       try ``expandable_segments:True``, fewer distinct shapes, ``empty_cache`` between phases.
    3. allocated close to the budget → **too-big**: smaller batch/sequence, lower precision, quantized
       KV cache, offload, or a bigger GPU. A parameter-dominated top list means the weights alone are
       the problem (load-phase OOM); otherwise activations/KV (generation-phase).
    4. otherwise, a small /dev/shm points to DataLoader / shared-memory failures, not the GPU.
    """
    stats = oom_stats() if stats is None else dict(stats)
    for k in ("total", "allocated", "reserved"):
        if k not in stats:
            raise ValueError(f"diagnose_oom stats need key {k!r} (bytes); given {sorted(stats)}")
    total, alloc, res = (stats[k] for k in ("total", "allocated", "reserved"))
    gap = res - alloc
    top = stats.get("top") or []
    param_share = (sum(t["bytes"] for t in top if t.get("parameter")) / max(1, sum(t["bytes"] for t in top))
                   if top else None)
    dev_free, others = stats.get("device_free"), stats.get("others_bytes")
    card = stats.get("device_total") or total
    cap_refused = bool(stats.get("capped")) and request is not None and res + request > total
    device_full = not cap_refused and dev_free is not None and request is not None and request > dev_free
    if device_full and others is None:
        branch, why = "device-full", (f"the device has {fmt_bytes(dev_free)} free, less than the request "
                                      f"{fmt_bytes(request)}, and its driver does not report per-process memory "
                                      f"({stats.get('source', 'no source')}): check nvidia-smi for other processes.")
    elif device_full and others > 0.25 * card:
        branch, why = "other-process", (f"{fmt_bytes(others)} of the {fmt_bytes(card)} device is held by other "
                                        f"processes and only {fmt_bytes(dev_free)} is free: another process or "
                                        "a leaked context. Check nvidia-smi; one model copy per GPU.")
    else:
        if device_full:   # this process itself filled the device: judge it against what it could get
            total = min(total, res + dev_free)
        if need is not None and need > total:
            branch, why = "too-big", (f"the phase needs {fmt_bytes(need)} (predicted) but {fmt_bytes(total)} are "
                                      "available: no allocator setting helps; smaller batch/context/model, lower "
                                      "precision, quantized KV cache or offload.")
        elif request is not None and gap >= request:
            branch, why = "fragmentation", (f"reserved − allocated = {fmt_bytes(gap)} ≥ request {fmt_bytes(request)}: "
                                            "the memory is cached but split into blocks too small. Set "
                                            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or empty_cache() "
                                            "between phases, or keep shapes constant.")
        elif alloc > 0.9 * total or (request is not None and alloc + request > total):
            kind = ("weights (load phase): quantize weights, device_map='auto' offload, smaller model"
                    if param_share is not None and param_share > 0.5 else
                    "activations / KV cache (generation phase): smaller batch or context, quantized KV cache")
            branch, why = "too-big", (f"allocated {fmt_bytes(alloc)} of {fmt_bytes(total)}: genuinely out of memory; "
                                      f"dominated by {kind}.")
        elif stats.get("shm") is not None and stats["shm"] < 1 * GiB:
            branch, why = "shm", (f"/dev/shm is only {fmt_bytes(stats['shm'])}: DataLoader workers or NCCL fail with "
                                  "bus errors that look like OOMs. Use --shm-size / --ipc=host or num_workers=0.")
        else:
            branch, why = "unclear", (f"allocated {fmt_bytes(alloc)}, reserved {fmt_bytes(res)} of {fmt_bytes(total)}: "
                                      "no single cause; record a memory history "
                                      "(torch.cuda.memory._record_memory_history) around the failing step.")
    if echo:
        print(f"[diagnose_oom] {branch}: {why}")
    return {"branch": branch, "why": why, "gap": gap, "utilisation": alloc / total if total else 0.0,
            "param_share": param_share, "cap_refused": cap_refused, "device_full": device_full,
            "process_bytes": stats.get("process_bytes"), "others_bytes": others, "source": stats.get("source")}


def oom_guard(fn, *args, **kwargs) -> dict:
    """Run ``fn``; on ``torch.OutOfMemoryError`` free everything and report instead of crashing.

    Returns ``{"ok": bool, "result"| "error": ..., "allocated_after": bytes}``.
    """
    try:
        return {"ok": True, "result": fn(*args, **kwargs)}
    except torch.OutOfMemoryError as e:  # noqa: PERF203
        msg = str(e).split("\n")[0]
        e = None  # drop the traceback frames that pin tensors
        free_memory()
        return {"ok": False, "error": msg,
                "allocated_after": torch.cuda.memory_allocated() if torch.cuda.is_available() else 0}


def warmup_cublas() -> int:
    """Run small GEMMs (bf16 and fp32, with and without bias, forward and backward) so cuBLAS and
    cuBLASLt allocate their workspaces now (through the caching allocator: 32 MiB on Hopper by
    default, ``CUBLAS_WORKSPACE_CONFIG``); returns the bytes those first calls kept."""
    if not torch.cuda.is_available():
        return 0
    before = torch.cuda.memory_allocated()
    for dtype in (torch.bfloat16, torch.float32):  # plain GEMM, and GEMM + bias (the cuBLASLt path)
        a = torch.ones(64, 64, device="cuda", dtype=dtype, requires_grad=True)
        bias = torch.ones(64, device="cuda", dtype=dtype)
        y = torch.nn.functional.linear(a, a, bias) + a @ a
        y.sum().backward()
        del a, bias, y
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() - before
