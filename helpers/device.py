"""Which device the course runs on, what it is, and how to make it look smaller.

``get_device()`` picks cuda, then mps, then cpu. ``describe()`` reports the GPU as the learner's
driver sees it (PyTorch + NVML). ``limit_memory(gib)`` caps this process's share of the GPU through
``torch.cuda.set_per_process_memory_fraction`` (PyTorch docs, "CUDA semantics → memory management"),
which is how the course emulates a 16 GB T4 on a big card, or shares one GPU between learners.
Setting ``COURSE_GPU_GIB`` (e.g. ``15`` for a T4's usable memory) makes the whole course run as on a
card of that size: the cap is set when this module is imported and every later cap stays under it.
As on a real card, memory the driver already uses outside this process's allocator at that moment
(its CUDA context, other processes) comes out of the emulated card (:func:`card_share`).
"""
from __future__ import annotations

import contextlib
import functools
import numbers
import os
import platform
import sys
from dataclasses import dataclass

import psutil
import torch

from .units import GiB

CARD_ENV = "COURSE_GPU_GIB"
CAP_ENV = "COURSE_GPU_CAP_GIB"


def _env_gib(name: str) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        gib = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of GiB (e.g. 15), got {raw!r}") from None
    if not gib > 0 or gib == float("inf"):
        raise ValueError(f"{name} must be a positive, finite number of GiB, got {raw!r}")
    return gib


def card_gib() -> float | None:
    """The card size the course runs as (``COURSE_GPU_GIB``, in GiB), or None for the real card."""
    return _env_gib(CARD_ENV)


def cap_gib() -> float | None:
    """This process's allocator cap from ``COURSE_GPU_CAP_GIB`` (GiB), or None. Unlike
    ``COURSE_GPU_GIB`` (a smaller *card*: everything else on the GPU, other processes included, comes
    off it), this caps only this process's PyTorch allocator — the setting for sharing one GPU
    between workshop participants, whose processes must not count against each other."""
    return _env_gib(CAP_ENV)


def card_share(card: float, total: int, free: int, reserved: int = 0) -> int:
    """Bytes this process's caching allocator may reserve on an emulated card of ``card`` GiB:
    ``card·GiB − (total − free − reserved)``, where ``total − free`` is what the driver reports in use
    (``torch.cuda.mem_get_info``) and ``reserved`` is this process's allocator share of it; the rest
    (CUDA contexts, other processes) takes memory from a real card of that size too."""
    outside = int(total) - int(free) - int(reserved)
    if outside < 0 or free > total:
        raise ValueError(f"inconsistent device memory: total {total}, free {free}, reserved {reserved}")
    share = int(card * GiB) - outside
    if card <= 0:
        raise ValueError(f"card must be a positive number of GiB, got {card}")
    if share <= 0:
        raise ValueError(f"an emulated card of {card} GiB leaves nothing for this process: "
                         f"{outside / GiB:.2f} GiB are already used on the device outside its allocator")
    return share


@functools.cache
def _card_share_at_first_use(idx: int, card: float) -> int:
    """:func:`card_share` measured once per (device, card size), when the emulated card is first
    applied: later calls must not count the course's own allocations as "outside" memory. A memo of
    a measurement (the same answer for the life of the process), not a setting that changes."""
    free, total = torch.cuda.mem_get_info(idx)
    if card * GiB > total:
        raise ValueError(f"{CARD_ENV}={card} asks for a card larger than this device "
                         f"({total / GiB:.1f} GiB): an emulated card must fit on the real one")
    return card_share(card, total, free, torch.cuda.memory_reserved(idx))


def memory_cap(device: int | None = None) -> int | None:
    """The allocator cap in force on the CUDA device (bytes), read back from PyTorch
    (``torch.cuda.get_per_process_memory_fraction × total``); None without CUDA or without a cap."""
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device() if device is None else device
    fraction = torch.cuda.get_per_process_memory_fraction(idx)
    if fraction >= 1.0:
        return None
    return int(fraction * torch.cuda.get_device_properties(idx).total_memory)


