"""The maintained library: llm-compressor (vLLM project) GPTQ and AWQ, on the course's calibration data.

llm-compressor is the successor of AutoGPTQ/AutoAWQ; its checkpoints (compressed-tensors format)
load in vLLM and in transformers. Docs: https://docs.vllm.ai/projects/llm-compressor/.
Everything the course needs from it is in this module: the scheme (from :class:`QuantSpec`), one
``oneshot`` call (:func:`oneshot_quantize`), saving a compressed checkpoint and reading it back.

Upstream bug isolated here: llm-compressor 0.14's AWQ pins its cached activations
(``IntermediatesCache.pin_memory``) for faster host→GPU copies; pinning needs an accelerator, so on a
machine without one it fails. :func:`cpu_pin_memory_workaround` turns pinning into a no-op when no
accelerator is present (on a GPU nothing is changed).
"""
from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from . import calib as C
from .config import cache_dir, file_lock
from .models import model_from_config, unreadable_safetensors
from .qspec import QuantSpec

# _LAZY: llmcompressor, compressed-tensors and datasets are imported inside the functions that use
# them: they are optional (the course extra) and llmcompressor alone takes seconds to import.

# AutoGPTQ / AutoAWQ (archived) next to their maintained equivalents — taught as history.
API_MAP = [
    ("AutoGPTQ", "BaseQuantizeConfig(bits=4, group_size=128, desc_act=False)",
     "GPTQModifier(scheme=W4A16-like QuantizationScheme, group_size=…, actorder=None)"),
    ("AutoGPTQ", "AutoGPTQForCausalLM.from_pretrained(name, quantize_config)", "AutoModelForCausalLM.from_pretrained(name)"),
    ("AutoGPTQ", "model.quantize(examples)", "oneshot(model=…, dataset=…, recipe=GPTQModifier(...))"),
    ("AutoGPTQ", "model.save_quantized(dir)", "model.save_pretrained(dir, save_compressed=True)"),
    ("AutoGPTQ", "AutoGPTQForCausalLM.from_quantized(dir)", "AutoModelForCausalLM.from_pretrained(dir) / vllm.LLM(dir)"),
    ("AutoAWQ", "AutoAWQForCausalLM.from_pretrained(name)", "AutoModelForCausalLM.from_pretrained(name)"),
    ("AutoAWQ", "model.quantize(tok, quant_config={'w_bit': 4, 'q_group_size': 128, 'zero_point': True})",
     "oneshot(model=…, dataset=…, recipe=AWQModifier(scheme=…, n_grid=20))"),
    ("AutoAWQ", "model.save_quantized(dir)", "model.save_pretrained(dir, save_compressed=True)"),
    ("AutoAWQ", "AutoAWQForCausalLM.from_quantized(dir, fuse_layers=True)", "AutoModelForCausalLM.from_pretrained(dir) / vllm.LLM(dir)"),
]


@contextlib.contextmanager
def cpu_pin_memory_workaround():
    """Make ``IntermediatesCache.pin_memory`` a no-op while no accelerator is available (see module
    docstring); restores the original method on exit."""
    from llmcompressor.pipelines.cache import IntermediatesCache  # optional heavy dependency (see _LAZY)

    original = IntermediatesCache.pin_memory
    if not torch.accelerator.is_available():
        IntermediatesCache.pin_memory = lambda self, *a, **k: None
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = original


LIBRARIES = ("llmcompressor", "compressed_tensors")
_BAR_MODULES = ("compressed_tensors.offload.dispatch", "compressed_tensors.compressors.model_compressors.model_compressor",
                "compressed_tensors.quantization.lifecycle.apply", "llmcompressor.pipelines.sequential.pipeline",
                "llmcompressor.pipelines.basic.pipeline", "llmcompressor.pipelines.cache",
                "llmcompressor.modifiers.transform.awq.base")


