"""Timing GPU work honestly: CUDA events, warm-up, the L2 cache flushed, and the bandwidth limit.

A decode-shaped matmul reads every weight byte once, so its speed limit is
``bytes read / bandwidth``. The bandwidth a kernel can reach is measured, not taken from the data
sheet: a device-to-device copy of a buffer much larger than L2 reads and writes every byte once,
so ``copy GB/s = 2 · bytes / time`` (the convention of NVIDIA's ``bandwidthTest`` and of
``torch.cuda`` memory benchmarks). Between timed calls a 256 MiB buffer is overwritten so the
weights come from HBM, not from the L2 cache (50–60 MB on an H100/H200), as they would in a model
whose layers are far larger than L2.
"""
from __future__ import annotations

import statistics
import time

import torch

from .units import GiB, MiB

L2_FLUSH_BYTES = 256 * MiB


def _flush(buf: torch.Tensor | None) -> None:
    if buf is not None:
        buf.zero_()


def gpu_ms(fn, iters: int = 50, warmup: int = 5, flush_l2: bool = True) -> float:
    """Median milliseconds of ``fn()`` on the current CUDA device (CUDA events around each call).

    With ``flush_l2`` a 256 MiB buffer is zeroed before every call (outside the timed region)."""
    if not torch.cuda.is_available():
        raise RuntimeError("gpu_ms times CUDA work; on CPU use cpu_ms")
    buf = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush_l2 else None
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        _flush(buf)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def cpu_ms(fn, iters: int = 5, warmup: int = 1) -> float:
    """Median wall-clock milliseconds of ``fn()`` (CPU work)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbps(nbytes: int = 2 * GiB, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s: ``2 · nbytes / time`` (each byte read once, written once)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = gpu_ms(lambda: dst.copy_(src), iters=iters, flush_l2=False)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def roofline_tokens_per_s(weight_bytes: float, bandwidth_gbps: float, kv_bytes: float = 0.0) -> float:
    """Decode's upper bound: every step reads all weights (and the KV cache) once, so
    ``tokens/s ≤ bandwidth / (weight bytes + KV bytes)`` per sequence (batch 1)."""
    if weight_bytes <= 0 or bandwidth_gbps <= 0:
        raise ValueError(f"weight_bytes and bandwidth_gbps must be positive, got {weight_bytes}, {bandwidth_gbps}")
    return bandwidth_gbps * 1e9 / (weight_bytes + kv_bytes)


def copies_past_l2(nbytes: int, times: int = 3) -> int:
    """How many copies of an ``nbytes`` weight a :func:`graph_ms` rotation needs so that together they
    exceed the device's L2 cache ``times`` over (at least 2): each call then reads from HBM."""
    if not torch.cuda.is_available():
        raise RuntimeError("copies_past_l2 reads the CUDA device's L2 size; there is no CUDA device here")
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 60 * MiB)
    return max(2, -(-times * l2 // max(1, int(nbytes))))


def graph_ms(fns: list, replays: int = 20, warmup: int = 2, warm_ms: float = 50.0) -> float:
    """Milliseconds per call of the calls ``fns`` (each a zero-argument function) replayed as one CUDA
    graph: captured once, in order, replayed untimed until the card has run it for ``warm_ms`` (8 times
    at least), then ``replays`` times timed; the median timed replay ÷ ``len(fns)``.

    The untimed replays bring the card's clocks back up: they drop while the CPU compiles a kernel,
    and a few replays timed right after read slow (the same config 121 µs first, 105 µs when timed
    again, on an H100; ``results/h100/kernels.json`` run "2026-12-06 U").

    This is how a decode step sees a kernel: launched from a graph (no Python or launch gaps), and —
    when each of ``fns`` reads its own copy of the weights and together they exceed the L2 cache —
    with its weights coming from HBM, as every layer's do when the other layers ran in between. One
    call timed alone under replay would read its weights from L2 after the first replay."""
    if not torch.cuda.is_available():
        raise RuntimeError("graph_ms times CUDA graphs; there is no CUDA device here")
    if not fns or not all(callable(f) for f in fns):
        raise ValueError("fns must be a non-empty list of zero-argument callables")
    if warm_ms < 0:
        raise ValueError(f"warm_ms is the milliseconds of untimed replays before timing, at least 0, got {warm_ms}")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    graph.replay()
    torch.cuda.synchronize()
    began, warmed = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began.record()
    while True:                                   # untimed replays, 8 at a time: the clocks come back up
        for _ in range(8):
            graph.replay()
        warmed.record()
        warmed.synchronize()
        if began.elapsed_time(warmed) >= warm_ms:
            break
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times) / len(fns)
