"""Quantized variants of the course model: build once, store, load, and remember their scores.

* :func:`apply_quantizer` — one dispatch to RTN, GPTQ or AWQ, ours or llm-compressor's, in place;
* :func:`variant` — ``(model, meta, key)``: a quantized copy of the bench model, loaded from the
  variant store (safetensors of every decoder block's tensors — the linears and the norms AWQ folds
  its scales into — with a JSON of facts) or built and stored;
* :func:`perplexity` — the course protocol on the bench's evaluation tokens, remembered on disk under
  a key made of everything that determines the number: the evaluated tokens (hash), the model's
  weights (fingerprint) and dtype, window, stride, BOS and the quantizer version. Another text,
  another dtype, other weights — another key, never a stale score.

Every file read back is checked: a variant whose safetensors is truncated or whose size/hash does
not match its JSON is rebuilt (with a message naming the file); a score table that is corrupt, or
parses but is not a table of scores (:func:`read_scores`), is set aside and rebuilt.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from . import awq, evaluate, gptq, llm_compressor
from .calib import options_and_calibration
from .config import cache_dir, file_lock, profile, read_json, write_json
from .course_model import Bench
from .models import decoder_layers
from .qspec import QuantSpec
from .quant import rtn_model
from .validate import as_int, bad_file, flag, json_fields, non_negative_int, positive_int, positive_number, text

# Bump when one of our quantizers changes the weights it produces, so stored variants are rebuilt
# (2: AWQ scores α in bf16 on CPUs with bf16 units and clips with one bmm; 3: keys carry QuantSpec;
# 4: a variant stores every tensor of the decoder blocks, not only the linears: AWQ's scales live in the norms;
# 5: our AWQ's clip search shrinks on its n_grid instead of a fixed 20 — the same where n_grid is 20; the
# version is in the perplexity cache's key too, so cached scores are recomputed once).
CACHE_VERSION = 5
METHODS = ("rtn", "gptq", "awq")
IMPLS = ("ours", "llmcompressor")
SPEC_KEYWORDS = ("bits", "group_size", "symmetric")
# the settings of helpers.evaluate.perplexity a remembered score may override (all enter its key)
PROTOCOL_KEYS = ("seq_len", "stride", "batch_size", "max_tokens", "bos_token_id", "logits_dtype")


# ----------------------------------------------------------------------------------- quantizers
def _check_method(method, impl) -> None:
    if not (isinstance(method, str) and method in METHODS) or impl not in IMPLS or (method == "rtn" and impl != "ours"):
        raise ValueError(f"unknown quantizer method={method!r}, impl={impl!r}: methods {METHODS}, "
                         f"implementations {IMPLS} (RTN is ours only)")


# our quantizers: the options dataclass their settings go to, and the course's defaults (GPTQ: act-order
# with static groups, llm-compressor's default, so both do the same work)
OURS = {"gptq": (gptq.GPTQOptions, {"actorder": True, "static_groups": True}), "awq": (awq.AWQOptions, {})}


def quantizer_settings(method: str, impl: str = "ours", spec: QuantSpec | None = None, **kw) -> tuple[QuantSpec, dict]:
    """``(spec, settings)`` of a quantizer call, checked at the door: ``bits=``, ``group_size=``,
    ``symmetric=`` build the spec (:meth:`QuantSpec.of`: with ``spec=`` too is an error); every other
    keyword must be a setting of the quantizer that runs — a field of our options dataclass or of
    :class:`helpers.calib.CalibSpec`, a field of the options llm-compressor's bridge takes
    (:func:`helpers.llm_compressor.library_options`); RTN has none — so none is silently ignored."""
    _check_method(method, impl)
    spec = QuantSpec.of(spec, **{k: kw.pop(k) for k in SPEC_KEYWORDS if k in kw})
    if method != "rtn" and impl == "ours":
        options_type, defaults = OURS[method]
        options_and_calibration(options_type, {**defaults, **kw})        # builds both: checks every value
        return spec, kw
    allowed = set() if method == "rtn" else {f.name for f in dataclasses.fields(llm_compressor.OPTIONS_TYPES[method])}
    unknown = sorted(set(kw) - allowed)
    if unknown:
        takes = sorted(allowed) if allowed else "none besides bits=, group_size=, symmetric="
        raise TypeError(f"{method} ({impl}) has no setting {unknown}; its settings: {takes}")
    if method != "rtn":
        _library_options(method, kw)                                     # checks every value
    return spec, kw


def _library_options(method: str, settings: dict):
    """llm-compressor's defaults for ``method`` (:data:`helpers.llm_compressor.DEFAULT_OPTIONS`) with
    ``settings`` replaced, checked by :func:`helpers.llm_compressor.library_options`."""
    return llm_compressor.library_options(method, dataclasses.replace(llm_compressor.DEFAULT_OPTIONS[method], **settings))


def apply_quantizer(model, calib, method: str, impl: str = "ours", spec: QuantSpec | None = None,
                    **kw) -> dict:
    """Quantize ``model`` in place: ``method`` ∈ rtn | gptq | awq, ``impl`` ∈ ours | llmcompressor.
    ``spec`` (or ``bits=``, ``group_size=``, ``symmetric=``) is the grid; other keywords are the
    quantizer's settings (:func:`quantizer_settings`; ours split into their options and
    :class:`helpers.calib.CalibSpec`, llm-compressor's replace fields of its
    :data:`~helpers.llm_compressor.DEFAULT_OPTIONS`). GPTQ defaults to act-order with static groups (:data:`OURS`),
    like llm-compressor's default, so both do the same work. RTN uses no calibration.
    Returns ``{"seconds", "calib_tokens", …}``."""
    spec, kw = quantizer_settings(method, impl, spec, **kw)
    t0 = time.perf_counter()
    if method == "rtn":
        rtn_model(model, spec)
        info, calib = {}, None
    elif impl == "llmcompressor":
        info = llm_compressor.oneshot_quantize(model, calib, method, spec, _library_options(method, kw))
    else:
        options_type, defaults = OURS[method]
        options, calibration = options_and_calibration(options_type, {**defaults, **kw})
        run = gptq.gptq_model if method == "gptq" else awq.awq_model
        info = run(model, calib, spec, options, calibration, progress=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0, "calib_tokens": 0 if calib is None else int(calib.numel()),
            **{k: v for k, v in info.items() if k in ("alphas", "search_dtype", "batch_size")}}


# ---------------------------------------------------------------------------------------- store
def variant_key(model: str, method: str, impl: str, spec: QuantSpec | None, calib_tokens: int = 0,
                **extra) -> str:
    """A readable, stable key: ``model-method-impl-w4g64-c{calib_tokens}[-hash(extra)]``."""
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise TypeError(f"model must be the model's name or path (str), got {type(model).__name__} {model!r}")
    _check_method(method, impl)
    if spec is not None and not isinstance(spec, QuantSpec):
        raise TypeError(f"spec must be a QuantSpec or None, got {type(spec).__name__} {spec!r}")
    calib_tokens = non_negative_int(calib_tokens, "calib_tokens", "calibration tokens (calib.numel(), 0 for RTN)")
    name = Path(str(model)).name.replace("/", "_")
    key = f"{name}-{method}-{impl}-{spec.label if spec else 'none'}-c{calib_tokens}"
    if extra:
        key += "-" + hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return key


def _store() -> Path:
    return cache_dir("variants")


def _check_key(key) -> str:
    if not isinstance(key, str) or not key or any(c in key for c in "/\\") or key.startswith("."):
        raise ValueError(f"key must be a file name without folders (variant_key(...) makes one), got {key!r}")
    return key


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def block_tensors(model) -> dict[str, torch.Tensor]:
    """Every tensor a quantizer may change: the parameters and persistent buffers of the decoder blocks
    (:func:`helpers.models.decoder_layers`), named ``model.layers.{i}.`` + the name in its block — the store's
    own naming, the same for every architecture. The linears alone are not enough: AWQ
    divides the norm before each scaled group by its scales (``awq.apply_scale``), so a variant
    restored without its norms computes ``norm(x)·(W·s)`` instead of ``(norm(x)/s)·(W·s)``."""
    return {f"model.layers.{i}.{n}": t for i, layer in enumerate(decoder_layers(model))
            for n, t in layer.state_dict().items()}


def save(model, key: str, meta: dict) -> Path:
    """Store the decoder blocks' tensors (:func:`block_tensors`: the fake-quantized linears and the
    norms) as safetensors, and ``meta`` plus the file's size and SHA-256 as JSON (written last: a
    variant without its JSON is incomplete)."""
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict of facts to store with the variant, got {type(meta).__name__}")
    path = _store() / f"{_check_key(key)}.safetensors"
    save_file({n: t.detach().cpu().contiguous() for n, t in block_tensors(model).items()}, str(path))
    meta = {**meta, "file_bytes": path.stat().st_size, "sha256": _file_sha256(path)}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1, default=str))
    return path


def load(model, key: str) -> dict | None:
    """Load a stored variant into ``model`` in place and return its meta; None when it is not stored
    or fails its checks (size, hash, tensors) — then the caller rebuilds it, and we say why."""
    path, meta_path = _store() / f"{_check_key(key)}.safetensors", _store() / f"{key}.json"
    if not path.exists() or not meta_path.exists():
        return None
    problem = None
    try:
        meta = read_json(meta_path)
        if not isinstance(meta, dict):
            problem = f"its JSON holds {type(meta).__name__}, not the dict of facts save() writes"
        elif path.stat().st_size != meta.get("file_bytes") or _file_sha256(path) != meta.get("sha256"):
            problem = "its size or SHA-256 differs from what was written"
        else:
            state = load_file(str(path))
            tensors = block_tensors(model)
            missing = set(tensors) - set(state)
            if missing:
                problem = f"it lacks {sorted(missing)[:3]}"
            elif any(state[n].shape != t.shape for n, t in tensors.items()):
                problem = "its tensors' shapes differ from this model's"
    except Exception as e:  # a truncated or foreign file: any read error means "rebuild"
        problem = f"it cannot be read ({type(e).__name__}: {str(e)[:120]})"
    if problem:
        print(f"[variants] stored variant {path} is unusable: {problem}; rebuilding it.")
        path.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
        return None
    with torch.no_grad():
        for n, t in tensors.items():
            t.copy_(state[n].to(t.dtype))
    return meta


def bench_key(bench: Bench, method: str, impl: str, spec: QuantSpec, calib, **kw) -> str:
    """The store key of a variant of the bench model: everything that determines its weights — the
    calibration tokens' source (text or random ids) as well as their count, and for our AWQ the dtype
    its α search scores in when not given (:func:`helpers.awq.default_search_dtype`: it depends on the CPU)."""
    _check_bench(bench)
    if method == "awq" and impl == "ours":     # given or chosen, one field: the same search, the same variant
        kw = dict(kw)
        kw["search"] = str(kw.pop("search_dtype", None) or awq.default_search_dtype(next(bench.model.parameters())))
    return variant_key(bench.name, method, impl, spec, 0 if calib is None else calib.numel(),
                       profile=profile(), real=bench.quality_meaningful, text=bench.real_text,
                       version=CACHE_VERSION, dtype=str(bench.dtype), **kw)


def stored_meta(bench: Bench, method: str, impl: str = "ours", spec: QuantSpec | None = None, **kw) -> dict | None:
    """The facts stored with a variant (``seconds``, …) without loading its weights; None when it
    is not stored (then :func:`variant` makes it)."""
    _check_bench(bench)
    spec, kw = quantizer_settings(method, impl, spec, **kw)
    key = bench_key(bench, method, impl, spec, None if method == "rtn" else bench.calib(), **kw)
    path = _store() / f"{key}.json"
    if not path.exists() or not (_store() / f"{key}.safetensors").exists():
        return None
    meta = read_json(path)
    return meta if isinstance(meta, dict) else None     # not a dict of facts: variant() rebuilds it


def _check_bench(bench) -> None:
    if not isinstance(bench, Bench):
        raise TypeError(f"bench must be the Bench of helpers.course_model.setup(), got {type(bench).__name__}")


def variant(bench: Bench, method: str, impl: str = "ours", spec: QuantSpec | None = None,
            rebuild: bool = False, **kw):
    """``(model, meta, key)``: a quantized copy of the bench model, from the store when it was made
    before (in this or an earlier notebook), else made now and stored. ``spec`` defaults to W4 g64
    asymmetric (``bits=``, ``group_size=``, ``symmetric=`` build it too); the other keywords go to the
    quantizer (and into the key), checked by :func:`quantizer_settings`."""
    _check_bench(bench)
    spec, kw = quantizer_settings(method, impl, spec, **kw)
    rebuild = flag(rebuild, "rebuild")
    calib = None if method == "rtn" else bench.calib()
    key = bench_key(bench, method, impl, spec, calib, **kw)
    model = copy.deepcopy(bench.model)
    with file_lock(_store() / f"{key}.lock"):   # another process building the same variant: wait for it
        meta = None if rebuild else load(model, key)
        if meta is not None:
            return model, {**meta, "cached": True}, key
        meta = {**apply_quantizer(model, calib, method, impl, spec, **kw), "profile": profile(),
                "cache_version": CACHE_VERSION}
        save(model, key, meta)
    return model, {**meta, "cached": False}, key


# ------------------------------------------------------------------------------ remembered scores
@torch.no_grad()
def weights_fingerprint(model) -> str:
    """SHA-1 of every parameter's and buffer's bytes, with its name, shape and dtype (tied weights
    counted once): any change of any weight changes it. (SHA-1 identifies content here; nothing relies on it against an adversary.)"""
    _check_model(model)
    h, seen = hashlib.sha1(), set()
    for name, p in model.state_dict().items():
        h.update(f"{name}|{tuple(p.shape)}|{p.dtype}".encode())
        key = (p.data_ptr(), p.device, p.dtype, tuple(p.shape))
        if key in seen or p.numel() == 0:
            continue
        seen.add(key)
        h.update(p.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()[:16]


def score_key(model, ids: torch.Tensor, protocol: dict) -> str:
    """Everything that determines a perplexity: tokens, weights, dtype, protocol, quantizer version."""
    _check_model(model)
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"ids must be the evaluated token ids (a torch.Tensor), got {type(ids).__name__}")
    if not isinstance(protocol, dict):
        raise TypeError(f"protocol must be a dict of perplexity settings, got {type(protocol).__name__}")
    tokens = hashlib.sha256(ids.cpu().numpy().tobytes()).hexdigest()[:16]
    dtype = str(next(model.parameters()).dtype)
    proto = json.dumps(protocol, sort_keys=True, default=str)
    return f"ppl|{tokens}|{weights_fingerprint(model)}|{dtype}|{proto}|v{CACHE_VERSION}"


def _check_model(model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch model (bench.model or a variant), got {type(model).__name__}")


def _scores_path() -> Path:
    return cache_dir() / "scores.json"


# what one remembered score holds, checked when scores.json is read back
SCORE_FIELDS = {"ppl": positive_number, "scored_tokens": positive_int, "label": text}


def read_scores(path) -> dict:
    """``scores.json`` as ``{score key: {"ppl", "scored_tokens", "label"}}``, each entry checked
    (type, keys, a finite positive perplexity); an error naming the file when it is not that."""
    table = read_json(path)
    if not isinstance(table, dict):
        raise bad_file(path, f"holds {type(table).__name__}, not the {{score key: score}} table")
    for key, row in table.items():
        json_fields(row, path, SCORE_FIELDS, f"entry {key[:40]!r}")
    return table


def remembered_scores() -> dict:
    """Every remembered score (:func:`read_scores`); a corrupt file, or one that is not such a
    table, is set aside (renamed ``.corrupt``) and the scores are recomputed."""
    path = _scores_path()
    if not path.exists():
        return {}
    try:
        return read_scores(path)
    except ValueError as e:
        print(f"[variants] {str(e).split(' It is a file')[0]} Setting it aside as {path.name}.corrupt; "
              "scores will be recomputed.")
        path.replace(path.with_suffix(".json.corrupt"))
        return {}


def perplexity(bench: Bench, model=None, label: str | None = None, **protocol) -> float:
    """The course's perplexity protocol on the bench's evaluation tokens, profile-sized, remembered.

    ``model`` defaults to the bench model; ``label`` (a variant key) names the row in the table.
    ``protocol`` overrides :func:`helpers.evaluate.perplexity`'s settings (``seq_len``, ``stride``,
    ``bos_token_id``, ``max_tokens``, ``logits_dtype``, ``batch_size``); all of them enter the remembered key."""
    _check_bench(bench)
    model = bench.model if model is None else model
    _check_model(model)
    if label is not None:
        text(label, "label", "the variant key that names the row, or None")
    unknown = sorted(set(protocol) - set(PROTOCOL_KEYS))
    if unknown:
        raise TypeError(f"perplexity has no setting {unknown}; its settings: {list(PROTOCOL_KEYS)}")
    protocol = {"seq_len": bench.settings["seq_len"], "max_tokens": bench.settings["eval_tokens"], **protocol}
    if protocol["max_tokens"] is not None:
        protocol["max_tokens"] = positive_int(protocol["max_tokens"], "max_tokens", "tokens to score, or None")
    for k in ("seq_len", "stride", "batch_size", "bos_token_id"):   # plain ints: numpy's 512 and 512 share a key
        if protocol.get(k) is not None:
            protocol[k] = as_int(protocol[k], k)
    ids = bench.eval_ids[:protocol["max_tokens"]] if protocol["max_tokens"] else bench.eval_ids
    key = score_key(model, ids, {k: v for k, v in protocol.items() if k != "max_tokens"})
    table = remembered_scores()
    if key in table:
        return table[key]["ppl"]
    seq_len = protocol.pop("seq_len")
    r = evaluate.perplexity(model, bench.eval_ids, seq_len, progress=False, **protocol)
    with file_lock(_scores_path().with_suffix(".lock")):   # read again: another process may have added scores
        table = {**remembered_scores(), key: {"ppl": r["ppl"], "scored_tokens": r["scored_tokens"],
                                              "label": label or "baseline"}}
        write_json(_scores_path(), table)                   # atomic: a reader never sees half a file
    return r["ppl"]