def _one_bar_tqdm(bar):
    """A stand-in for the libraries' ``tqdm``: their per-layer bars ("(k/n): Calibrating", "Propagating",
    "Dispatching model", …) draw nothing; each "(k/n): Calibrating" moves ``bar`` to k of n."""
    import re

    def fake(iterable=None, *args, desc="", **kwargs):
        m = re.match(r"\((\d+)/(\d+)\): Calibrating", str(desc or ""))
        if m and bar is not None:
            bar.total = int(m.group(2))
            bar.update(int(m.group(1)) - bar.n)
        return _NoBar(iterable)
    return fake


class _NoBar:
    """A bar that draws nothing: iterates over what it wraps; every bar method (``update``,
    ``set_postfix``, ``close``, …) does nothing."""
    n = 0

    def __init__(self, iterable=None):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable if self.iterable is not None else ())

    def __len__(self):
        return len(self.iterable)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def __getattr__(self, name):
        return lambda *a, **k: None


@contextlib.contextmanager
def quiet_logs(desc: str | None = None):
    """Quiet llm-compressor and compressed-tensors for the duration of the block, so a notebook cell's
    own table stays within a screenful (JupyterLab folds after 50 outputs):

    * their loguru messages (hundreds of INFO/METRIC lines per ``oneshot``, the repeated "No
      accelerator available!"): disabled, and ``LLM_COMPRESSOR_LOG_DISABLED=true`` so that
      ``oneshot``'s own ``configure_logger`` call does not enable them again;
    * their progress bars (two per decoder layer): replaced by one bar, ``desc``, that counts the
      layers ``oneshot`` has calibrated (no bar when ``desc`` is None);
    * torch.fx's tracing warning, logged once per trace.

    Everything is restored on exit; errors still raise as usual."""
    import importlib
    import logging
    import os
    import sys

    import tqdm as tqdm_module
    from loguru import logger  # with llmcompressor (see _LAZY)

    try:  # the library logs at its own METRIC level, which only its (now skipped) configure_logger creates
        logger.level("METRIC")
    except ValueError:
        logger.level("METRIC", no=38)
    env = os.environ.get("LLM_COMPRESSOR_LOG_DISABLED")
    os.environ["LLM_COMPRESSOR_LOG_DISABLED"] = "true"
    for name in LIBRARIES:
        logger.disable(name)
    fx_log = logging.getLogger("torch.fx._symbolic_trace")
    fx_level = fx_log.level
    fx_log.setLevel(logging.ERROR)
    bar = tqdm_module.tqdm(desc=desc, unit="layer") if desc else None
    fake = _one_bar_tqdm(bar)
    for name in _BAR_MODULES:   # imported now, so that their bars are found and replaced below
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    patched = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(LIBRARIES):
            continue
        attr = getattr(mod, "tqdm", None)
        if attr is tqdm_module.tqdm:
            patched.append((mod, attr))
            mod.tqdm = fake
        elif attr is tqdm_module:
            patched.append((mod, attr))
            mod.tqdm = _Namespace(tqdm=fake)
    try:
        yield
    finally:
        for mod, attr in patched:
            mod.tqdm = attr
        if bar is not None:
            bar.close()
        fx_log.setLevel(fx_level)
        for name in LIBRARIES:
            logger.enable(name)
        if env is None:
            os.environ.pop("LLM_COMPRESSOR_LOG_DISABLED", None)
        else:
            os.environ["LLM_COMPRESSOR_LOG_DISABLED"] = env


class _Namespace:
    """``import tqdm; tqdm.tqdm(…)`` in a library module: a module-like object with one attribute."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def scheme(spec: QuantSpec | None = None, **spec_kw):
    """A compressed-tensors weight-only scheme from the course's :class:`QuantSpec`."""
    return QuantSpec.of(spec, **spec_kw).to_llmcompressor()


def _dataset(calib: torch.Tensor):
    from datasets import Dataset  # optional (the course extra)

    return Dataset.from_dict({"input_ids": calib.tolist(), "attention_mask": torch.ones_like(calib).tolist()})


