"""The maintained library: llm-compressor (vLLM project) GPTQ and AWQ, on the course's calibration data.

llm-compressor is the successor of AutoGPTQ/AutoAWQ; its checkpoints (compressed-tensors format)
load in vLLM and in transformers. Docs: https://docs.vllm.ai/projects/llm-compressor/.
Everything the course needs from it is in this module: the scheme (from :class:`QuantSpec`), one
``oneshot`` call (:func:`oneshot_quantize`, its settings in the course's :class:`~helpers.gptq.GPTQOptions`
and :class:`~helpers.awq.AWQOptions`, :func:`library_options`), saving a compressed checkpoint and
reading it back.

Upstream bug isolated here: llm-compressor 0.14's AWQ pins its cached activations
(``IntermediatesCache.pin_memory``) for faster host→GPU copies; pinning needs an accelerator, so on a
machine without one it fails. :func:`cpu_pin_memory_workaround` turns pinning into a no-op when no
accelerator is present (on a GPU nothing is changed).
"""
from __future__ import annotations

import contextlib
import io
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from . import calib as C
from .awq import AWQOptions
from .config import cache_dir, file_lock
from .data import random_ids
from .gptq import GPTQOptions
from .models import model_from_config, unreadable_safetensors
from .qspec import QuantSpec
from .validate import positive_int

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


class _LibraryBars(io.TextIOBase):
    """``sys.stderr`` while :func:`quiet_logs` runs. What a tqdm bar writes — a redraw starts with a
    carriage return; a bar's closing newline and its cursor moves (``\n``, ``ESC[A``) come alone — is
    dropped; a "(k/n): Calibrating" bar (the sequential pipeline's, one per decoder layer) moves
    our one bar, ``desc``, to k of n — the bar is made at the first such message, so a run that
    calibrates nothing (RTN) shows none. Any other text (warnings, errors) goes on to ``stream``."""
    _BAR_ONLY = re.compile(r"(?:\r|\n|\x1b\[A)*")
    _CALIBRATING = re.compile(r"\((\d+)/(\d+)\): Calibrating")

    def __init__(self, stream, desc: str | None = None, bar_file=None):
        super().__init__()
        self.stream, self.desc, self.bar = stream, desc, None
        self.bar_file = stream if bar_file is None else bar_file

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not s.startswith("\r") and not self._BAR_ONLY.fullmatch(s):
            return self.stream.write(s)
        layers = self._CALIBRATING.findall(s)
        if layers and self.desc:
            k, n = map(int, layers[-1])
            if self.bar is None:
                from tqdm import tqdm
                # position 0: the libraries' own bars are open too, and tqdm would stack ours below
                # them with cursor moves (ESC[A) that a notebook's output shows as stray lines
                self.bar = tqdm(desc=self.desc, unit="layer", total=n, file=self.bar_file, position=0)
            self.bar.total = n
            self.bar.update(k - self.bar.n)
        return len(s)

    def flush(self) -> None:
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        super().close()


@contextlib.contextmanager
def quiet_logs(desc: str | None = None):
    """Quiet llm-compressor and compressed-tensors for the duration of the block, so a notebook cell's
    own table stays within a screenful (JupyterLab folds after 50 outputs), with each library's own
    switch where it has one:

    * their loguru messages (hundreds of INFO/METRIC lines per ``oneshot``, the repeated "No
      accelerator available!"): ``logger.disable`` for both packages, and
      ``LLM_COMPRESSOR_LOG_DISABLED=true``, which ``oneshot``'s own ``configure_logger`` call reads
      (llmcompressor/logger.py), so that it does not enable them again;
    * transformers' and datasets' progress bars (loading weights, mapping a dataset):
      ``transformers.utils.logging.disable_progress_bar`` and ``datasets.disable_progress_bars``;
    * torch.fx's tracing warning, logged once per trace: its logger's level;
    * the two packages' own tqdm bars (two per decoder layer), which no switch turns off
      (``TQDM_DISABLE`` is read once, when tqdm is imported): ``sys.stderr`` is a
      :class:`_LibraryBars` for the block (``contextlib.redirect_stderr``); in their place one bar,
      ``desc``, counts the layers ``oneshot`` has calibrated (no bar when ``desc`` is None).

    Everything is restored on exit; errors still raise as usual."""
    import logging
    import os

    import datasets  # with llmcompressor (see _LAZY)
    import huggingface_hub.utils as hub_utils
    from loguru import logger
    from transformers.utils import logging as hf_logging

    with contextlib.ExitStack() as restore:
        try:  # the library logs at its own METRIC level, which only its (now skipped) configure_logger creates
            logger.level("METRIC")
        except ValueError:
            logger.level("METRIC", no=38)
        env = os.environ.get("LLM_COMPRESSOR_LOG_DISABLED")

        def restore_env():
            if env is None:
                os.environ.pop("LLM_COMPRESSOR_LOG_DISABLED", None)
            else:
                os.environ["LLM_COMPRESSOR_LOG_DISABLED"] = env
        os.environ["LLM_COMPRESSOR_LOG_DISABLED"] = "true"
        restore.callback(restore_env)
        for name in LIBRARIES:
            logger.disable(name)
            restore.callback(logger.enable, name)

        if hf_logging.is_progress_bar_enabled():
            hub_off = hub_utils.are_progress_bars_disabled()   # transformers' switch turns the Hub's on and off too

            def restore_hf():
                hf_logging.enable_progress_bar()
                if hub_off:
                    hub_utils.disable_progress_bars()
            hf_logging.disable_progress_bar()
            restore.callback(restore_hf)
        if not datasets.are_progress_bars_disabled():
            datasets.disable_progress_bars()
            restore.callback(datasets.enable_progress_bars)

        fx_log = logging.getLogger("torch.fx._symbolic_trace")
        restore.callback(fx_log.setLevel, fx_log.level)
        fx_log.setLevel(logging.ERROR)

        bars = _LibraryBars(sys.stderr, desc)
        restore.callback(bars.close)
        restore.enter_context(contextlib.redirect_stderr(bars))
        yield


