""""Your turn" cells: the learner writes a small function, :func:`check` tests it against the course.

A cell looks like::

    def my_gemv(x, codes, scale, zero, group):
        raise NotImplementedError   # your code here
    exercises.check("w4_gemv", my_gemv)

``check`` prints ✓ or what is wrong (never raises, so *Run all* goes on). A function that still raises
``NotImplementedError`` is "not written yet". In the CI profile, wherever the notebook's version is
unwritten or broken on purpose (the clinic's repair exercises), the hidden solution
(:mod:`helpers.solutions`) is checked too, so every checker is itself tested against a correct answer
on every CI run.
"""
from __future__ import annotations

import torch

from . import solutions
from .config import is_ci
from .quant import quantize_tensor


def _w4_gemv(fn) -> str | None:
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(24, 256, generator=g), torch.randn(256, generator=g)
    q = quantize_tensor(w, bits=4, symmetric=False, granularity="group", group_size=64)
    want = q.dequantize() @ x
    got = fn(x, q.codes, q.scale, q.zero, 64)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"expected a tensor of shape {tuple(want.shape)}, got {getattr(got, 'shape', type(got).__name__)}"
    err = (got.float() - want).abs().max().item()
    return None if err < 1e-3 * want.abs().max().item() else f"max error {err:.3g} against dequantize-then-matmul"


def _narrow_split(fn) -> str | None:
    # (tiles, steps, sms, warps, per_sm): 8B q/o, 70B gate/up (16 steps), Llama-2-7B's down (43 steps), the
    # 14B-class 13824x5120 (27 steps), SmolLM2's o, a CPU's 8 "SMs"
    cases = [(128, 8, 132, 2, 16), (896, 16, 132, 2, 16), (128, 43, 132, 2, 16), (160, 27, 132, 2, 16),
             (18, 9, 132, 2, 16), (5, 9, 8, 4, 32)]
    for case in cases:
        got, want = fn(*case), solutions.narrow_split(*case)
        if got != want:
            return f"for (tiles, steps, sms, warps, per_sm) = {case} expected split {want}, got {got}"
    return None


def _programs_per_sm(fn) -> str | None:
    from .occupancy import programs_per_sm
    # (registers, warps): the prepared loop on the card (94, 72), the GEMV (128), the tensor-core kernel (167),
    # a register file's rounding (33, 48), a warp-bound and a block-bound program, the most a thread may have
    for registers, warps in ((94, 2), (72, 2), (128, 2), (167, 2), (33, 2), (48, 2), (24, 8), (16, 1), (255, 4)):
        got, want = fn(registers, warps), programs_per_sm(registers, warps)
        if got != want:
            return (f"for {registers} registers × {warps} warps expected {want} programs per SM "
                    f"(helpers.occupancy.programs_per_sm), got {got}")
    return None


def _kv_pool_blocks(fn) -> str | None:
    GiB = 1024**3   # vllm-project/vllm#12330: 35.55 − 14.96 − 9.37 − 0.10 GiB, 128 KiB per token → ~5693 blocks
    got = fn(35.55 * GiB, 14.96 * GiB, 9.37 * GiB, 0.10 * GiB, 131072)
    want = solutions.kv_pool_blocks(35.55 * GiB, 14.96 * GiB, 9.37 * GiB, 0.10 * GiB, 131072)
    return None if got == want else f"expected {want} blocks (vLLM's log says 5691 from unrounded GiB), got {got}"


def _correct_vocab_check(fn) -> str | None:
    cases = [((49152, 49152), True), ((151665, 151936), True), ((32001, 32000), False)]
    bad = [(a, want) for a, want in cases if bool(fn(*a)) != want]
    return None if not bad else f"wrong verdict for (tokenizer length, embedding rows) = {bad[0][0]}: expected {bad[0][1]}"


def _free_after_loop(fn) -> str | None:
    import gc
    import weakref
    items = [torch.ones(4), torch.ones(4)]
    refs = [weakref.ref(t) for t in items]
    fn(items)
    gc.collect()
    alive = sum(r() is not None for r in refs)
    return None if alive == 0 else f"{alive} of 2 tensors are still alive: something still references them"