def oneshot_quantize(model, calib: torch.Tensor, method: str = "gptq", spec: QuantSpec | None = None,
                     n_grid: int = 20, duo_scaling: bool = True, percdamp: float = 0.01,
                     blocksize: int = 128, tokenizer=None, **spec_kw) -> dict:
    """Quantize ``model`` in place with llm-compressor's ``oneshot`` (sequential pipeline), same
    calibration tokens as ours. ``method``: ``"gptq"`` or ``"awq"`` (AWQ scaling + RTN, as the
    library does it). Returns ``{"seconds", "calib_tokens"}``. The calibration set is already
    tokenized, so no tokenizer is needed; ``oneshot`` insists on a processor object, and without
    one it tries to load one from the model's path, so a placeholder stands in."""
    with quiet_logs():  # importing the modifiers logs "No accelerator available!" three times on a CPU
        from llmcompressor import oneshot  # optional heavy dependency (see _LAZY)
        from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
        from llmcompressor.modifiers.transform import AWQModifier

    spec = QuantSpec.of(spec, **spec_kw)
    C.check_calib(model, calib)
    groups = {"group_0": spec.to_llmcompressor()}
    if method == "rtn":  # round-to-nearest on the scheme's grid: weights only, no calibration needed
        recipe = [QuantizationModifier(config_groups=groups, ignore=["lm_head"])]
    elif method == "gptq":
        recipe = [GPTQModifier(config_groups=groups, ignore=["lm_head"], block_size=blocksize,
                               dampening_frac=percdamp)]
    elif method == "awq":
        recipe = [AWQModifier(n_grid=n_grid, duo_scaling=duo_scaling),
                  QuantizationModifier(config_groups=groups, ignore=["lm_head"])]
    else:
        raise ValueError(f"method must be 'rtn', 'gptq' or 'awq', got {method!r}")
    _give_path(model)
    t0 = time.perf_counter()
    with cpu_pin_memory_workaround(), quiet_logs(f"llm-compressor {method}"):
        if method == "rtn":  # llm-compressor's data-free pipeline: observers on the weights alone
            oneshot(model=model, recipe=recipe, pipeline="datafree")
        else:
            oneshot(model=model, dataset=_dataset(calib), recipe=recipe, max_seq_length=calib.shape[1],
                    processor=tokenizer if tokenizer is not None else _PreTokenized(),
                    num_calibration_samples=len(calib), shuffle_calibration_samples=False,
                    pipeline="sequential")
    secs = time.perf_counter() - t0
    bake(model)
    return {"seconds": secs, "calib_tokens": C.tokens_of(calib)}


@torch.no_grad()
def bake(model) -> int:
    """Write each quantized linear's effective weight, ``fake_quantize(W, weight_scale,
    weight_zero_point)``, into ``W``. After ``oneshot`` GPTQ has already written quantized values,
    but AWQ + QuantizationModifier keep the (scaled) float weights and quantize them on the fly in
    ``forward``; baking makes the weights what the model computes with (idempotent on a grid).

    On a GPU, ``oneshot`` leaves the model *offloaded* (compressed-tensors keeps each parameter on the
    CPU and onloads it for each use), so a plain ``weight.data.copy_`` writes into a temporary onloaded
    copy and is lost; the write goes through ``update_offload_parameter``, which updates both.
    Returns the number of linears baked."""
    from compressed_tensors.offload import align_module_device, update_offload_parameter  # with llmcompressor
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    n = 0
    for mod in model.modules():
        args = getattr(getattr(mod, "quantization_scheme", None), "weights", None)
        if isinstance(mod, torch.nn.Linear) and args is not None and hasattr(mod, "weight_scale"):
            with align_module_device(mod):
                zp = getattr(mod, "weight_zero_point", None)
                baked = fake_quantize(mod.weight, mod.weight_scale, zp, args)
            update_offload_parameter(mod, "weight", baked)
            n += 1
    return n


