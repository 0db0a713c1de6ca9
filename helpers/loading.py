"""What loading a model really costs: the peak while it loads, and how long it takes.

Two ways to load the same weights:

* **naive** — the tutorial way: build the model from its config (parameters allocated in the default
  dtype, fp32, and randomly initialised), ``torch.load`` the state dict into memory (a second copy),
  then ``load_state_dict`` (copy into the first). Peak ≈ fp32 model + the whole state dict.
* **lazy** — ``from_pretrained(dtype=…)``: the model is created on the meta device (no bytes),
  safetensors files are memory-mapped and each tensor is materialised once, in the target dtype.
  Peak ≈ the model in its dtype.

The seed document's "slow loading" advice (safetensors instead of ``.bin``) is measured here too:
safetensors reads tensors straight from a memory map; a pickled ``.bin`` is unpickled object by object
(and ``torch.load`` with ``weights_only=True`` is the only safe way to open one).

CPU peaks are resident-set peaks of this process (Linux ``VmHWM``, reset through
``/proc/self/clear_refs``; elsewhere a 5 ms sampling thread); GPU peaks are the allocator's.
"""
from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from .config import file_lock, read_json
from .measure import PeakMeter
from .models import parse_dtype, unreadable_safetensors
from .validate import bad_file, json_fields, non_negative_number, positive_number, text

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


def peak_rss_during(fn):
    """``(fn(), peak resident bytes above the start)`` for this process while ``fn`` runs."""
    if not callable(fn):
        raise TypeError(f"fn must be a function of no arguments (e.g. lambda: load_lazy(folder)), got "
                        f"{type(fn).__name__}")
    gc.collect()
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


def read_seconds(folder) -> dict:
    """Seconds to read every weight tensor into memory: safetensors vs pickled ``torch.load``
    (``weights_only=True``, and with ``mmap=True``). Each read touches every byte (a sum)."""
    folder = checkpoint_dir(folder, ("safetensors", "bin"))
    st, pkl = sorted(folder.glob("*.safetensors")), folder / "pytorch_model.bin"

    def touch(state):
        return sum(float(t.float().sum()) for t in state.values() if t.is_floating_point())

    out = {}
    for name, read in (("safetensors", lambda: {k: v for f in st for k, v in load_file(f).items()}),
                       ("torch.load", lambda: _torch_load(pkl)),
                       ("torch.load mmap", lambda: _torch_load(pkl, mmap=True))):
        t = time.perf_counter()
        touch(read())
        out[name] = time.perf_counter() - t
    return out


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
    import json
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
            path.write_text(json.dumps(known, indent=1))
    return known[key]
