"""Quantized variants of the course model: build once, store, load, and remember their scores.

* :func:`apply_quantizer` — one dispatch to RTN, GPTQ or AWQ, ours or llm-compressor's, in place;
* :func:`variant` — ``(model, meta, key)``: a quantized copy of the bench model, loaded from the
  variant store (safetensors of the decoder linears, with a JSON of facts) or built and stored;
* :func:`perplexity` — the course protocol on the bench's evaluation tokens, remembered on disk under
  a key made of everything that determines the number: the evaluated tokens (hash), the model's
  weights (fingerprint) and dtype, window, stride, BOS and the quantizer version. Another text,
  another dtype, other weights — another key, never a stale score.

Every file read back is checked: a variant whose safetensors is truncated or whose size/hash does
not match its JSON is rebuilt (with a message naming the file); a corrupt score table is set aside
and rebuilt.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from . import awq, evaluate, gptq, llm_compressor
from .config import cache_dir, file_lock, profile, read_json
from .course_model import Bench
from .qspec import QuantSpec
from .quant import quantizable_linears, rtn_model

# Bump when one of our quantizers changes the weights it produces, so stored variants are rebuilt
# (2: AWQ scores α in bf16 on CPUs with bf16 units and clips with one bmm; 3: keys carry QuantSpec).
CACHE_VERSION = 3
METHODS = ("rtn", "gptq", "awq")
IMPLS = ("ours", "llmcompressor")


# ----------------------------------------------------------------------------------- quantizers
def apply_quantizer(model, calib, method: str, impl: str = "ours", spec: QuantSpec | None = None,
                    **kw) -> dict:
    """Quantize ``model`` in place: ``method`` ∈ rtn | gptq | awq, ``impl`` ∈ ours | llmcompressor.
    GPTQ defaults to act-order with static groups, like llm-compressor's default, so both do the
    same work. Returns ``{"seconds", "calib_tokens", …}``."""
    spec = QuantSpec.of(spec)
    if method not in METHODS or impl not in IMPLS or (method == "rtn" and impl != "ours"):
        raise ValueError(f"unknown quantizer method={method!r}, impl={impl!r}: methods {METHODS}, "
                         f"implementations {IMPLS} (RTN is ours only)")
    t0 = time.perf_counter()
    if method == "rtn":
        rtn_model(model, spec)
        info = {}
    elif impl == "llmcompressor":
        info = llm_compressor.oneshot_quantize(model, calib, method, spec, **kw)
    elif method == "gptq":
        kw.setdefault("actorder", True)
        kw.setdefault("static_groups", True)
        info = gptq.gptq_model(model, calib, spec, progress=True, **kw)
    else:
        info = awq.awq_model(model, calib, spec, progress=True, **kw)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0, "calib_tokens": 0 if calib is None else int(calib.numel()),
            **{k: v for k, v in info.items() if k in ("alphas", "search_dtype")}}


# ---------------------------------------------------------------------------------------- store
def variant_key(model: str, method: str, impl: str, spec: QuantSpec | None, calib_tokens: int = 0,
                **extra) -> str:
    """A readable, stable key: ``model-method-impl-w4g64-c{calib_tokens}[-hash(extra)]``."""
    name = Path(str(model)).name.replace("/", "_")
    key = f"{name}-{method}-{impl}-{spec.label if spec else 'none'}-c{calib_tokens}"
    if extra:
        key += "-" + hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return key


def _store() -> Path:
    return cache_dir("variants")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def save(model, key: str, meta: dict) -> Path:
    """Store the decoder linears' (fake-quantized) weights as safetensors, and ``meta`` plus the
    file's size and SHA-256 as JSON (written last: a variant without its JSON is incomplete)."""
    path = _store() / f"{key}.safetensors"
    save_file({f"{n}.weight": m.weight.detach().cpu().contiguous()
               for n, m in quantizable_linears(model).items()}, str(path))
    meta = {**meta, "file_bytes": path.stat().st_size, "sha256": _file_sha256(path)}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1, default=str))
    return path


def load(model, key: str) -> dict | None:
    """Load a stored variant into ``model`` in place and return its meta; None when it is not stored
    or fails its checks (size, hash, tensors) — then the caller rebuilds it, and we say why."""
    path, meta_path = _store() / f"{key}.safetensors", _store() / f"{key}.json"
    if not path.exists() or not meta_path.exists():
        return None
    problem = None
    try:
        meta = read_json(meta_path)
        if path.stat().st_size != meta.get("file_bytes") or _file_sha256(path) != meta.get("sha256"):
            problem = "its size or SHA-256 differs from what was written"
        else:
            state = load_file(str(path))
            lins = quantizable_linears(model)
            missing = {f"{n}.weight" for n in lins} - set(state)
            if missing:
                problem = f"it lacks {sorted(missing)[:3]}"
    except Exception as e:  # a truncated or foreign file: any read error means "rebuild"
        problem = f"it cannot be read ({type(e).__name__}: {str(e)[:120]})"
    if problem:
        print(f"[variants] stored variant {path} is unusable: {problem}; rebuilding it.")
        path.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
        return None
    for n, m in lins.items():
        m.weight.data.copy_(state[f"{n}.weight"].to(m.weight.dtype))
    return meta