def _give_path(model) -> None:
    """llm-compressor re-reads the model's config from ``config._name_or_path``; a model built from a
    config in memory has none, so write its config to a temporary directory and point there."""
    path = str(getattr(model.config, "_name_or_path", "") or "")
    if not path or not Path(path).is_dir():
        tmp = tempfile.mkdtemp(prefix="course-config-")
        model.config.save_pretrained(tmp)
        model.config._name_or_path = tmp


class _PreTokenized:
    """Stands in for a tokenizer: the course passes token ids, never text."""


def save_compressed(model, tokenizer, out_dir) -> dict:
    """Write a real compressed-tensors checkpoint (packed int weights) and report its bytes."""
    import warnings

    out = Path(out_dir)
    with quiet_logs(), warnings.catch_warnings():
        # compressed-tensors keeps parameters "offloaded" after oneshot; transformers warns about the shard
        # size of offloaded saves, which does not apply to models that fit in memory like these
        warnings.filterwarnings("ignore", message="Attempting to save a model with offloaded modules")
        model.save_pretrained(out, save_compressed=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    files = {p.name: p.stat().st_size for p in out.glob("*.safetensors")}
    return {"dir": str(out), "safetensors_bytes": sum(files.values()), "files": files}


def demo_checkpoints(arch: str = "SmolLM2-135M", spec: QuantSpec | None = None) -> dict[str, Path]:
    """A dense bf16 checkpoint of ``arch`` (random weights) and the same weights as a W4 compressed-tensors
    checkpoint (llm-compressor round-to-nearest: the bytes do not depend on the algorithm), built once into
    the course cache and shared by notebooks 07 and 08. Returns ``{"bf16": dir, "w4gG": dir}``."""
    spec = spec or QuantSpec(4, 64)
    root = cache_dir("checkpoints", arch)
    dirs = {"bf16": root / "bf16", f"w{spec.bits}g{spec.group_size}": root / f"w{spec.bits}g{spec.group_size}"}
    with file_lock(root / ".lock"):   # notebooks 07-09 in parallel: one builds, the others wait
        if all((d / "config.json").exists() and list(d.glob("*.safetensors")) and not unreadable_safetensors(d)
               for d in dirs.values()):
            return dirs
        src = model_from_config(arch, device="cpu", dtype=torch.bfloat16)
        src.save_pretrained(dirs["bf16"], safe_serialization=True)
        oneshot_quantize(src, torch.randint(3, 1000, (2, 64), generator=torch.Generator().manual_seed(0)), "rtn", spec)
        save_compressed(src, None, list(dirs.values())[1])
    return dirs


def load_compressed(path, device="cpu", dtype=torch.float32):
    """Reload a compressed-tensors checkpoint with plain transformers (linears stay packed; each is
    dequantized when it runs)."""
    with quiet_logs():
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False,
                                                    use_safetensors=True).to(device).eval()


@torch.no_grad()
def roundtrip(model, tokenizer, out_dir, probe: torch.Tensor) -> dict:
    """Save ``model`` as a compressed checkpoint, reload it with plain transformers and compare the
    two on ``probe`` token ids [batch, tokens]: ``save_compressed``'s report plus
    ``max_abs_logit_diff`` and ``agreement`` (share of positions with the same greedy next token)."""
    p = next(model.parameters())
    probe = probe.to(p.device)
    before = model(probe).logits.float()
    info = save_compressed(model, tokenizer, out_dir)
    back = load_compressed(info["dir"], device=p.device, dtype=p.dtype)
    with quiet_logs():   # the first forward decompresses the weights (compressed-tensors' hook, with bars)
        after = back(probe).logits.float()
    del back
    return {**info, "max_abs_logit_diff": (after - before).abs().max().item(),
            "agreement": (after.argmax(-1) == before.argmax(-1)).float().mean().item()}