def get_device(prefer: str | None = None) -> torch.device:
    """cuda if available, then mps, then cpu. ``prefer`` ("cpu", "cuda", "mps") forces one, checked."""
    if prefer is not None:
        prefer = str(prefer).lower()
        kind = prefer.split(":")[0]
        if kind not in ("cpu", "cuda", "mps"):
            raise ValueError(f"unknown device {prefer!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
        if kind == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was asked for, but torch.cuda.is_available() is False")
        if kind == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise RuntimeError("device 'mps' was asked for, but this machine has no MPS backend")
        return torch.device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def cpu_has_bf16() -> bool:
    """True when this (Linux) CPU advertises bf16 matrix instructions in /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def use_triton_interpreter_without_gpu() -> bool:
    """Where there is no CUDA device, make Triton run kernels in its interpreter (NumPy on the CPU:
    exact and slow) by setting ``TRITON_INTERPRET=1`` — the switch Triton reads when it is first
    imported, so call this before anything imports triton. Returns True when kernels will be
    interpreted; raises if triton was already imported without the interpreter on a machine without
    a GPU (restart the kernel and call this first)."""
    if torch.cuda.is_available():
        return os.environ.get("TRITON_INTERPRET") == "1"
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton is already imported without its interpreter, and there is no GPU: restart, "
                           "then call helpers.device.use_triton_interpreter_without_gpu() before other imports")
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def has_cuda() -> bool:
    """True when a CUDA device is usable (the GPU-only cells of the notebooks check this)."""
    return torch.cuda.is_available()


@contextlib.contextmanager
def cpu_threads(n: int):
    """Run the block with ``n`` intra-op CPU threads, then restore the previous count. For loops of
    tiny operations (GPTQ's column step on a 576-row block is a few microseconds of work) every op
    pays the hand-off between threads, so one thread is faster there; large matmuls keep the default."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of threads, got {n!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class ProcessMemory:
    """One process's device memory as the driver reports it: ``bytes`` (None when unknown) and
    ``source``, which says where the number came from, or why there is none."""
    bytes: int | None
    source: str


def process_memory(index: int = 0, pid: int | None = None) -> ProcessMemory:
    """What ``nvidia-smi`` lists for process ``pid`` (default: this one) on GPU ``index``: NVML's
    per-process used memory (``nvmlDeviceGetComputeRunningProcesses``, matched by pid — the CUDA
    context + the caching allocator's reserved memory + library workspaces). Where it is unavailable
    (no nvidia-ml-py, no NVML, a container whose PID namespace hides the host pid, a virtualised GPU or
    a MIG slice without per-process accounting) ``bytes`` is None and ``source`` says which."""
    try:
        import pynvml  # optional (nvidia-ml-py)
    except ImportError:
        return ProcessMemory(None, "unavailable: nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVML missing or driver not loaded
        return ProcessMemory(None, f"unavailable: NVML did not start ({type(e).__name__})")
    try:
        me = os.getpid() if pid is None else int(pid)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(index))
        for p in procs:
            if p.pid == me:
                if p.usedGpuMemory is None:
                    return ProcessMemory(None, "unavailable: NVML lists this process without its memory "
                                               "(per-process accounting is off on this GPU)")
                return ProcessMemory(int(p.usedGpuMemory), "NVML, this process (pid)")
        return ProcessMemory(None, f"unavailable: NVML lists {len(procs)} process(es) on GPU {index}, none with "
                                   f"pid {me} (a container's PID namespace, or no CUDA context yet)")
    except Exception as e:  # noqa: BLE001 - some virtualised GPUs refuse the per-process query
        return ProcessMemory(None, f"unavailable: NVML's per-process query failed ({type(e).__name__})")
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def process_gpu_bytes(index: int = 0, pid: int | None = None) -> int | None:
    """This process's device memory by NVML (:func:`process_memory`), or None where it is unavailable."""
    return process_memory(index, pid).bytes


def nvml_info(index: int = 0) -> dict | None:
    """The driver's view through NVML (``nvidia-ml-py``): used/total bytes, driver, MIG mode.

    Returns None where NVML is not installed or finds no GPU (CPU machines, some containers).
    """
    try:
        import pynvml  # optional (nvidia-ml-py): absent on CPU-only installs
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVML library missing (CPU machine) or driver not loaded
        return None
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        info = {"nvml_used": int(mem.used), "nvml_total": int(mem.total),
                "driver": pynvml.nvmlSystemGetDriverVersion()}
        try:
            cur, _pending = pynvml.nvmlDeviceGetMigMode(h)
            info["mig"] = "enabled" if cur == 1 else "disabled"
        except Exception:
            info["mig"] = "not supported"
        return info
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def describe(device: torch.device | None = None, echo: bool = True) -> dict:
    """Report the device: name, total/free memory, compute capability, driver and MIG mode (NVML)."""
    device = device or get_device()
    info = {"device": str(device), "torch": torch.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        free, total = torch.cuda.mem_get_info(idx)
        info.update(name=props.name, total_bytes=int(total), free_bytes=int(free),
                    compute_capability=f"{props.major}.{props.minor}",
                    multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)
        nv = nvml_info(idx)
        if nv:
            info.update(driver=nv["driver"], mig=nv["mig"])
        cap = memory_cap(idx)
        if cap:
            info["memory_cap_bytes"] = cap
    elif device.type == "mps":
        info.update(name="Apple MPS")
    else:
        info.update(name=platform.processor() or platform.machine(), cores=psutil.cpu_count(),
                    total_bytes=int(psutil.virtual_memory().total))
    if echo:
        for k, v in info.items():
            if k.endswith("_bytes"):
                v = f"{v / GiB:.2f} GiB"
            print(f"{k:>20}: {v}")
    return info


def limit_memory(gib: float | None, device: torch.device | int | None = None) -> float | None:
    """Cap this process's CUDA caching allocator at ``gib`` GiB (None removes the cap: back to the
    whole card, or to the emulated card of ``COURSE_GPU_GIB`` / the cap of ``COURSE_GPU_CAP_GIB``,
    which no cap can exceed).

    Implemented with ``torch.cuda.set_per_process_memory_fraction(gib / total)``: an allocation that
    would take *reserved* memory past the cap raises ``torch.OutOfMemoryError`` exactly as a card of
    that size would. An explicit cap counts the allocator's memory only; under ``COURSE_GPU_GIB`` the
    card's cap is :func:`card_share` (the card minus what already sits outside this allocator).
    Returns the fraction set, or None on a machine without CUDA (where it does nothing, and says so).
    """
    if gib is not None and (isinstance(gib, bool) or not isinstance(gib, numbers.Real) or not gib > 0
                            or gib == float("inf")):
        raise ValueError(f"limit_memory needs a positive, finite number of GiB or None, got {gib!r}")
    if not torch.cuda.is_available():
        print("limit_memory: no CUDA device here, nothing to cap")
        return None
    idx = torch.device(device).index if isinstance(device, torch.device) else device
    idx = torch.cuda.current_device() if idx is None else idx
    total = torch.cuda.get_device_properties(idx).total_memory
    card = card_gib()
    cap = None if gib is None else int(gib * GiB)
    if cap is not None and cap > total:
        print(f"limit_memory: {gib} GiB is more than this device has ({total / GiB:.1f} GiB); "
              "the cap is the whole device")
    if card is not None:
        share = _card_share_at_first_use(idx, card)
        cap = share if cap is None else min(cap, share)
    if cap_gib() is not None:     # the participant's cap stays in force under any later cap
        cap = int(cap_gib() * GiB) if cap is None else min(cap, int(cap_gib() * GiB))
    fraction = 1.0 if cap is None else min(1.0, cap / total)
    torch.cuda.set_per_process_memory_fraction(fraction, idx)
    return fraction


@contextlib.contextmanager
def memory_limit(gib: float | None):
    """Context manager form of :func:`limit_memory`; restores the full (or emulated) card on exit."""
    limit_memory(gib)
    try:
        yield
    finally:
        if torch.cuda.is_available():
            limit_memory(None)


def free_bytes() -> int:
    """Bytes this process can still take on the CUDA device: the driver's free memory, or less
    under a cap (the cap minus what the caching allocator already reserved)."""
    free, _ = torch.cuda.mem_get_info()
    cap = memory_cap()
    return int(min(free, cap - torch.cuda.memory_reserved())) if cap else int(free)


if (card_gib() is not None or cap_gib() is not None) and torch.cuda.is_available():
    limit_memory(None)  # run the whole course as on the emulated card / under the participant's cap