def bench_key(bench: Bench, method: str, impl: str, spec: QuantSpec, calib, **kw) -> str:
    """The store key of a variant of the bench model: everything that determines its weights."""
    return variant_key(bench.name, method, impl, spec, 0 if calib is None else calib.numel(),
                       profile=profile(), real=bench.quality_meaningful, version=CACHE_VERSION,
                       dtype=str(bench.dtype), **kw)


def stored_meta(bench: Bench, method: str, impl: str = "ours", spec: QuantSpec | None = None, **kw) -> dict | None:
    """The facts stored with a variant (``seconds``, …) without loading its weights; None when it
    is not stored (then :func:`variant` makes it)."""
    spec = QuantSpec.of(spec) if spec is not None else QuantSpec()
    key = bench_key(bench, method, impl, spec, None if method == "rtn" else bench.calib(), **kw)
    path = _store() / f"{key}.json"
    return read_json(path) if path.exists() and (_store() / f"{key}.safetensors").exists() else None


def variant(bench: Bench, method: str, impl: str = "ours", spec: QuantSpec | None = None,
            rebuild: bool = False, **kw):
    """``(model, meta, key)``: a quantized copy of the bench model, from the store when it was made
    before (in this or an earlier notebook), else made now and stored. ``spec`` defaults to W4 g64
    asymmetric; ``kw`` goes to the quantizer (and into the key)."""
    spec = QuantSpec.of(spec) if spec is not None else QuantSpec()
    calib = None if method == "rtn" else bench.calib()
    key = bench_key(bench, method, impl, spec, calib, **kw)
    model = copy.deepcopy(bench.model)
    with file_lock(_store() / f"{key}.lock"):   # another process building the same variant: wait for it
        meta = None if rebuild else load(model, key)
        if meta is not None:
            return model, {**meta, "cached": True}, key
        meta = {**apply_quantizer(model, calib, method, impl, spec, **kw), "profile": profile()}
        save(model, key, meta)
    return model, {**meta, "cached": False}, key


# ------------------------------------------------------------------------------ remembered scores
@torch.no_grad()
def weights_fingerprint(model) -> str:
    """SHA-1 of every parameter's and buffer's bytes, with its name, shape and dtype (tied weights
    counted once): any change of any weight changes it. About 0.4 s for 135 M fp32 weights on a
    2-core CPU. (SHA-1 identifies content here; nothing relies on it against an adversary.)"""
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
    tokens = hashlib.sha256(ids.cpu().numpy().tobytes()).hexdigest()[:16]
    dtype = str(next(model.parameters()).dtype)
    proto = json.dumps(protocol, sort_keys=True, default=str)
    return f"ppl|{tokens}|{weights_fingerprint(model)}|{dtype}|{proto}|v{CACHE_VERSION}"


def _scores_path() -> Path:
    return cache_dir() / "scores.json"


def remembered_scores() -> dict:
    """Every remembered score (``{score key: {"ppl", "scored_tokens", "label"}}``); a corrupt file is
    set aside (renamed ``.corrupt``) and the scores are recomputed."""
    path = _scores_path()
    if not path.exists():
        return {}
    try:
        return read_json(path)
    except ValueError as e:
        print(f"[variants] {e} Setting it aside as {path.name}.corrupt; scores will be recomputed.")
        path.replace(path.with_suffix(".json.corrupt"))
        return {}


def perplexity(bench: Bench, model=None, label: str | None = None, **protocol) -> float:
    """The course's perplexity protocol on the bench's evaluation tokens, profile-sized, remembered.

    ``model`` defaults to the bench model; ``label`` (a variant key) names the row in the table.
    ``protocol`` overrides :func:`helpers.evaluate.perplexity`'s settings (``seq_len``, ``stride``,
    ``bos_token_id``, ``max_tokens``, ``logits_dtype``); all of them enter the remembered key."""
    model = bench.model if model is None else model
    protocol = {"seq_len": bench.settings["seq_len"], "max_tokens": bench.settings["eval_tokens"], **protocol}
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
        tmp = _scores_path().with_suffix(f".json.{os.getpid()}")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(_scores_path())                         # atomic: a reader never sees half a file
    return r["ppl"]