def scheme(spec: QuantSpec | None = None, **spec_kw):
    """A compressed-tensors weight-only scheme from the course's :class:`QuantSpec`."""
    return QuantSpec.of(spec, **spec_kw).to_llmcompressor()


def _dataset(calib: torch.Tensor):
    from datasets import Dataset  # optional (the course extra)

    return Dataset.from_dict({"input_ids": calib.tolist(), "attention_mask": torch.ones_like(calib).tolist()})


METHODS = ("rtn", "gptq", "awq")
OPTIONS_TYPES = {"gptq": GPTQOptions, "awq": AWQOptions}
# llm-compressor's own defaults in the course's options: GPTQModifier(actorder="static") — columns by
# decreasing diag H, every group's grid from the original weights — blocks of 128, dampening 1 %;
# AWQModifier(n_grid=20, duo_scaling=True), which has no clipping search.
DEFAULT_OPTIONS = {"gptq": GPTQOptions(actorder=True, static_groups=True),
                   "awq": AWQOptions(duo_scaling=True, clip=False)}


def library_options(method: str, options: GPTQOptions | AWQOptions | None = None) -> GPTQOptions | AWQOptions | None:
    """``options`` checked against what llm-compressor's modifier for ``method`` can do; None gives
    :data:`DEFAULT_OPTIONS` (RTN takes none).

    * GPTQ (:class:`helpers.gptq.GPTQOptions`): ``blocksize`` → ``block_size``, ``percdamp`` →
      ``dampening_frac``, ``actorder`` → ``actorder="static"`` (or None). The library's observer
      computes every group's grid from the original weights before the column loop, which is
      ``static_groups=True``; ``static_groups=False`` is refused.
    * AWQ (:class:`helpers.awq.AWQOptions`): ``n_grid`` and ``duo_scaling`` go to ``AWQModifier``; it
      has no clipping search (``clip`` must be False) and runs its search in the model's dtype
      (``search_dtype`` must be None)."""
    if not (isinstance(method, str) and method in METHODS):
        raise ValueError(f"method must be 'rtn', 'gptq' or 'awq', got {method!r}")
    if method == "rtn":
        if options is not None:
            raise TypeError(f"options: RTN (llm-compressor's data-free pipeline) takes none, got "
                            f"{type(options).__name__}; pass options=None")
        return None
    want = OPTIONS_TYPES[method]
    if options is None:
        return DEFAULT_OPTIONS[method]
    if not isinstance(options, want):
        raise TypeError(f"options for method={method!r} must be a {want.__module__}.{want.__name__} "
                        f"(e.g. options={DEFAULT_OPTIONS[method]!r}), got {type(options).__name__}")
    if method == "gptq" and not options.static_groups:
        raise ValueError("options.static_groups=False: llm-compressor's GPTQ computes every group's grid from "
                         "the original weights, which is static_groups=True; use GPTQOptions(static_groups=True, "
                         "actorder=...)")
    if method == "awq" and options.clip:
        raise ValueError("options.clip=True: llm-compressor's AWQModifier has no clipping search; use "
                         "AWQOptions(clip=False, ...)")
    if method == "awq" and options.search_dtype is not None:
        raise ValueError(f"options.search_dtype={options.search_dtype}: llm-compressor's AWQ searches in the "
                         "model's own dtype; leave search_dtype=None")
    return options


