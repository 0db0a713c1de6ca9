"""Tensor parallelism run for real: a Llama decoder layer split over processes, checked against the
unsplit layer, its per-rank bytes against :mod:`helpers.parallel`'s prediction.

:func:`run` starts ``tp`` processes (``torch.multiprocessing``, :func:`_start_method`; no launcher, no code strings) that
join one ``torch.distributed`` group — gloo on CPU, NCCL on GPUs. Each builds the same full layer
(transformers' ``LlamaDecoderLayer``, same seed), keeps only its shards, as vLLM's weight loaders do:

* q/k/v and gate/up **column-parallel**: the rows of this rank's query heads, of its KV head(s)
  (``rank // kv_replicas`` when KV heads are replicated, QKVParallelLinear's rule), of its MLP columns;
* o and down **row-parallel**: the matching input columns, and an ``all_reduce`` of their outputs
  (a forward hook), which turns the partial sums into the full projection (Megatron-LM, arXiv:1909.08053 §3);
* the two RMSNorms replicated.

The rank's module is transformers' own ``LlamaDecoderLayer`` built from the rank's config
(:func:`helpers.parallel.shard_config`), so attention and the MLP run unchanged code. Each rank
reports its parameter bytes (the shards' ``numel · element_size``) next to the prediction
(:func:`helpers.parallel.layer_param_counts`), whether its output matches the full layer's
(``torch.allclose``), and on CPU the peak of live bytes of its forward (:mod:`helpers.host_alloc`)
next to the full layer's in the same process. Tiny sizes: two processes finish in seconds on a CPU.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import torch

from .models import quiet_torchao_import
from .parallel import layer_param_counts, rank_shape, shard_config
from .validate import one_of, positive_int

BACKENDS = ("gloo", "nccl")
# NVLink multicast off in NCCL, PyTorch's symmetric memory and NVSHMEM: the shared lab machines ask for it
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def tiny_config(kv_heads: int = 2, heads: int = 4, head_dim: int = 64, hidden: int = 256, intermediate: int = 512):
    """A one-layer Llama config small enough for a CPU test (random weights; shapes are what matter)."""
    from transformers import LlamaConfig
    c = LlamaConfig(hidden_size=positive_int(hidden, "hidden"), intermediate_size=positive_int(intermediate, "intermediate"),
                    num_attention_heads=positive_int(heads, "heads"), num_key_value_heads=positive_int(kv_heads, "kv_heads"),
                    head_dim=positive_int(head_dim, "head_dim"), num_hidden_layers=1, vocab_size=256)
    c._attn_implementation = "sdpa"
    return c


def full_layer(config, seed: int = 0, dtype=torch.float32, device="cpu"):
    """The unsplit layer, identical in every process: seeded init, norms randomised too (so that a
    replicated norm is really checked)."""
    quiet_torchao_import()
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    torch.manual_seed(seed)
    layer = LlamaDecoderLayer(config, layer_idx=0).to(dtype=dtype, device=device).eval()
    with torch.no_grad():
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.normal_(1.0, 0.1)
    return layer


def shard_layer(layer, config, rank: int, tp: int):
    """This rank's ``LlamaDecoderLayer`` (built from :func:`helpers.parallel.shard_config`) holding its
    slices of ``layer``'s weights — column-parallel q/k/v/gate/up, row-parallel o/down, replicated norms."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    r = rank_shape(config, tp)
    d = r.head_dim
    q_rows = slice(rank * r.heads * d, (rank + 1) * r.heads * d)
    kv0 = (rank // r.kv_replicas) * r.kv_heads                  # first KV head this rank holds
    kv_rows = slice(kv0 * d, (kv0 + r.kv_heads) * d)
    mlp = slice(rank * r.intermediate, (rank + 1) * r.intermediate)
    sc = shard_config(config, tp)
    sc._attn_implementation = config._attn_implementation
    p = next(layer.parameters())
    with torch.device(p.device):
        out = LlamaDecoderLayer(sc, layer_idx=0).to(p.dtype).eval()
    a, b = layer.self_attn, out.self_attn
    with torch.no_grad():
        b.q_proj.weight.copy_(a.q_proj.weight[q_rows])
        b.k_proj.weight.copy_(a.k_proj.weight[kv_rows])
        b.v_proj.weight.copy_(a.v_proj.weight[kv_rows])
        b.o_proj.weight.copy_(a.o_proj.weight[:, q_rows])
        out.mlp.gate_proj.weight.copy_(layer.mlp.gate_proj.weight[mlp])
        out.mlp.up_proj.weight.copy_(layer.mlp.up_proj.weight[mlp])
        out.mlp.down_proj.weight.copy_(layer.mlp.down_proj.weight[:, mlp])
        out.input_layernorm.weight.copy_(layer.input_layernorm.weight)
        out.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)
    return out


