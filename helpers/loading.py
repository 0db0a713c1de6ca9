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
import threading
import time
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from .config import file_lock

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


def write_pickle_copy(folder) -> Path:
    """Write the safetensors weights of ``folder`` also as a pickled ``pytorch_model.bin`` (same tensors)."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no .safetensors files: pass a checkpoint directory")
    state = {}
    for f in files:
        state.update(load_file(f))
    out = folder / "pytorch_model.bin"
    torch.save(state, out)
    return out


def read_seconds(folder) -> dict:
    """Seconds to read every weight tensor into memory: safetensors vs pickled ``torch.load``
    (``weights_only=True``, and with ``mmap=True``). Each read touches every byte (a sum)."""
    folder = Path(folder)
    st, pkl = sorted(folder.glob("*.safetensors")), folder / "pytorch_model.bin"
    if not st or not pkl.exists():
        raise FileNotFoundError(f"{folder} needs *.safetensors and pytorch_model.bin "
                                "(call write_pickle_copy(folder) first)")

    def touch(state):
        return sum(float(t.float().sum()) for t in state.values() if t.is_floating_point())

    out = {}
    for name, read in (("safetensors", lambda: {k: v for f in st for k, v in load_file(f).items()}),
                       ("torch.load", lambda: torch.load(pkl, weights_only=True)),
                       ("torch.load mmap", lambda: torch.load(pkl, weights_only=True, mmap=True))):
        t = time.perf_counter()
        touch(read())
        out[name] = time.perf_counter() - t
    return out


def load_naive(folder, device="cpu"):
    """The tutorial load: model from config in fp32 (default dtype), state dict read whole, copied in."""
    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True, map_location=device)
    model.load_state_dict(state, strict=False)
    del state
    return model


def load_lazy(folder, device="cpu", dtype=torch.bfloat16):
    """``from_pretrained``: meta-device model, memory-mapped safetensors, one copy in ``dtype``."""
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map=str(device),
                                                use_safetensors=True, trust_remote_code=False)


def load_peaks(folder, device="cpu", dtype=torch.bfloat16) -> list[dict]:
    """Peak and seconds of :func:`load_naive` and :func:`load_lazy` on ``device`` (CPU: resident set;
    CUDA: allocator peak), plus the bytes the loaded parameters hold."""
    rows = []
    for name, load in (("naive: fp32 from config + torch.load", lambda: load_naive(folder, device)),
                       (f"from_pretrained({str(dtype).replace('torch.', '')}, safetensors)",
                        lambda: load_lazy(folder, device, dtype))):
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t = time.perf_counter()
        model, rss_peak = peak_rss_during(load)
        secs = time.perf_counter() - t
        resident = sum(p.numel() * p.element_size() for p in model.parameters())
        peak = torch.cuda.max_memory_allocated() - before if cuda else rss_peak
        rows.append({"load": name, "device": str(device), "peak_bytes": peak, "param_bytes": resident,
                     "peak_over_params": peak / resident, "seconds": secs})
        del model
        gc.collect()
    return rows



def remembered_load_peaks(folder, device="cpu", dtype=torch.bfloat16) -> list[dict]:
    """:func:`load_peaks`, measured once per checkpoint and device and kept next to the checkpoint
    (``load_peaks.json``): notebooks 08 and 09 share one measurement instead of repeating it (one
    process measures; another that asks meanwhile waits for it)."""
    import json
    path = Path(folder) / "load_peaks.json"
    key = f"{device}:{str(dtype).replace('torch.', '')}"
    with file_lock(path.with_suffix(".lock")):
        try:
            known = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:          # a corrupt file is re-measured, not trusted
            known = {}
        if key not in known:
            if not (Path(folder) / "pytorch_model.bin").exists():
                write_pickle_copy(folder)
            known[key] = load_peaks(folder, device, dtype)
            path.write_text(json.dumps(known, indent=1))
    return known[key]
