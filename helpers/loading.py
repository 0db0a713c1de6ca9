"""What loading a model really costs: the peak while it loads, and how long it takes.

Two ways to load the same weights:

* **naive** — the tutorial way: build the model from its config (parameters allocated in the default
  dtype, fp32, and randomly initialised), ``torch.load`` the state dict into memory (a second copy),
  then ``load_state_dict`` (copy into the first). Peak ≈ fp32 model + the whole state dict.
* **lazy** — ``from_pretrained(dtype=…)``: the model is created on the meta device (no bytes),
  safetensors files are memory-mapped and each tensor is materialised once, in the target dtype.
  Peak ≈ the model in its dtype.

The seed document's "slow loading" advice (safetensors instead of ``.bin``, "2-3x") is measured here
too (:func:`format_load_times`, run by ``benchmarks/load_formats.py``): the same state dict read as
safetensors (tensors memory-mapped from the file) and as a pickled ``.bin`` (``torch.load`` with
``weights_only=True``, the only safe way to open one; with and without ``mmap=True``), repeated, from a
warm and from a cold page cache.

CPU peaks are resident-set peaks of this process (Linux ``VmHWM``, reset through
``/proc/self/clear_refs``; elsewhere a 5 ms sampling thread); GPU peaks are the allocator's.
"""
from __future__ import annotations

import ctypes
import gc
import mmap
import os
import statistics
import threading
import time
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from .config import file_lock, read_json, replace_whole, write_json
from .measure import PeakMeter
from .models import parse_dtype, unreadable_safetensors
from .units import GB, MiB
from .validate import bad_file, flag, json_fields, non_negative_number, positive_int, positive_number, text

_HWM = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _reset_hwm() -> bool:
    try:
        _CLEAR.write_text("5")
        return True
    except OSError:
        return False


def _hwm() -> int:
    for line in _HWM.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmHWM line in /proc/self/status")