def oneshot_quantize(model, calib: torch.Tensor, method: str = "gptq", spec: QuantSpec | None = None,
                     options: GPTQOptions | AWQOptions | None = None, tokenizer=None,
                     batch_size: int = C.CalibSpec.batch_size, **spec_kw) -> dict:
    """Quantize ``model`` in place with llm-compressor's ``oneshot`` (sequential pipeline), same
    calibration tokens as ours. ``method``: ``"rtn"`` (data-free), ``"gptq"`` or ``"awq"`` (AWQ
    scaling + RTN, as the library does it); ``options`` its settings in the course's options
    dataclass, mapped by :func:`library_options` (None: the library's defaults). Returns
    ``{"seconds", "calib_tokens", "batch_size"}``. The calibration set is already tokenized, so no
    tokenizer is needed; ``oneshot`` insists on a processor object, and without one it tries to load
    one from the model's path, so a placeholder stands in.

    ``batch_size``: calibration windows per forward, the same as ours (:class:`~helpers.calib.CalibSpec`).
    The library's own default is 1 — one forward of each layer per window, and for AWQ per window and
    grid point. The loss AWQ minimises (a sum of squared errors over all tokens, divided by their count)
    and GPTQ's Hessian (Σ x xᵀ over all tokens) do not depend on how the windows are batched, so the
    result is batch 1's up to float rounding (tests/test_llm_compressor.py)."""
    options = library_options(method, options)
    spec = QuantSpec.of(spec, **spec_kw)
    batch_size = positive_int(batch_size, "batch_size")
    C.check_calib(model, calib)
    with quiet_logs():  # importing the modifiers logs "No accelerator available!" three times on a CPU
        from llmcompressor import oneshot  # optional heavy dependency (see _LAZY)
        from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
        from llmcompressor.modifiers.transform import AWQModifier

    groups = {"group_0": spec.to_llmcompressor()}
    if method == "rtn":  # round-to-nearest on the scheme's grid: weights only, no calibration needed
        recipe = [QuantizationModifier(config_groups=groups, ignore=["lm_head"])]
    elif method == "gptq":
        recipe = [GPTQModifier(config_groups=groups, ignore=["lm_head"], block_size=options.blocksize,
                               dampening_frac=options.percdamp, actorder="static" if options.actorder else None)]
    else:
        recipe = [AWQModifier(n_grid=options.n_grid, duo_scaling=options.duo_scaling),
                  QuantizationModifier(config_groups=groups, ignore=["lm_head"])]
    _give_path(model)
    t0 = time.perf_counter()
    with cpu_pin_memory_workaround(), quiet_logs(f"llm-compressor {method}"):
        if method == "rtn":  # llm-compressor's data-free pipeline: observers on the weights alone
            oneshot(model=model, recipe=recipe, pipeline="datafree")
        else:
            oneshot(model=model, dataset=_dataset(calib), recipe=recipe, max_seq_length=calib.shape[1],
                    processor=tokenizer if tokenizer is not None else _PreTokenized(),
                    num_calibration_samples=len(calib), shuffle_calibration_samples=False,
                    batch_size=min(batch_size, len(calib)), pipeline="sequential")
    secs = time.perf_counter() - t0
    bake(model)
    return {"seconds": secs, "calib_tokens": C.tokens_of(calib), "batch_size": batch_size}


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


def quantized_linears(model) -> int:
    """How many linears of ``model`` carry llm-compressor's quantization scheme with weight scales (what
    ``save_pretrained(save_compressed=True)`` packs); 0 for a plain model — e.g. a variant loaded back from
    the course's store (:func:`helpers.variants.variant`), which holds the quantized values as dense weights."""
    return sum(1 for mod in model.modules() if isinstance(mod, torch.nn.Linear) and hasattr(mod, "weight_scale")
               and getattr(getattr(mod, "quantization_scheme", None), "weights", None) is not None)


def save_compressed(model, tokenizer, out_dir) -> dict:
    """Write a real compressed-tensors checkpoint (packed int weights) and report its bytes. ``model`` must
    be one llm-compressor quantized (:func:`oneshot_quantize`): a plain model would be written dense."""
    import warnings

    if not quantized_linears(model):
        raise ValueError("model has no linear quantized by llm-compressor (no quantization_scheme with weight "
                         "scales), so its checkpoint would be written dense: quantize it with "
                         "llm_compressor.oneshot_quantize first (a variant loaded from the store is a plain model)")
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
    the course cache and shared by notebooks 07 and 08. Returns ``{"bf16": dir, spec.label: dir}`` (``"w4g64"``;
    the label names the grid, symmetric or not, so another spec never finds this one's checkpoint)."""
    spec = spec or QuantSpec(4, 64)
    root = cache_dir("checkpoints", arch)
    dirs = {"bf16": root / "bf16", spec.label: root / spec.label}
    with file_lock(root / ".lock"):   # notebooks 07-09 in parallel: one builds, the others wait
        if all((d / "config.json").exists() and list(d.glob("*.safetensors")) and not unreadable_safetensors(d)
               for d in dirs.values()):
            return dirs
        src = model_from_config(arch, device="cpu", dtype=torch.bfloat16)
        src.save_pretrained(dirs["bf16"], safe_serialization=True)
        oneshot_quantize(src, random_ids(src.config.vocab_size, (2, 64), seed=0), "rtn", spec)
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
