"""The peak of live tensor bytes on the CPU: ``torch.cuda.max_memory_allocated`` for a machine without a GPU.

PyTorch keeps no statistics for CPU allocations, but its CPU allocator takes every tensor's memory
from the C library's ``malloc`` (``posix_memalign``) and gives it back on free, without caching. So
glibc's own count of bytes in use — ``mallinfo2()``: ``uordblks`` (heap chunks in use) + ``hblkhd``
(large blocks it ``mmap``-ed) — moves exactly with tensors being created and freed. Reading it after
every aten operator (a ``TorchDispatchMode``) gives the peak of live bytes over a forward pass, the
quantity ``max_memory_allocated`` reports on CUDA, minus the CUDA allocator's 512-byte rounding.

What it cannot see: a temporary that lives and dies *inside* one operator (a kernel's workspace), and
memory that is not tensors (Python objects: measured as a small offset, hence the warm-up run).
Linux/glibc only (``mallinfo2`` is glibc ≥ 2.33); elsewhere :func:`peak_bytes` raises and says so.
Used to check the budget's activation formulas in CI without a GPU (tests/test_budget_measured.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .device import cpu_threads


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo2():
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    fn = getattr(libc, "mallinfo2", None)
    if fn is None:
        raise RuntimeError("host_alloc needs glibc's mallinfo2 (Linux, glibc ≥ 2.33) to count CPU allocations; "
                           "on this system measure on a GPU (torch.cuda.max_memory_allocated) instead")
    fn.restype = _MallInfo2
    return fn


def live_bytes(_info=None) -> int:
    """Bytes the C allocator has handed out and not taken back (all of the process's ``malloc``)."""
    m = (_info or _mallinfo2())()
    return m.uordblks + m.hblkhd


class _PeakMode(TorchDispatchMode):
    """Reads the live bytes after every aten operator; keeps the largest."""

    def __init__(self, info):
        super().__init__()
        self.info, self.peak = info, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, live_bytes(self.info))
        return out


def peak_bytes(fn, warmup: bool = True, no_grad: bool = True, threads: int | None = 1) -> dict:
    """Run ``fn()`` on CPU tensors and return ``{"peak": …, "end": …}``: the largest and the final live
    bytes *over the start* (``max_memory_allocated − memory_allocated`` before, in CUDA terms).

    ``warmup`` runs ``fn`` once first, unmeasured, so one-time costs (lazy imports, caches, kernel
    selection) do not count; the result of the measured call is dropped before returning.
    ``no_grad`` (default) measures ``fn`` with autograd off, as inference runs; ``no_grad=False``
    leaves the caller's grad mode, so what autograd would keep alive is counted too (a quantizer
    must not depend on its caller to switch autograd off). ``threads`` intra-op threads run ``fn``
    (default 1; None keeps the caller's): the math libraries' per-thread scratch buffers come from
    the same ``malloc`` and grow with the thread count, so a fixed count measures the tensors, the
    same on a 2-core laptop and a 16-core server."""
    if not callable(fn):
        raise TypeError(f"fn must be a callable (a zero-argument function to measure), got {type(fn).__name__}")
    info = _mallinfo2()
    with contextlib.nullcontext() if threads is None else cpu_threads(threads):
        if warmup:
            fn()
        start = live_bytes(info)
        with torch.no_grad() if no_grad else contextlib.nullcontext(), _PeakMode(info) as mode:
            result = fn()
            end = live_bytes(info)
        del result
    return {"peak": max(mode.peak, end) - start, "end": end - start}