def _close(a, b, rel=1e-6) -> bool:
    return abs(float(a) - float(b)) <= rel * max(1.0, abs(float(b)))


def _param_count(fn) -> str | None:
    from .budget import param_counts
    from .models import architecture_config
    for arch in ("SmolLM2-135M", "TinyLlama-1.1B"):
        c = architecture_config(arch)
        want = param_counts(c)["total"]
        got = fn(c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
                 c.num_key_value_heads, c.tie_word_embeddings)
        if got != want:
            return f"{arch}: expected {want:,} parameters (helpers.budget.param_counts), got {got}"
    return None


def _kv_cache_bytes(fn) -> str | None:
    from .budget import kv_bytes
    from .models import architecture_config
    for arch, L, b in (("SmolLM2-135M", 2048, 4), ("Llama-3.1-8B", 8192, 2)):
        c = architecture_config(arch)
        want = kv_bytes(c, L, b, "bf16")
        got = fn(c.num_hidden_layers, c.num_key_value_heads, c.hidden_size // c.num_attention_heads, L, b, 2)
        if not _close(got, want):
            return f"{arch} at {L} tokens × batch {b}: expected {want:,.0f} bytes (helpers.budget.kv_bytes), got {got}"
    return None


def _round_alloc(fn) -> str | None:
    from .allocator_sim import round_size
    for n in (1, 511, 512, 513, 1000, 2**20 + 1):
        if fn(n) != round_size(n):
            return f"round_alloc({n}) should be {round_size(n)} (helpers.allocator_sim.round_size), got {fn(n)}"
    return None


def _group_fake_quant(fn) -> str | None:
    from .quant import fake_quantize
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(1))
    want = fake_quantize(w, bits=4, symmetric=False, granularity="group", group_size=64)
    got = fn(w, 4, 64)
    err = (torch.as_tensor(got).float() - want).abs().max().item()
    return None if err < 1e-5 else f"max difference {err:.3g} from helpers.quant.fake_quantize"


def _gptq_column_step(fn) -> str | None:
    from .gptq import column_step
    from .qspec import QuantSpec
    from .quant import compute_qparams
    g = torch.Generator().manual_seed(2)
    W = torch.randn(8, 16, generator=g)
    A = torch.randn(16, 16, generator=g)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(A @ A.T + 16 * torch.eye(16))),
                                 upper=True)
    spec = QuantSpec(4, None)
    scale, zero = compute_qparams(W.amin(1), W.amax(1), 4, False)
    ref = W.clone()
    q, _ = column_step(ref, Hinv, 3, scale, zero, spec)
    got = fn(W.clone(), Hinv, 3, q)
    err = (got - ref).abs().max().item()
    return None if err < 1e-5 else f"max difference {err:.3g} from helpers.gptq.column_step"


def _awq_alpha_error(fn) -> str | None:
    from .quant import fake_quantize
    g = torch.Generator().manual_seed(3)
    w, X = torch.randn(32, 128, generator=g), torch.randn(64, 128, generator=g) * torch.linspace(0.1, 5, 128)
    for alpha in (0.0, 0.5):
        s = X.abs().mean(0).pow(alpha).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        E = fake_quantize(w * s, bits=3, symmetric=False, granularity="group", group_size=64) / s - w
        want = ((X @ E.T) ** 2).sum().item() / (64 * 32)
        if not _close(fn(w, X, alpha, 3, 64), want, 1e-4):
            return f"α={alpha}: expected {want:.6g}, got {fn(w, X, alpha, 3, 64)}"
    return None


def _ppl_from_logits(fn) -> str | None:
    import math

    from .evaluate import window_nll
    g = torch.Generator().manual_seed(4)
    logits, tokens = torch.randn(20, 50, generator=g), torch.randint(0, 50, (20,), generator=g)
    want = math.exp(window_nll(logits, tokens, 19, 19) / 19)
    return None if _close(fn(logits, tokens), want, 1e-6) else f"expected {want:.6f} (helpers.evaluate.window_nll), got {fn(logits, tokens)}"