def all_reduce_row_parallel(layer, group=None) -> list:
    """Forward hooks that all-reduce the outputs of the row-parallel ``o_proj`` and ``down_proj``
    (in place, before the residual add); returns the hook handles."""
    import torch.distributed as dist

    def reduce(_module, _inputs, output):
        dist.all_reduce(output, group=group)
    return [m.register_forward_hook(reduce) for m in (layer.self_attn.o_proj, layer.mlp.down_proj)]


def _all_reduce_output(_module, _inputs, output) -> None:
    import torch.distributed as dist
    dist.all_reduce(output)


def param_bytes(module) -> int:
    """Bytes of a module's parameters: ``Σ numel · element_size``."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _inputs(config, batch, seq, dtype, device):
    quiet_torchao_import()
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, seq, config.hidden_size, generator=g).to(dtype=dtype, device=device)
    pos = torch.arange(seq, device=device)[None].expand(batch, -1)
    cos, sin = LlamaRotaryEmbedding(config).to(device)(x, pos)
    return x, (cos, sin)


def _rank_main(rank: int, tp: int, rendezvous: str, cases: list, backend: str, out_dir: str, batch: int, seq: int):
    import torch.distributed as dist
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=rendezvous, rank=rank, world_size=tp)
    rows = []
    try:
        for i, case in enumerate(cases):
            cfg = tiny_config(**case)
            x, pe = _inputs(cfg, batch, seq, torch.float32, device)
            full = full_layer(cfg, device=device)
            with torch.no_grad():
                ref = full(x, position_embeddings=pe)
            mine = shard_layer(full, cfg, rank, tp)
            peak_full = _forward_peak(full, x, pe, backend)
            del full
            hooks = all_reduce_row_parallel(mine)
            with torch.no_grad():
                out = mine(x, position_embeddings=pe)
            peak_rank = _forward_peak(mine, x, pe, backend)
            for h in hooks:
                h.remove()
            r = rank_shape(cfg, tp)
            rows.append({"case": i, "rank": rank, "tp": tp, "backend": backend, **case, "kv_heads_per_rank": r.kv_heads,
                         "kv_replicas": r.kv_replicas, "param_bytes_meas": param_bytes(mine),
                         "param_bytes_pred": layer_param_counts(cfg, tp)["total"] * 4,
                         "full_param_bytes": layer_param_counts(cfg, 1)["total"] * 4,
                         "allclose": bool(torch.allclose(out, ref, rtol=1e-5, atol=1e-5)),
                         "max_abs_diff": float((out - ref).abs().max()),
                         "forward_peak_rank": peak_rank, "forward_peak_full": peak_full})
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(rows))


def _forward_peak(layer, x, pe, backend):
    """The peak of live bytes over one forward: host_alloc on CPU, the allocator's peak on CUDA."""
    if backend == "nccl":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            layer(x, position_embeddings=pe)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from .host_alloc import peak_bytes
    try:
        return peak_bytes(lambda: layer(x, position_embeddings=pe))["peak"]
    except RuntimeError:             # no glibc mallinfo2 (not Linux): no CPU peak
        return None