def _release_free_heap() -> None:
    """Hand the heap's free pages back to the OS (glibc's ``malloc_trim(0)``; nothing elsewhere), so
    the resident set measured next grows with what is allocated, not only past what was freed before."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_rss_during(fn):
    """``(fn(), peak resident bytes above the start)`` for this process while ``fn`` runs."""
    if not callable(fn):
        raise TypeError(f"fn must be a function of no arguments (e.g. lambda: load_lazy(folder)), got "
                        f"{type(fn).__name__}")
    gc.collect()
    _release_free_heap()   # else the load reuses pages an earlier job freed, and the resident set never grows
    base = _rss()
    if _reset_hwm():
        result = fn()
        return result, max(0, _hwm() - base)
    peak, stop = [base], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.005)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        result = fn()
    finally:
        stop.set()
        t.join()
    return result, max(0, max(peak[0], _rss()) - base)


def checkpoint_dir(folder, needs: tuple[str, ...] = ("safetensors",)) -> Path:
    """``folder`` as a ``Path`` to a checkpoint directory holding what ``needs`` names — ``"config"``
    (``config.json``), ``"safetensors"`` (readable ``*.safetensors``: a truncated copy is named here,
    not deep in the library), ``"bin"`` (``pytorch_model.bin``) — or an error that says what to do."""
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a checkpoint directory (str or Path), got {type(folder).__name__}")
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a directory: pass the folder save_pretrained(...) wrote")
    if "config" in needs and not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json: pass the folder save_pretrained(...) wrote")
    if "safetensors" in needs:
        if not any(folder.glob("*.safetensors")):
            raise FileNotFoundError(f"{folder} holds no .safetensors files: pass a checkpoint directory "
                                    "(save_pretrained(folder, safe_serialization=True))")
        problem = unreadable_safetensors(folder)
        if problem:
            raise ValueError(f"{folder / problem.split(':')[0]} cannot be read ({problem.split(': ')[-1]}): the file "
                             "is truncated or not safetensors. Save or download the checkpoint again.")
    if "bin" in needs and not (folder / "pytorch_model.bin").is_file():
        raise FileNotFoundError(f"{folder} has no pytorch_model.bin: call write_pickle_copy(folder) first")
    return folder


def _device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N' (the peaks measured here), got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} but no CUDA device is visible here: use device='cpu'")
    return dev


def _float_dtype(dtype) -> torch.dtype:
    dt = parse_dtype(dtype)
    if not dt.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype to load weights in (bf16, fp16, fp32), got {dt}")
    return dt


def _torch_load(path: Path, **kw):
    try:
        return torch.load(path, weights_only=True, **kw)
    except Exception as e:  # truncated, foreign or unsafe pickle: the library's error lacks the remedy
        raise ValueError(f"{path} cannot be read by torch.load(weights_only=True) ({type(e).__name__}): delete it "
                         "and call write_pickle_copy(folder) again") from None


def write_pickle_copy(folder) -> Path:
    """Write the safetensors weights of ``folder`` also as a pickled ``pytorch_model.bin`` (same tensors)."""
    folder = checkpoint_dir(folder)
    files = sorted(folder.glob("*.safetensors"))
    state = {}
    for f in files:
        state.update(load_file(f))
    out = folder / "pytorch_model.bin"
    torch.save(state, out)
    return out


# --- safetensors vs a torch pickle: the same state dict, read both ways (benchmarks/load_formats.py) ---

FORMATS = ("safetensors", "torch.load", "torch.load mmap")
TOUCH = ("one byte of every memory page of every tensor, read by a single torch.cat(...).sum() over strided "
         "uint8 views: it makes a memory-mapped tensor fault each of its pages in (from the page cache, or the "
         "disk when cold) without timing arithmetic over every byte (the old .float().sum() did)")
_PAGE = mmap.PAGESIZE


def demo_state(mib=64, layers=16, dtype=torch.bfloat16) -> dict:
    """A random state dict of about ``mib`` MiB shaped like a decoder's: ``layers`` blocks of four
    attention matrices ``[h, h]``, three MLP matrices ``[3h, h]`` and two norm vectors (9 tensors a
    block, as in Llama-type checkpoints), ``h`` (a multiple of 64) chosen to fill ``mib``."""
    mib = positive_number(mib, "mib", "the size of the state dict in MiB, e.g. 64")
    layers = positive_int(layers, "layers", "decoder blocks in the state dict, e.g. 16")
    dt = _float_dtype(dtype)
    per_h2 = layers * 13 * torch.finfo(dt).bits // 8            # bytes per h² over all blocks: (4 + 3·3) h²
    h = int((mib * MiB / per_h2) ** 0.5) // 64 * 64
    if h < 64:
        raise ValueError(f"mib={mib} is too small for layers={layers} (a block needs h ≥ 64): give more MiB or "
                         "fewer layers")
    g = torch.Generator().manual_seed(0)
    state = {}
    for i in range(layers):
        for name, shape in [(n, (h, h)) for n in ("q", "k", "v", "o")] + [(n, (3 * h, h)) for n in ("gate", "up")] \
                + [("down", (h, 3 * h)), ("norm1", (h,)), ("norm2", (h,))]:
            state[f"layers.{i}.{name}"] = (torch.randn(shape, generator=g) * 0.02).to(dt)
    return state


def write_both_formats(state, folder) -> Path:
    """Save ``state`` (a dict of tensors) as ``folder/model.safetensors`` and ``folder/pytorch_model.bin``
    (``torch.save``), both flushed to disk (so that their pages can later be dropped from the cache).
    Each is written whole or not at all (:func:`helpers.config.replace_whole`): processes sharing
    ``folder`` (a workshop's cache) read a whole file, never one half-written."""
    from safetensors.torch import save_file
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TypeError(f"state must be a non-empty dict of tensors (e.g. loading.demo_state(64) or "
                        f"model.state_dict()), got {type(state).__name__}")
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a directory to write into (str or Path), got {type(folder).__name__}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in state.items()}
    replace_whole(folder / "model.safetensors", lambda tmp: save_file(state, str(tmp)), fsync=True)
    replace_whole(folder / "pytorch_model.bin", lambda tmp: torch.save(state, tmp), fsync=True)
    return folder


