"""Three classic memory leaks, each measured, each with its fix.

A "leak" in PyTorch is a live Python reference that keeps tensors (and maybe an autograd graph)
alive. Bytes are measured as the growth of :func:`live_bytes` — ``memory_allocated`` on CUDA, and on
a CPU the bytes of every live tensor storage found by a gc walk (PyTorch tracks no CPU allocator).
"""
from __future__ import annotations

import gc

import torch

from .measure import top_tensors, warmup_cublas

_GLOBAL_CACHE: list = []


def live_bytes(device: torch.device) -> int:
    """Bytes of live tensors on ``device`` (allocator counter on CUDA, gc walk elsewhere)."""
    gc.collect()
    if device.type == "cuda":
        warmup_cublas()  # the first matmul's 32 MiB cuBLAS workspace is not a leak: allocate it first
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated(device)
    return sum(r["bytes"] for r in top_tensors(10**9, device=device.type))


def _net(device, width=1024):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                               torch.nn.Linear(4 * width, width)).to(device)


def kept_graph(device, steps: int = 8, fix: bool = False, batch: int = 64) -> int:
    """Summing losses as tensors keeps every step's graph (and its activations) alive.
    Fix: ``loss.item()`` (or ``torch.no_grad()`` when no gradient is wanted)."""
    net = _net(device)
    x = torch.randn(batch, 1024, device=device)
    before = live_bytes(device)
    total = 0.0
    for _ in range(steps):
        loss = net(x).pow(2).mean()
        total = total + (loss.item() if fix else loss)
        del loss
    grown = live_bytes(device) - before
    del total
    return grown


def accumulated_list(device, steps: int = 8, fix: bool = False, batch: int = 64) -> int:
    """Appending outputs to a list keeps them all on the device.
    Fix: keep what you need, detached and on the CPU (``out.detach().cpu()``) or a scalar."""
    net = _net(device)
    x = torch.randn(batch, 1024, device=device)
    before = live_bytes(device)
    outs = []
    with torch.no_grad():
        for _ in range(steps):
            y = net(x)
            outs.append(y.mean().item() if fix else y)
    del y
    grown = live_bytes(device) - before
    del outs
    return grown


def global_reference(device, steps: int = 8, fix: bool = False, batch: int = 64) -> int:
    """A module-level cache (a "global") outlives the function that filled it.
    Fix: clear it (``cache.clear()``), scope it to the call, or hold weak references."""
    net = _net(device)
    x = torch.randn(batch, 1024, device=device)
    before = live_bytes(device)
    with torch.no_grad():
        for _ in range(steps):
            _GLOBAL_CACHE.append(net(x))
    if fix:
        _GLOBAL_CACHE.clear()
    grown = live_bytes(device) - before
    _GLOBAL_CACHE.clear()
    return grown


def missing_zero_grad(device, steps: int = 8, batch: int = 64) -> dict:
    """The source document's "Step 4" asks whether a missing ``optimizer.zero_grad()`` makes "the
    gradients accumulate, eating one more copy of memory every step". Measured: ``backward`` adds
    into the existing ``.grad`` tensors **in place** — the same storages, the same bytes every step —
    so the memory stays flat; what grows is the gradient's *value* (a training bug, not a leak).

    Returns the live bytes after the first and the last backward, whether every ``.grad`` kept its
    storage, and how much the gradient norm grew."""
    net = _net(device)
    x = torch.randn(batch, 1024, device=device)
    before = live_bytes(device)
    net(x).pow(2).mean().backward()
    ptrs = [p.grad.data_ptr() for p in net.parameters()]  # (gives the .grad tensors Python objects,
    first = live_bytes(device) - before                   # which the CPU's gc walk needs to see them)
    norm1 = torch.cat([p.grad.flatten() for p in net.parameters()]).norm().item()
    for _ in range(steps - 1):  # no zero_grad: gradients accumulate
        net(x).pow(2).mean().backward()
    last = live_bytes(device) - before
    same = ptrs == [p.grad.data_ptr() for p in net.parameters()]
    norm = torch.cat([p.grad.flatten() for p in net.parameters()]).norm().item()
    del net, x
    return {"bytes_after_first": first, "bytes_after_last": last, "same_storages": same,
            "grad_norm_growth": norm / norm1}