def _int4_kv(fn) -> str | None:
    from .budget import KVLayout, kv_bytes
    from .models import architecture_config
    c = architecture_config("SmolLM2-135M")
    want = kv_bytes(c, 1, 1, "int4", KVLayout(group_size=64))          # one prompt token: no residual
    got = fn(c.num_hidden_layers, c.num_key_value_heads, c.hidden_size // c.num_attention_heads, 64)
    return None if _close(got, want) else f"expected {want:,.0f} bytes per token (helpers.budget.kv_bytes), got {got}"


def _diagnose_snapshot(fn) -> str | None:
    from .allocator_ops import fragmenting_cap, fragmenting_sequence
    from .allocator_sim import simulate
    from .units import MiB
    frag = fragmenting_sequence()
    cases = [  # (ops before the request, request, cap, what the simulator says happens)
        (frag[:-1], 128 * MiB, fragmenting_cap(), "fragmentation"),
        (frag[:-1], 64 * MiB, fragmenting_cap(), "fits"),                      # one hole is enough
        ([["alloc", "a", 600 * MiB]], 300 * MiB, 1024 * MiB, "fits"),            # a new segment stays under the cap
        ([["alloc", "a", 600 * MiB], ["alloc", "b", 300 * MiB]], 400 * MiB, 1024 * MiB, "too-big"),
        (frag[:-1] + [["alloc", "c", 64 * MiB], ["alloc", "d", 64 * MiB]], 128 * MiB, fragmenting_cap(), "fragmentation"),
        (frag[:-1], 600 * MiB, fragmenting_cap(), "too-big"),                 # 512 MiB free in all: not enough
    ]
    for ops, request, cap, want in cases:
        snap = simulate(ops, cap)["snapshot"]
        if simulate(ops + [["alloc", "request", request]], cap)["oom"] != (want != "fits"):
            raise AssertionError(f"exercise case inconsistent with the simulator: {want}")   # the checker's own check
        got = fn(snap, request, cap)
        if got != want:
            return (f"a request of {request // MiB} MiB under a {cap // MiB} MiB cap, with "
                    f"{sum(b['size'] for s in snap for b in s['blocks'] if not b['state'].startswith('active')) // MiB} "
                    f"MiB free in {len(snap)} segment(s): expected {want!r}, got {got!r}")
    return None


def _tp_kv_bytes(fn) -> str | None:
    from .models import architecture_config
    from .parallel import rank_kv_bytes_per_token
    mqa = architecture_config("Llama-2-70B")
    mqa.num_key_value_heads = 1                       # the same model with multi-query attention
    cases = [("Llama-2-70B", 2), ("Llama-2-70B", 8), ("TinyLlama-1.1B", 8), (mqa, 4)]
    tokens = 32 * 4096
    for arch, tp in cases:
        c = architecture_config(arch)
        want = rank_kv_bytes_per_token(c, tp, "bf16") * tokens
        got = fn(c.num_hidden_layers, c.num_key_value_heads, c.hidden_size // c.num_attention_heads, tp, tokens, 2)
        if not _close(got, want):
            name = arch if isinstance(arch, str) else "Llama-2-70B with 1 KV head"
            return (f"{name} ({c.num_key_value_heads} KV heads) at tp={tp}, 32 × 4096 tokens: expected {want:,.0f} "
                    f"bytes per GPU (helpers.parallel.rank_kv_bytes_per_token), got {got}")
    return None

EXERCISES = {
    "param_count": (_param_count, solutions.param_count, "embeddings (×2 unless tied) + per layer: q, k, v, o "
                    "(k and v have only kv_heads heads), gate/up/down, two norms; plus the final norm"),
    "kv_cache_bytes": (_kv_cache_bytes, solutions.kv_cache_bytes, "K and V → a factor 2; every layer, KV head, "
                       "head dimension, position and sequence"),
    "round_alloc": (_round_alloc, solutions.round_alloc, "round up to a multiple of 512; never below 512"),
    "group_fake_quant": (_group_fake_quant, solutions.group_fake_quant, "reshape to [rows, groups, group]; "
                         "min/max per group widened to include 0; scale = (max − min)/(2^b − 1); integer zero"),
    "gptq_column_step": (_gptq_column_step, solutions.gptq_column_step, "err = (w − q) / Hinv[i, i]; "
                         "W[:, i:] −= err ⊗ Hinv[i, i:]"),
    "awq_alpha_error": (_awq_alpha_error, solutions.awq_alpha_error, "s = mean|x|^α normalised by √(max·min); "
                        "quantize W·s per group, divide by s; error of X against the original"),
    "ppl_from_logits": (_ppl_from_logits, solutions.ppl_from_logits, "logits[t] predicts token t+1: "
                        "log_softmax, gather the next tokens, mean, exp"),
    "int4_kv_bytes_per_token": (_int4_kv, solutions.int4_kv_bytes_per_token, "half a byte per value, plus 4 bytes "
                                "(scale + minimum) per group, for K and V"),
    "w4_gemv": (_w4_gemv, solutions.w4_gemv, "reshape to [rows, groups, group]; sum x·q per group; "
                                               "subtract zero · Σx per group; multiply by the scale; sum groups"),
    "narrow_split": (_narrow_split, solutions.narrow_split, "target = per_sm · sms / (tiles · warps); of the divisors "
                     "of steps, the one with the smallest |log(d / target)|"),
    "programs_per_sm": (_programs_per_sm, solutions.programs_per_sm,
                        "registers per warp = ⌈32·r / 256⌉·256; each of the 4 register files of 16,384 holds "
                        "⌊16384 / that⌋ warps; then the 64 warps and 32 programs an SM holds at most"),
    "kv_pool_blocks": (_kv_pool_blocks, solutions.kv_pool_blocks,
                       "usable − weights − activation peak − non-torch, divided by bytes per block"),
    "correct_vocab_check": (_correct_vocab_check, solutions.correct_vocab_check,
                            "padded embedding tables are larger than the tokenizer; what must never happen?"),
    "free_after_loop": (_free_after_loop, solutions.free_after_loop,
                        "`del t` inside a loop deletes a name; who else holds the tensors?"),
    "diagnose_snapshot": (_diagnose_snapshot, solutions.diagnose_snapshot,
                          "reserved = Σ segment sizes; does a free block hold the request, or a new segment fit "
                          "under the cap? If not: do the free bytes add up to the request?"),
    "tp_kv_bytes_per_rank": (_tp_kv_bytes, solutions.tp_kv_bytes_per_rank,
                             "each rank keeps kv_heads / tp heads of every layer — but never less than one whole head"),
}


def check(name: str, fn) -> bool:
    """Test ``fn`` for exercise ``name``; print ✓ or the problem and a hint. Returns True on success."""
    if name not in EXERCISES:
        raise ValueError(f"unknown exercise {name!r}; known: {sorted(EXERCISES)}")
    checker, solution, hint = EXERCISES[name]
    try:
        problem = checker(fn)
    except NotImplementedError:
        if not is_ci():
            print(f"✗ {name}: not written yet — replace `raise NotImplementedError` with your code. Hint: {hint}")
            return False
        problem = checker(solution)
        if problem:
            raise AssertionError(f"the hidden solution of {name!r} fails its own check: {problem}") from None
        print(f"✓ {name}: (CI profile) the hidden solution passes the check")
        return True
    except Exception as e:  # noqa: BLE001 - the learner's code failed: say how, do not stop Run all
        print(f"✗ {name}: your function raised {type(e).__name__}: {e}. Hint: {hint}")
        return False
    print(f"✓ {name}: correct" if problem is None else f"✗ {name}: {problem}. Hint: {hint}")
    if problem is not None and is_ci():   # CI: the notebook's broken-on-purpose version fails; test the solution
        solved = checker(solution)
        if solved:
            raise AssertionError(f"the hidden solution of {name!r} fails its own check: {solved}")
        print(f"✓ {name}: (CI profile) the hidden solution passes the check")
        return True
    return problem is None