def resident_fraction(path) -> float | None:
    """Share of ``path``'s pages in the page cache (Linux ``mincore``), or None where it cannot be asked."""
    import ctypes
    size = os.path.getsize(path)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                                  ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    if size == 0:
        return 1.0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        vec = (ctypes.c_ubyte * -(-size // _PAGE))()
        ok = libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0
        libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec) / len(vec) if ok else None


def drop_page_cache(path) -> float | None:
    """Ask the kernel to forget ``path``'s cached pages (``posix_fadvise(POSIX_FADV_DONTNEED)``, no root
    needed; dirty pages are flushed first) and return the share still resident afterwards (None: unknown)."""
    if not hasattr(os, "posix_fadvise"):
        raise OSError("os.posix_fadvise is not available on this system (Linux only): no cold-cache runs here")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_fraction(path)


def _touch(state) -> int:
    views = [t.detach().reshape(-1).view(torch.uint8) for t in state.values() if t.numel()]
    return int(torch.cat([v[::_PAGE] for v in views] + [v[-1:] for v in views]).sum())


def format_load_times(folder, repeats=5, cold=True) -> dict:
    """Seconds to load ``folder``'s weights — its ``*.safetensors`` (``safetensors.torch.load_file``) and its
    ``pytorch_model.bin`` (``torch.load(weights_only=True)``, without and with ``mmap=True``) — and touch
    their bytes (:data:`TOUCH`). One untimed load of each first, then ``repeats`` timed loads each from
    a warm page cache and, where ``cold`` and the system allows, with the file's pages dropped before
    each load (:func:`drop_page_cache`); the order of the formats alternates from one round to the next.
    Returns the files' bytes, one row per format and cache (``median_s``, ``min_s``, ``max_s``,
    ``spread`` = (max − min) / median, ``GBps``, every ``seconds``) and ``cold`` (what happened)."""
    folder = checkpoint_dir(folder, ("safetensors", "bin"))
    repeats = positive_int(repeats, "repeats", "timed loads per format and cache, e.g. 5")
    cold = flag(cold, "cold")
    st, pkl = sorted(folder.glob("*.safetensors")), folder / "pytorch_model.bin"
    files = {"safetensors": st, "torch.load": [pkl], "torch.load mmap": [pkl]}
    read = {"safetensors": lambda: {k: v for f in st for k, v in load_file(f).items()},
            "torch.load": lambda: _torch_load(pkl), "torch.load mmap": lambda: _torch_load(pkl, mmap=True)}

    def once(fmt) -> float:
        gc.collect()
        t = time.perf_counter()
        state = read[fmt]()
        _touch(state)
        secs = time.perf_counter() - t
        del state
        return secs

    nbytes = {fmt: sum(f.stat().st_size for f in fs) for fmt, fs in files.items()}
    first = read["safetensors"]()
    info = {"files_bytes": nbytes, "tensors": len(first), "tensor_bytes": sum(t.numel() * t.element_size()
                                                                            for t in first.values()),
            "touch": TOUCH, "repeats": repeats, "page_bytes": _PAGE}
    del first
    for fmt in FORMATS:                                      # warm-up: every file in the page cache
        once(fmt)
    times = {(fmt, "warm"): [] for fmt in FORMATS}
    for i in range(repeats):
        for fmt in FORMATS if i % 2 == 0 else FORMATS[::-1]:
            times[fmt, "warm"].append(once(fmt))
    info["cold"] = {"asked": cold, "ran": False, "how": "posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) on each "
                    "file before each load; residency checked with mincore", "resident_after_drop": None}
    if cold:
        try:
            left = [drop_page_cache(f) for fs in files.values() for f in fs]
        except OSError as e:
            info["cold"]["why_not"] = str(e)
            left = None
        if left is not None and any(x is not None and x > 0.05 for x in left):
            info["cold"]["why_not"] = (f"posix_fadvise left {max(left):.0%} of a file resident (a tmpfs or "
                                       "a file still mapped): the cold rows would be warm ones")
        elif left is not None:
            info["cold"]["ran"], worst = True, 0.0
            for fmt in FORMATS:
                times[fmt, "cold"] = []
            for i in range(repeats):
                for fmt in FORMATS if i % 2 == 0 else FORMATS[::-1]:
                    for f in files[fmt]:
                        r = drop_page_cache(f)
                        worst = max(worst, r) if r is not None else worst
                    times[fmt, "cold"].append(once(fmt))
            info["cold"]["resident_after_drop"] = worst
    rows = []
    for (fmt, cache), secs in times.items():
        med = float(statistics.median(secs))
        rows.append({"format": fmt, "cache": cache, "median_s": med, "min_s": min(secs), "max_s": max(secs),
                     "spread": (max(secs) - min(secs)) / med, "GBps": nbytes[fmt] / med / GB, "seconds": secs})
    return {**info, "rows": rows}


# what one row of format_load_times() holds, checked when load_formats.json is read back
FORMAT_ROW = {"format": text, "cache": text, "median_s": positive_number, "min_s": positive_number,
              "max_s": positive_number, "spread": non_negative_number, "GBps": positive_number}


def read_load_formats(path) -> dict:
    """``load_formats.json`` (benchmarks/load_formats.py) as written, each run's rows checked; an error
    naming the file when it is not that."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or not data["runs"]:
        raise bad_file(path, "is not the {'meta': ..., 'runs': [...]} that benchmarks/load_formats.py writes")
    for j, run in enumerate(data["runs"]):
        if not isinstance(run, dict) or not isinstance(run.get("rows"), list) or not run["rows"]:
            raise bad_file(path, f"has no rows in run {j}")
        for i, row in enumerate(run["rows"]):
            json_fields(row, path, FORMAT_ROW, f"run {j} row {i}")
    return data

def load_naive(folder, device="cpu"):
    """The tutorial load: model from config in fp32 (default dtype), state dict read whole, copied in."""
    folder, device = checkpoint_dir(folder, ("config", "bin")), _device(device)
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)
    state = _torch_load(folder / "pytorch_model.bin", map_location=device)
    model.load_state_dict(state, strict=False)
    del state
    return model


def load_lazy(folder, device="cpu", dtype=torch.bfloat16):
    """``from_pretrained``: meta-device model, memory-mapped safetensors, one copy in ``dtype``."""
    folder, device, dtype = checkpoint_dir(folder, ("config", "safetensors")), _device(device), _float_dtype(dtype)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map=str(device),
                                                use_safetensors=True, trust_remote_code=False)


def load_peaks(folder, device="cpu", dtype=torch.bfloat16) -> list[dict]:
    """Peak and seconds of :func:`load_naive` and :func:`load_lazy` on ``device`` (CPU: resident set;
    CUDA: allocator peak), plus the bytes the loaded parameters hold."""
    folder = checkpoint_dir(folder, ("config", "safetensors", "bin"))
    device, dtype = _device(device), _float_dtype(dtype)
    rows = []
    for name, load in (("naive: fp32 from config + torch.load", lambda: load_naive(folder, device)),
                       (f"from_pretrained({str(dtype).replace('torch.', '')}, safetensors)",
                        lambda: load_lazy(folder, device, dtype))):
        if device.type == "cuda":
            torch.cuda.empty_cache()
        t = time.perf_counter()
        with PeakMeter(device) as meter:
            model, rss_peak = peak_rss_during(load)
        secs = time.perf_counter() - t
        resident = sum(p.numel() * p.element_size() for p in model.parameters())
        peak = rss_peak if meter.peak is None else meter.peak
        rows.append({"load": name, "device": str(device), "peak_bytes": peak, "param_bytes": resident,
                     "peak_over_params": peak / resident, "seconds": secs})
        del model
        gc.collect()
    return rows


# what one row of load_peaks() holds, checked when load_peaks.json is read back
PEAK_ROW = {"load": text, "device": text, "peak_bytes": non_negative_number, "param_bytes": positive_number,
            "peak_over_params": non_negative_number, "seconds": non_negative_number}


def read_load_peaks(path) -> dict:
    """``load_peaks.json`` as ``{"device:dtype": [row of load_peaks(), row]}``, every row checked
    (type, keys, finite non-negative numbers); an error naming the file when it is not that."""
    known = read_json(path)
    if not isinstance(known, dict):
        raise bad_file(path, f"holds {type(known).__name__}, not the {{'device:dtype': rows}} table of load_peaks")
    for key, rows in known.items():
        if not isinstance(rows, list) or len(rows) != 2:
            raise bad_file(path, f"has {str(rows)[:40]!r} under {key!r}, not the two rows of load_peaks()")
        for i, row in enumerate(rows):
            json_fields(row, path, PEAK_ROW, f"{key!r} row {i}")
    return known


def remembered_load_peaks(folder, device="cpu", dtype=torch.bfloat16) -> list[dict]:
    """:func:`load_peaks`, measured once per checkpoint and device and kept next to the checkpoint
    (``load_peaks.json``): notebooks 08 and 09 share one measurement instead of repeating it (one
    process measures; another that asks meanwhile waits for it). A file that is not what
    :func:`read_load_peaks` expects is measured again (and we say so), never trusted."""
    folder = checkpoint_dir(folder, ("config", "safetensors"))
    device, dtype = _device(device), _float_dtype(dtype)
    path = folder / "load_peaks.json"
    key = f"{device}:{str(dtype).replace('torch.', '')}"
    with file_lock(path.with_suffix(".lock")):
        try:
            known = read_load_peaks(path) if path.exists() else {}
        except ValueError as e:
            print(f"[loading] {str(e).split('. It is a file')[0]}; measuring again.")
            known = {}
        if key not in known:
            if not (folder / "pytorch_model.bin").exists():
                write_pickle_copy(folder)
            known[key] = load_peaks(folder, device, dtype)
            write_json(path, known)
    return known[key]
