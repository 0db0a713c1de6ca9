"""How a serving engine plans its memory at start-up (vLLM's rule, re-implemented and checked).

vLLM does not grow its KV cache as requests arrive, as ``generate`` does: at start-up it profiles
one forward pass at the largest batch it will schedule and pre-allocates everything left as a pool
of fixed-size KV blocks (PagedAttention, Kwon et al. 2023, arXiv:2309.06180, §4.1–4.2):

    usable      = gpu_memory_utilization × total GPU memory
    KV pool     = usable − weights − PyTorch activation peak (profiled) − non-torch memory
    blocks      = ⌊ KV pool / block bytes ⌋,    block bytes = block_size · Σ_layers bytes per token and layer
    max tokens  = blocks · block_size,          concurrency at max_model_len = max tokens / max_model_len

and refuses to start when the pool is empty or cannot hold one sequence of ``max_model_len`` tokens
(the messages in :class:`EngineStartupError` follow vLLM's ``vllm/v1/core/kv_cache_utils.py``).
The log lines this module parses and reproduces are vLLM's ``Memory profiling`` report, e.g.
vllm-project/vllm#12330 (Llama-3-8B on an A100-40GB).

So the KV format decides a *start-up* failure only in such an engine: ``--kv-cache-dtype fp8``
halves the block bytes and doubles the blocks; a quantized checkpoint moves memory from weights to KV.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import torch

from .budget_inputs import dtype_bytes
from .budget_kv import layer_windows
from .budget_shape import Shape
from .units import GiB
from .validate import model_config, non_negative_number, number_in, one_of, positive_int, positive_number

KV_CACHE_DTYPES = {"auto": None, "bfloat16": "bf16", "float16": "fp16", "fp8": "fp8", "fp8_e4m3": "fp8",
                   "fp8_e5m2": "fp8"}
MODEL_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
                torch.float32: "fp32"}
PROFILE_FIELDS = ("total", "utilization", "weights", "activation_peak", "non_torch")


class EngineStartupError(ValueError):
    """The engine cannot start: no room for KV blocks, or one ``max_model_len`` sequence does not fit."""


@dataclass(frozen=True)
class MemoryProfile:
    """The numbers vLLM's start-up profile reports, in bytes (``utilization`` is the fraction
    ``gpu_memory_utilization``); validated when built: finite, ``total > 0``, the rest ≥ 0."""
    total: float
    utilization: float
    weights: float
    activation_peak: float
    non_torch: float

    def __post_init__(self):
        checked = {"total": positive_number(self.total, "total", "the GPU's memory in bytes"),
                   "utilization": number_in(self.utilization, "utilization (gpu_memory_utilization)", 0, 1,
                                            low_open=True, hint="vLLM's default is 0.9")}
        for name in ("weights", "activation_peak", "non_torch"):
            checked[name] = non_negative_number(getattr(self, name), name, "a number of bytes")
        for name, value in checked.items():
            object.__setattr__(self, name, value)


def kv_bytes_per_token(config, kv_cache_dtype: str = "auto", model_dtype: str = "bf16") -> int:
    """Bytes one token occupies in the KV pool, summed over layers:
    ``layers · 2 · kv_heads · head_dim · bytes`` (``auto`` = the model's dtype; ``fp8`` = 1 byte).

    vLLM gives sliding-window layers their own, smaller pools; this planner refuses such configs
    rather than over-counting them (use :func:`helpers.budget.kv_bytes` for those caches)."""
    one_of(kv_cache_dtype, "kv_cache_dtype", KV_CACHE_DTYPES, hint="vLLM's --kv-cache-dtype")
    model_dtype = MODEL_DTYPES[one_of(model_dtype, "model_dtype", MODEL_DTYPES,
                                      hint="the dtype the model runs in (bf16, fp16 or fp32)")]
    model_config(config)
    if any(w is not None for w in layer_windows(config)):
        raise ValueError("this config has sliding-window layers: vLLM plans them as separate KV groups, which "
                         "this planner does not model; plan a full-attention config")
    s = Shape.from_config(config)
    fmt = KV_CACHE_DTYPES[kv_cache_dtype] or model_dtype
    return int(s.layers * 2 * s.kv_heads * s.head_dim * dtype_bytes(fmt))


def plan(profile: MemoryProfile, per_token: int, max_model_len: int, block_size: int = 16) -> dict:
    """vLLM's start-up plan from a memory profile: KV pool bytes, blocks, tokens and concurrency.

    Raises :class:`EngineStartupError` where vLLM refuses to start."""
    profile = _check_profile(profile)
    per_token = positive_int(per_token, "per_token", "bytes per token, from kv_bytes_per_token(config, ...)")
    max_model_len = positive_int(max_model_len, "max_model_len", "tokens of the longest request")
    block_size = positive_int(block_size, "block_size", "tokens per KV block (vLLM's default is 16)")
    usable = profile.utilization * profile.total
    pool = usable - profile.weights - profile.activation_peak - profile.non_torch
    block_bytes = per_token * block_size
    if pool <= 0:
        raise EngineStartupError(
            f"No available memory for the cache blocks: usable {usable / GiB:.2f} GiB − weights "
            f"{profile.weights / GiB:.2f} − activation peak {profile.activation_peak / GiB:.2f} − non-torch "
            f"{profile.non_torch / GiB:.2f} = {pool / GiB:.2f} GiB. Try increasing `gpu_memory_utilization` "
            "when initializing the engine (or a smaller/quantized model, or a smaller --max-num-batched-tokens).")
    blocks = int(pool // block_bytes)
    max_tokens = blocks * block_size
    needed = math.ceil(max_model_len / block_size) * block_bytes
    if needed > pool:
        raise EngineStartupError(
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({needed / GiB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({pool / GiB:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{max_tokens}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.")
    return {"usable": usable, "kv_pool": pool, "block_bytes": block_bytes, "blocks": blocks,
            "max_tokens": max_tokens, "concurrency": max_tokens / max_model_len, **asdict(profile)}


_LOG_FIELDS = {
    "total": r"total_gpu_memory \(([\d.]+)GiB\)",
    "utilization": r"gpu_memory_utilization \(([\d.]+)\)",
    "weights": r"model weights take ([\d.]+)GiB",
    "non_torch": r"non_torch_memory takes ([\d.]+)GiB",
    "activation_peak": r"activation peak memory takes ([\d.]+)GiB",
}


def _check_profile(profile) -> MemoryProfile:
    if not isinstance(profile, MemoryProfile):
        raise TypeError(f"profile must be a MemoryProfile (MemoryProfile(...), profile_from_log(parse_vllm_log(text)) "
                        f"or measure_profile(model)), got {type(profile).__name__}")
    return profile


def parse_vllm_log(text: str) -> dict:
    """The profile, the reported KV pool, blocks and concurrency from vLLM's start-up log lines
    (the ``worker.py`` "Memory profiling" format of vLLM 0.6–0.8; GiB values are rounded to 0.01).
    The profile it reads is checked as :class:`MemoryProfile` checks it."""
    if isinstance(text, bytes):
        raise TypeError("text must be the log as a str, got bytes: decode it first (text.decode())")
    if not isinstance(text, str):
        raise TypeError(f"text must be vLLM's start-up log as a str, got {type(text).__name__}")
    out = {}
    for key, pattern in _LOG_FIELDS.items():
        m = re.search(pattern, text)
        if not m:
            raise ValueError(f"the log has no {key!r} field (looked for /{pattern}/): paste the lines starting at "
                             "'the current vLLM instance can use total_gpu_memory'")
        out[key] = float(m.group(1)) * (1 if key == "utilization" else GiB)
    if m := re.search(r"reserved for KV Cache is ([\d.]+)GiB", text):
        out["kv_pool"] = float(m.group(1)) * GiB
    if m := re.search(r"# GPU blocks: (\d+)", text):
        out["blocks"] = int(m.group(1))
    if m := re.search(r"Maximum concurrency for (\d+) tokens per request: ([\d.]+)x", text):
        out["max_model_len"], out["concurrency"] = int(m.group(1)), float(m.group(2))
    try:
        profile_from_log(out)
    except ValueError as e:
        raise ValueError(f"the log reports an impossible profile: {e}") from None
    return out


def profile_from_log(parsed: dict) -> MemoryProfile:
    """The :class:`MemoryProfile` of a :func:`parse_vllm_log` result."""
    if not isinstance(parsed, dict):
        raise TypeError(f"parsed must be the dict parse_vllm_log(text) returns, got {type(parsed).__name__}")
    missing = [k for k in PROFILE_FIELDS if k not in parsed]
    if missing:
        raise ValueError(f"parsed lacks {missing}: pass the dict parse_vllm_log(text) returns")
    return MemoryProfile(**{k: parsed[k] for k in PROFILE_FIELDS})


def rounding_bounds(parsed: dict, per_token: int, block_size: int = 16) -> tuple[int, int]:
    """The block counts the log's rounded GiB values allow: each of the four byte fields is known to
    ±0.005 GiB, so the pool to ±0.005·(0.9 + 3) GiB around ``usable − weights − activation − non-torch``."""
    p = profile_from_log(parsed)
    per_token = positive_int(per_token, "per_token", "bytes per token, from kv_bytes_per_token(config, ...)")
    block_size = positive_int(block_size, "block_size", "tokens per KV block (vLLM's default is 16)")
    pool = p.utilization * p.total - p.weights - p.activation_peak - p.non_torch
    slack = 0.005 * GiB * (p.utilization + 3)
    block = per_token * block_size
    return int((pool - slack) // block), int((pool + slack) // block)


@torch.no_grad()
def measure_profile(model, max_num_batched_tokens: int = 2048, utilization: float = 0.9) -> MemoryProfile:
    """vLLM's start-up profile, measured the same way on a model already on the GPU: weights = the
    bytes of the model's own tensors (:func:`helpers.measure.module_bytes`; vLLM reads the memory its
    model loading took, which is the same bytes, while anything else live here — an earlier cell's
    tensors — is not the model's); activation peak = the allocator's peak during one forward over
    ``max_num_batched_tokens`` tokens above what was live before it; non-torch = this process's device
    memory outside PyTorch's allocator (NVML per process − reserved: its CUDA context, cuBLAS
    workspaces), never other processes' memory. Where the driver reports no per-process memory, vLLM's
    own measure: how much the device's memory outside PyTorch grew during the profiling forward (other
    processes' constant memory cancels; the context created before is then not counted). ``total`` is
    the card's memory, or the emulated card's under ``COURSE_GPU_GIB`` (:func:`helpers.device.card_gib`)."""
    max_num_batched_tokens = positive_int(max_num_batched_tokens, "max_num_batched_tokens",
                                          "tokens of the profiling forward (vLLM's --max-num-batched-tokens)")
    utilization = number_in(utilization, "utilization (gpu_memory_utilization)", 0, 1, low_open=True,
                            hint="vLLM's default is 0.9")
    model_config(getattr(model, "config", None), "model.config")
    if not torch.cuda.is_available():
        raise RuntimeError("measure_profile needs a CUDA device (on CPU, plan from a vLLM log or from budget())")
    from .data import random_ids
    from .device import card_gib
    from .measure import PeakMeter, module_bytes, non_torch_bytes
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free0, total = torch.cuda.mem_get_info()
    outside0 = (total - free0) - torch.cuda.memory_reserved()
    weights = module_bytes(model)
    ids = random_ids(model.config.vocab_size, (1, max_num_batched_tokens))
    with PeakMeter() as meter:                  # its base: all that is live now (the weights among it)
        model(input_ids=ids.cuda(), use_cache=False, logits_to_keep=1)
    activation = meter.peak
    non_torch = non_torch_bytes(torch.cuda.current_device())
    if non_torch is None:
        free, _ = torch.cuda.mem_get_info()
        non_torch = (total - free) - torch.cuda.memory_reserved() - outside0
    non_torch = max(0, non_torch)
    card = card_gib()
    if card is not None:
        total = int(card * GiB)
    return MemoryProfile(total=total, utilization=utilization, weights=weights, activation_peak=activation,
                         non_torch=non_torch)