def free_port() -> int:
    """A TCP port nobody listens on now, for the group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(tp: int = 2, cases=({"kv_heads": 2}, {"kv_heads": 1}), backend: str = "gloo", batch: int = 2,
        seq: int = 64) -> list[dict]:
    """Run the split layer in ``tp`` processes for each case (keyword arguments of :func:`tiny_config`:
    the default splits 2 KV heads over 2 ranks, then replicates 1 KV head on both); one row per rank and
    case: predicted and measured parameter bytes, ``allclose`` against the full layer, forward peaks."""
    tp = positive_int(tp, "tp", "processes, one per rank")
    one_of(backend, "backend", BACKENDS, hint="gloo on CPU, nccl on CUDA GPUs")
    batch, seq = positive_int(batch, "batch"), positive_int(seq, "seq")
    cases = [dict(c) for c in cases]
    for c in cases:                                  # bad sizes fail here, with vLLM's message, not in a child
        rank_shape(tiny_config(**c), tp)
    if backend == "nccl" and torch.cuda.device_count() < tp:
        raise RuntimeError(f"backend='nccl' with tp={tp} needs {tp} CUDA GPUs, found {torch.cuda.device_count()}")
    rows = _spawn(_rank_main, tp, backend, (cases, backend), batch, seq)
    return sorted(rows, key=lambda row: (row["case"], row["rank"]))


def _start_method(backend: str) -> str:
    """How the ranks start: on a Linux machine without CUDA they fork from one server process that imported
    this module, and transformers with it, once (``forkserver``: four gloo ranks start in about a second
    instead of importing transformers each); elsewhere — NCCL, a machine with CUDA (importing the helpers
    there can open a CUDA context: ``COURSE_GPU_GIB`` caps the card at import), other systems — each rank
    starts fresh (``spawn``), so no process that may have touched CUDA is forked."""
    import sys

    import torch.multiprocessing as mp
    if (backend == "nccl" or sys.platform != "linux" or torch.cuda.is_available()
            or "forkserver" not in mp.get_all_start_methods()):
        return "spawn"
    mp.get_context("forkserver").set_forkserver_preload([__name__])
    return "forkserver"


def _spawn(fn, tp, backend, args, *more) -> list:
    """``tp`` processes of ``fn(rank, tp, rendezvous, *args, out_dir, *more)``; each writes ``rank{r}.json`` (a list).
    ``rendezvous`` is the group's ``init_method``: a file in ``out_dir`` for gloo (no port that another run
    could take between choosing it and binding it), a free TCP port for NCCL."""
    import torch.multiprocessing as mp
    env = MULTICAST_OFF if backend == "nccl" else {}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)                       # the children inherit it
    try:
        with tempfile.TemporaryDirectory() as out:
            rendezvous = f"file://{Path(out, 'rendezvous')}" if backend == "gloo" else f"tcp://127.0.0.1:{free_port()}"
            mp.start_processes(fn, args=(tp, rendezvous, *args, out, *more), nprocs=tp, join=True,
                               start_method=_start_method(backend))
            return [row for r in range(tp) for row in json.loads(Path(out, f"rank{r}.json").read_text())]
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --------------------------------------------------------------------------- on GPUs: a 70B-shaped stack over NCCL
def architecture(name: str = "Llama-3-70B"):
    """``Llama-2-70B`` or ``Llama-3-70B`` (:func:`helpers.models.architecture_config`): the same layer
    shapes (hidden 8192, 64 query / 8 KV heads, MLP 28672, 80 layers); Llama-3 has a vocabulary of
    128,256 tokens and rope_theta 500,000."""
    from .models import architecture_config
    one_of(name, "arch", ("Llama-2-70B", "Llama-3-70B"))
    return architecture_config(name)


def stack_config(arch: str = "Llama-3-70B", layers: int = 4):
    """``arch`` cut to its first ``layers`` decoder layers (embedding, final norm and lm_head kept)."""
    c = architecture(arch)
    c.num_hidden_layers = positive_int(layers, "layers")
    return c


def predicted_memory(arch: str = "Llama-3-70B", tp: int = 2, layers: int = 4, batch: int = 32, seq: int = 4096,
                     activation_tokens: int = 2048) -> dict:
    """What every rank of the stack should hold, in bytes (bf16 weights and KV): the ``weights``,
    ``kv`` (``batch × seq`` tokens) and ``activations`` (one forward over ``activation_tokens``
    tokens) of :func:`helpers.parallel.per_gpu` at pipeline degree 1."""
    from .parallel import per_gpu
    batch, seq = positive_int(batch, "batch"), positive_int(seq, "seq")
    p = per_gpu(stack_config(arch, layers), tp, 1, "bf16", seq, batch, "bf16", activation_tokens, overhead_gb=0)
    return {k: p[k] for k in ("weights", "kv", "activations")}


def _memory_rank(rank: int, tp: int, rendezvous: str, spec: dict, out_dir: str):
    import time

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from .device import process_memory
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=rendezvous, rank=rank, world_size=tp,
                            device_id=dev)
    try:
        c = stack_config(spec["arch"], spec["layers"])
        sc = shard_config(c, tp)
        r = rank_shape(c, tp)
        quiet_torchao_import()
        torch.cuda.synchronize()
        a0 = torch.cuda.memory_allocated()
        with torch.device(dev):
            model = AutoModelForCausalLM.from_config(sc, dtype=torch.bfloat16).eval()
        weights = torch.cuda.memory_allocated() - a0
        mods = [model.model.embed_tokens] + [m for layer in model.model.layers
                                             for m in (layer.self_attn.o_proj, layer.mlp.down_proj)]
        hooks = [m.register_forward_hook(_all_reduce_output) for m in mods]
        ids = torch.randint(0, r.vocab_per_rank, (1, spec["activation_tokens"]), device=dev)
        with torch.no_grad():                                  # warm-up: cuBLAS workspaces, NCCL buffers
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        torch.cuda.synchronize()
        activations = torch.cuda.max_memory_allocated() - base
        for h in hooks:
            h.remove()
        k0 = torch.cuda.memory_allocated()                      # the KV pool, allocated after the profile as vLLM does
        kv = torch.empty((c.num_hidden_layers, 2, spec["batch"] * spec["seq"], r.kv_heads, r.head_dim),
                         dtype=torch.bfloat16, device=dev)
        kv_bytes = torch.cuda.memory_allocated() - k0
        torch.cuda.synchronize()
        nvml = process_memory(rank)
        row = {"rank": rank, "weights_meas": weights, "kv_meas": kv_bytes, "activations_meas": activations,
               "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
               "nvml_process": nvml.bytes, "nvml_source": nvml.source,
               "non_torch": None if nvml.bytes is None else nvml.bytes - torch.cuda.memory_reserved(),
               "kv_heads_per_rank": r.kv_heads, "vocab_per_rank": r.vocab_per_rank}
        del kv
        timing = []
        for b in spec["decode_batches"]:                        # one all-reduce of a decode step's hidden states
            x = torch.randn(b, c.hidden_size, dtype=torch.bfloat16, device=dev)
            for _ in range(10):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(spec["iters"]):
                dist.all_reduce(x)
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) * 1e3 / spec["iters"]
            timing.append({"batch": b, "bytes": b * c.hidden_size * 2, "all_reduce_us": us,
                           "per_decode_step_ms_full_model": us * 2 * architecture(spec["arch"]).num_hidden_layers / 1e3})
        row["all_reduce"] = timing
        row["wall_clock"] = time.time()
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps([row]))


def measure_memory(arch: str = "Llama-3-70B", tp: int = 2, layers: int = 4, batch: int = 32, seq: int = 4096,
                   activation_tokens: int = 2048, decode_batches=(1, 8, 32, 64, 256), iters: int = 100) -> list[dict]:
    """On ``tp`` CUDA GPUs (NCCL, NVLink multicast off: :data:`MULTICAST_OFF`): every rank builds its
    share of a ``layers``-layer ``arch`` stack (random bf16 weights, transformers' model of
    :func:`helpers.parallel.shard_config`; vocab-parallel embedding, row-parallel outputs all-reduced),
    profiles one forward over ``activation_tokens`` tokens, then allocates its KV pool for ``batch ×
    seq`` tokens; one row per rank: measured weights, activation peak, KV, allocator and NVML process
    memory, next to :func:`predicted_memory`; and the all-reduce time of a decode step's hidden states
    for each of ``decode_batches`` (× 2 per layer × 80 layers = the communication of one decode step).
    The logits are not gathered and the output is not checked here (the CPU run, :func:`run`, checks it)."""
    tp = positive_int(tp, "tp")
    pred = predicted_memory(arch, tp, layers, batch, seq, activation_tokens)
    if torch.cuda.device_count() < tp:
        raise RuntimeError(f"measure_memory needs {tp} CUDA GPUs, found {torch.cuda.device_count()}")
    spec = {"arch": arch, "layers": layers, "batch": batch, "seq": seq, "activation_tokens": activation_tokens,
            "decode_batches": [positive_int(b, "decode_batches[...]") for b in decode_batches],
            "iters": positive_int(iters, "iters")}
    rows = _spawn(_memory_rank, tp, "nccl", (spec,))
    return [{**row, **{f"{k}_pred": v for k, v in pred.items()}} for row in rows]


# --------------------------------------------------------------------------- vLLM's own split
def vllm_serve_argv(model: str, tp: int = 2, quantization: str | None = None, max_model_len: int = 4096,
                    utilization: float = 0.9) -> list[str]:
    """The ``vllm serve`` command that splits ``model`` over ``tp`` GPUs (the seed's deployment:
    ``--tensor-parallel-size 2 --gpu-memory-utilization 0.90 --max-model-len 4096``)."""
    from .validate import number_in, text
    argv = ["vllm", "serve", text(model, "model"), "--tensor-parallel-size", str(positive_int(tp, "tp")),
            "--gpu-memory-utilization", f"{number_in(utilization, 'utilization', 0, 1, low_open=True):g}",
            "--max-model-len", str(positive_int(max_model_len, "max_model_len"))]
    return argv + (["--quantization", text(quantization, "quantization")] if quantization else [])


MEMORY_LINES = ("Memory profiling", "model weights take", "KV cache", "GPU blocks", "Maximum concurrency",
                "Model loading took", "Available KV cache memory")


def vllm_startup_report(argv: list[str], timeout: float = 900) -> list[str]:
    """Start ``argv`` (a :func:`vllm_serve_argv` command), keep the log lines about memory
    (:data:`MEMORY_LINES`) until the server is up (or exits, or ``timeout`` seconds pass), then stop
    it; returns those lines and the last line seen. Needs vLLM and the GPUs; the environment gets
    :data:`MULTICAST_OFF`."""
    import subprocess
    import time
    env = {**os.environ, **MULTICAST_OFF}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    kept, last, t0 = [], "", time.time()
    try:
        for line in proc.stdout:
            last = line.rstrip()
            if any(k in line for k in MEMORY_LINES):
                kept.append(last[-200:])
            if "Application startup complete" in line or time.time() - t0 > timeout:
                break
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return kept + [f"(last line) {last[-200:]}"]
