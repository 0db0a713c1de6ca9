"""Low-bit matmul kernels against the bandwidth limit, on real layer shapes (CUDA only).

    python -m benchmarks.kernels --out results/h200/kernels.json [--budget-s 240]

Per (K, N) weight shape (Llama-3-8B — also with q|k|v and gate|up joined, and its LM head —, Llama-2-70B
and four other models' projections), group size and
rows M: the time of ``y = x @ W.T`` for bf16 (cuBLAS), W4A16 tinygemm (torchao ``Int4WeightOnlyConfig``,
tile-packed) and our Triton W4A16 kernels (helpers/w4_kernel.py), and at a few M INT8 weight-only
(torchao) and FP8 W8A8 rowwise (``torch._scaled_mm``, capability ≥ 8.9).

Timing (the ``timing`` column): ``cudagraph`` — :func:`helpers.timing.graph_ms`, the calls replayed
from one CUDA graph over enough copies of the weight that they exceed the L2 cache (what a decode
step sees: no launch gaps, weights from HBM); ``do_bench`` — :func:`triton.testing.do_bench`, one
call at a time with the L2 flushed (launch overhead included). ``GBps`` = the weight bytes the
kernel must read / time; ``copy_GBps`` = the measured device-to-device copy bandwidth.

One row (``M = 1``, phase G): the CUDA-core GEMV on every shape and group — every candidate block
width, warp count and split of K, the optimisation steps of :data:`STEPS`, and the shape-only rule
:func:`helpers.w4_kernel.auto_config` beside them. The tensor-core kernel (every ``M``) is chosen in
three phases, each row saying which (``phase``): A1 picks the dequantizer
and the MMA orientation, A2 the block width, groups per step, split-K reduction and warps, on three
shapes; B times the chosen family on every shape, group and M with every split of K, and the
shape-only rule :func:`helpers.w4_kernel.auto_config` beside it. Phases S and T time the shape rules'
split of K (:func:`helpers.w4_kernel.gemv_split`, :func:`helpers.w4_kernel.tc_split`) against every
split, on ``--shapes`` and, with ``--held-out``, on :data:`HELD_OUT`. Phase R (:func:`reading_bar`) times
the bar at each weight's size — a copy of its bytes, a kernel that only loads its words — and our kernel
with programmatic dependent launch; phase N (:func:`narrow_tiles`) the GEMV on phase R's fastest tiles at
every split, the rows a shape rule for them is fitted on; phase U (:func:`uneven_splits`) the rule's tile at
splits that need not divide the steps, phase V (:func:`every_span`) at every span of steps per program.
Every timed shape, group and M is checked against :func:`helpers.w4_format.reference_matmul` (``exact``).
"""
from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from helpers import decode_bench, stream_read, timing, w4_format, w4_kernel
from helpers.config import write_json

SHAPES = {  # label: (K, N) — in_features, out_features
    "8B q/o 4096x4096": (4096, 4096), "8B gate/up 4096x14336": (4096, 14336), "8B down 14336x4096": (14336, 4096),
    "70B gate/up 8192x28672": (8192, 28672), "70B down 28672x8192": (28672, 8192),
    "14B-class 5120x13824": (5120, 13824), "14B-class 13824x5120": (13824, 5120), "7B-class 3584x18944": (3584, 18944),
    "1B-class 2048x8192": (2048, 8192),
    # an engine's layout of the 8B layer (decode_bench.Recipe): q|k|v and gate|up joined, and the LM head
    "8B q|k|v 4096x6144": (4096, 6144), "8B gate|up joined 4096x28672": (4096, 28672),
    "8B lm_head 4096x128256": (4096, 128256),
}
HELD_OUT = {  # shapes no rule was fitted on (phase S): Llama-2-7B (first: added after phase N, round 9 — its down
    # projection has a prime number of steps, 43 at g128), Qwen2.5-7B/32B, Llama-3.2-3B, Mistral-Nemo-12B layouts
    "Llama-2-7B down 11008x4096": (11008, 4096), "Llama-2-7B gate|up joined 4096x22016": (4096, 22016),
    "Qwen2.5-7B gate|up joined 3584x37888": (3584, 37888), "Llama-3.2-3B gate/up 3072x8192": (3072, 8192),
    "Llama-3.2-3B down 8192x3072": (8192, 3072), "Qwen2.5-32B gate/up 5120x27648": (5120, 27648),
    "Qwen2.5-32B down 27648x5120": (27648, 5120), "Mistral-Nemo q|k|v 5120x6144": (5120, 6144),
}
FRESH = {  # a second held-out set, chosen after phase V had fitted uneven_split's rule and before it timed them:
    # rows whose groups per step shrink (Qwen2.5-72B down: 231 groups of 128, 1 per step; Qwen2.5-1.5B, Phi-3-medium:
    # 35 steps), few tiles (Llama-3.2-1B down, Gemma-2-9B down), and Yi-34B's and Gemma-2-9B's other layers
    "Qwen2.5-72B down 29568x8192": (29568, 8192), "Qwen2.5-1.5B down 8960x1536": (8960, 1536),
    "Gemma-2-9B down 14336x3584": (14336, 3584), "Gemma-2-9B gate|up joined 3584x28672": (3584, 28672),
    "Phi-3-medium down 17920x5120": (17920, 5120), "Yi-34B gate/up 7168x20480": (7168, 20480),
    "Yi-34B down 20480x7168": (20480, 7168), "Qwen2.5-3B gate|up joined 2048x22016": (2048, 22016),
    "Llama-3.2-1B down 8192x2048": (8192, 2048),
}
PHASE_A_SHAPES = ("8B gate/up 4096x14336", "70B gate/up 8192x28672")
SPLITS = (1, 2, 4, 8, 16)
STEPS = (  # the CUDA-core GEMV, one optimisation at a time (helpers/w4_kernel.py docstring); M = 1 only.
    # (label, config; SPLIT_K None = helpers.w4_kernel.gemv_split's choice, GROUPS None = 256 codes per step)
    ("gemv step 1: 32 rows per program, int→float per code", dict(BLOCK_N=32, SPLIT_K=1, MAGIC=False, num_stages=1)),
    ("gemv step 2: + split-K (every SM streams)", dict(BLOCK_N=32, SPLIT_K=None, MAGIC=False, num_stages=1)),
    ("gemv step 3: + magic-number codes in place (lop3, no int→float)",
     dict(BLOCK_N=32, SPLIT_K=None, MAGIC=True, num_stages=1)),
    ("gemv step 4: + 128 rows per program (x and scales reused)",
     dict(BLOCK_N=128, SPLIT_K=None, MAGIC=True, num_stages=1)),
    ("gemv step 5: + 256 codes of each row per step (longer runs of bytes)",
     dict(BLOCK_N=128, GROUPS=None, SPLIT_K=None, MAGIC=True, num_stages=1)),
    ("gemv tried: step 5 + the next steps' words in flight (3 stages)",
     dict(BLOCK_N=128, GROUPS=None, SPLIT_K=None, MAGIC=True, num_stages=3)),
    ("gemv step 6: + two codes per instruction (fp16 pairs, centred codes)",
     dict(BLOCK_N=128, GROUPS=None, SPLIT_K=None, MAGIC=True, HALF2=True, num_stages=1)),
    ("gemv step 7: + a group's sums kept in fp16 pairs (one conversion per group)",
     dict(BLOCK_N=128, GROUPS=None, SPLIT_K=None, MAGIC=True, HALF2=True, ACC16=True, num_stages=1)),
)


def programs_rule_split(tiles: int, steps: int, sms: int) -> int:
    """``gemv_split``'s rule up to commit 3bc3469, kept to compare against (phase S): the divisor of the
    steps nearest, by ratio, to 8 programs per multiprocessor, whatever their warps."""
    target = 8 * sms / max(tiles, 1)
    return min(w4_kernel._divisors(steps), key=lambda d: abs(math.log(d / target)))


def rel_err(x: torch.Tensor, p, cfg: dict, ref: torch.Tensor | None = None) -> float:
    """Our kernel's largest error with ``cfg`` against :func:`helpers.w4_format.reference_matmul` (``ref``:
    that product, computed once by a caller checking many configs), relative to its largest output (a row
    is ``exact`` when :func:`is_exact`)."""
    ref = w4_format.reference_matmul(x.float(), p).float() if ref is None else ref
    got = w4_kernel.w4a16_matmul(x, p, cfg, out_dtype=torch.float32)
    return w4_format.max_rel_err(got, ref)


FP16_SUMS_EXACT = 2e-3   # the relative error a kernel summing codes in fp16 pairs stays within (is_exact)
# round 17's subnormal codes (config SUBNORMAL): each word's fp16 chain starts from its centring value (itself rounded
# to fp16) instead of subtracting 8 from each code, so its first partial sums are larger than the centred loop's and
# so are its errors (Triton's interpreter, which emulates the chain: tests/test_w4_kernel.py asserts this bound)
SUBNORMAL_SUMS_EXACT = 2 * FP16_SUMS_EXACT


def is_exact(err: float, cfg: dict) -> bool:
    """Whether a relative error from :func:`rel_err` is the kernel's own rounding: ≤ 1e-3 with fp32 sums,
    ≤ 2e-3 with ``HALF2``'s fp16 sums (a few fp16 ulps of a group's sum, 2^-10 ≈ 1e-3 each; the bound the
    kernel tests hold, ``tests/test_w4_kernel.py``). Any other error is far larger (a wrong reference: > 1)."""
    return err <= (FP16_SUMS_EXACT if cfg.get("HALF2") else 1e-3)


def step_config(p, cfg: dict) -> dict:
    """A :data:`STEPS` config completed for weight ``p`` by :func:`helpers.w4_kernel.gemv_config`: one
    group per step unless the step says, and what it leaves ``None`` chosen from the shape."""
    fixed = {key: v for key, v in {"GROUPS": 1, "num_warps": 4, **cfg}.items() if v is not None}
    return w4_kernel.gemv_config(p, **fixed)


class Shape:
    """One weight shape on the GPU: bf16 copies, our packed copies per group, tinygemm per group."""

    def __init__(self, k: int, n: int, groups=(64, 128), tiny: bool = True):
        torch.manual_seed(0)
        self.k, self.n = k, n
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        self.w = [w] + [w.clone() for _ in range(timing.copies_past_l2(w.numel() * 2) - 1)]
        self.packed = {}
        self.tiny = {}
        for g in groups:
            p = w4_format.pack_w4(w, g)
            self.packed[g] = [p] + [w4_format.W4Weight(p.words.clone(), p.scale.clone(), p.zero.clone(), g, p.shape)
                                    for _ in range(timing.copies_past_l2(p.nbytes) - 1)]
            t = decode_bench.tinygemm_linear(w, g) if tiny else None
            self.tiny[g] = None if t is None else [t] + [decode_bench.tinygemm_linear(w, g)
                                                         for _ in range(timing.copies_past_l2(p.nbytes) - 1)]

    def free(self):
        self.w = self.packed = self.tiny = None
        torch.cuda.empty_cache()


def ours_ms(sh: Shape, g: int, x: torch.Tensor, cfg: dict) -> dict:
    """Our kernel with ``cfg`` on every packed copy: graph-replay ms per call (and ``do_bench`` ms)."""
    ps = sh.packed[g]
    locks = torch.zeros(4096, dtype=torch.int32, device="cuda")
    fns = [lambda p=p: w4_kernel.w4a16_matmul(x, p, cfg, locks=locks) for p in ps]
    return {"cudagraph": timing.graph_ms(fns), "do_bench": None}


READ_GRIDS = tuple((bn, wps, nw) for bn in (32, 64, 128) for wps in (32, 64, 128) for nw in (2, 4)
                   if bn * wps // (32 * nw) in (8, 16, 32, 64))   # (rows, words per step, warps): 8-64 words a thread


R_GEMV_TILES = ((32, 4), (32, 2), (16, 2), (64, 4))   # (rows per program, warps) of phase R's GEMV sweep


def read_ms(words: list, block_n: int, wps: int, split: int, num_warps: int) -> float:
    """Graph-replay ms per call of :func:`helpers.stream_read.read_words` over the weight copies' ``words``."""
    out = torch.empty(-(-words[0].shape[0] // block_n) * split, dtype=torch.int32, device="cuda")
    return timing.graph_ms([lambda w=w: stream_read.read_words(w, block_n, wps, split, out, num_warps) for w in words])


def reading_bar(sh: Shape, label: str, groups, rows_m, sms: int, add, try_ours) -> None:
    """Phase R on one shape: what reading its bytes costs at this size, beside our kernel's time.

    * ``device copy of the same bytes``: ``dst.copy_(src)`` of the packed weight's byte count, GBps counting
      each byte read and written (as ``copy_GBps`` does);
    * ``loads only, auto_config's grid``: :func:`helpers.stream_read.read_words` on the packed words with the
      GEMV's rows per program, words per step, split and warps — its grid without its arithmetic;
    * ``loads only, best grid``: the fastest of :data:`READ_GRIDS` × splits (2-64 programs per SM);
    * ``ours (auto_config)`` and ``ours (auto_config + PDL)`` at every ``rows_m``: a chain of calls, each
      launched while the one before finishes (``PDL``; helpers/w4_kernel.py ``_pdl_prologue``);
    * ``ours (GEMV, phase R sweep)``: the one-row GEMV on the loads-only kernel's kind of grid — fewer rows
      per program (:data:`R_GEMV_TILES`), 64 or 128 words of each row per step, fp32 or fp16-pair sums —
      at :func:`helpers.w4_kernel.gemv_split`'s split and its two neighbouring divisors."""
    k, n = sh.k, sh.n
    words = [p.words for p in sh.packed[groups[-1]]]
    wbytes = words[0].numel() * 4
    for g in groups:
        nbytes = sh.packed[g][0].nbytes
        pairs = [torch.empty(2, nbytes, dtype=torch.uint8, device="cuda")
                 for _ in range(timing.copies_past_l2(2 * nbytes))]   # (source, destination), none left in L2
        ms = timing.graph_ms([lambda b=b: b[1].copy_(b[0]) for b in pairs])
        add("device copy of the same bytes", f"W4A16 g{g}", label, k, n, 1, g, ms, 2 * nbytes, "cudagraph", phase="R")
        del pairs
        p0 = sh.packed[g][0]
        auto = w4_kernel.auto_config(p0, 1, w4_kernel.GEMV_RULE)
        wps = g // 8 * auto["GROUPS"]
        add("loads only, auto_config's grid", "int32 words", label, k, n, 1, g,
            read_ms(words, auto["BLOCK_N"], wps, auto["SPLIT_K"], auto["num_warps"]), wbytes, "cudagraph", phase="R",
            grid={"BLOCK_N": auto["BLOCK_N"], "WPS": wps, "SPLIT_K": auto["SPLIT_K"], "num_warps": auto["num_warps"]})
        for m in rows_m:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            auto = w4_kernel.auto_config(p0, m, w4_kernel.GEMV_RULE)
            for cfg, what in ((auto, "ours (auto_config)"), ({**auto, "PDL": True}, "ours (auto_config + PDL)")):
                ms = try_ours(sh, label, g, x, cfg, "R")     # a config that fails is recorded there, not fatal
                if ms is not None:
                    add(what, f"W4A16 g{g}", label, k, n, m, g, ms, nbytes, "cudagraph", config=cfg, phase="R",
                        exact=is_exact(rel_err(x, p0, cfg), cfg))
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ref = w4_format.reference_matmul(x.float(), p0).float()
        for (bn, nw), wps, sums in itertools.product(R_GEMV_TILES, (64, 128), ("fp32", "acc16")):
            gs = wps // (g // 8)
            if k % (g * gs):
                continue
            steps = k // (g * gs)
            divs = w4_kernel._divisors(steps)
            i = divs.index(w4_kernel.gemv_split(math.ceil(n / bn), steps, sms, nw))
            for split in divs[max(0, i - 1):i + 2]:
                cfg = w4_kernel._check_config(dict(KERNEL="gemv", BLOCK_N=bn, GROUPS=gs, SPLIT_K=split, MAGIC=True,
                                                   **w4_kernel.SUMS[sums], num_warps=nw, num_stages=1), p0, 1)
                ms = try_ours(sh, label, g, x, cfg, "R")
                if ms is not None:
                    add("ours (GEMV, phase R sweep)", f"W4A16 g{g}", label, k, n, 1, g, ms, nbytes, "cudagraph",
                        config=cfg, phase="R", exact=is_exact(rel_err(x, p0, cfg, ref), cfg))
    best = None
    for bn, wps, nw in READ_GRIDS:
        if words[0].shape[1] % wps:
            continue
        steps = words[0].shape[1] // wps
        tiles = -(-n // bn)
        for split in w4_kernel._divisors(steps):
            if not 2 * sms <= tiles * split <= 64 * sms and not (split == 1 and tiles > 64 * sms):
                continue
            ms = read_ms(words, bn, wps, split, nw)
            if best is None or ms < best[0]:
                best = (ms, {"BLOCK_N": bn, "WPS": wps, "SPLIT_K": split, "num_warps": nw})
    if best:
        add("loads only, best grid", "int32 words", label, k, n, 1, None, best[0], wbytes, "cudagraph", phase="R",
            grid=best[1])


N_TILES = ((16, 2), (32, 2), (32, 4))   # (rows per program, warps) of phase N: phase R2's best tiles


def tinygemm_row(sh: Shape, label: str, g: int, x, phase: str, held_out: bool, add) -> None:
    """tinygemm's one-row time on this shape and group (where torchao has it), a row of ``phase``."""
    if sh.tiny[g] is not None:
        add("tinygemm (torchao int4)", f"W4A16 g{g}", label, sh.k, sh.n, 1, g,
            timing.graph_ms([lambda t=t: t(x) for t in sh.tiny[g]]), sh.packed[g][0].nbytes, "cudagraph",
            phase=phase, held_out=held_out)


def narrow_tiles(sh: Shape, label: str, groups, sms: int, held_out: bool, add, try_ours) -> None:
    """Phase N on one shape: the one-row GEMV with fp16-pair sums kept per group, on :data:`N_TILES` with
    64 or 128 words of each row per step (fewer where they do not divide ``K``), at every split of ``K`` up to 64 programs per SM; beside it
    ``auto_config`` and tinygemm (``held_out`` marks a :data:`HELD_OUT` shape)."""
    k, n = sh.k, sh.n
    x = torch.randn(1, k, device=sh.packed[groups[0]][0].words.device, dtype=torch.bfloat16)
    for g in groups:
        p0, nbytes = sh.packed[g][0], sh.packed[g][0].nbytes
        tinygemm_row(sh, label, g, x, "N", held_out, add)
        auto = w4_kernel.auto_config(p0, 1, w4_kernel.GEMV_RULE)
        add("ours (Triton GEMV, auto_config)", f"W4A16 g{g}", label, k, n, 1, g, try_ours(sh, label, g, x, auto, "N"),
            nbytes, "cudagraph", config=auto, phase="N", held_out=held_out)
        ref = w4_format.reference_matmul(x.float(), p0).float()
        # groups per step: 64 or 128 words of each row, halved until they divide the row (Llama-2-7B's 86 groups)
        steps_of = sorted({w4_kernel._fitting_groups(p0, wps // (g // 8)) for wps in (64, 128)})
        for (bn, nw), gs in itertools.product(N_TILES, steps_of):
            tiles = math.ceil(n / bn)
            for split in w4_kernel._divisors(k // (g * gs)):
                if split > 1 and tiles * split > 64 * sms:
                    break
                cfg = w4_kernel._check_config(dict(KERNEL="gemv", BLOCK_N=bn, GROUPS=gs, SPLIT_K=split, MAGIC=True,
                                                   HALF2=True, ACC16=True, num_warps=nw, num_stages=1), p0, 1)
                ms = try_ours(sh, label, g, x, cfg, "N")
                if ms is not None:
                    add("ours (GEMV narrow tile, every split)", f"W4A16 g{g}", label, k, n, 1, g, ms, nbytes,
                        "cudagraph", config=cfg, phase="N", held_out=held_out,
                        exact=is_exact(rel_err(x, p0, cfg, ref), cfg))


U_PER_SM = (12, 16, 24, 32)   # warps per SM phase U fills with programs that need not divide the steps


def exactness(x: torch.Tensor, p, ref: torch.Tensor):
    """``cfg -> is_exact(rel_err(x, p, cfg, ref), cfg)``, each distinct config run once: a phase that times
    one config twice (the rule's again last) or reaches it two ways (two splits by two rules) checks it once."""
    seen = {}

    def exact(cfg: dict) -> bool:
        key = tuple(sorted(cfg.items()))
        if key not in seen:
            seen[key] = is_exact(rel_err(x, p, cfg, ref), cfg)
        return seen[key]
    return exact


def uneven_splits(sh: Shape, label: str, groups, sms: int, held_out: bool, add, try_ours) -> None:
    """Phase U on one shape: the one-row rule's tile (``narrow_gemv_config``) at the split of the rule to
    round 10 (``uneven=False``: the nearest divisor), at the largest divisor below the same target, and at
    :func:`~helpers.w4_kernel.uneven_split`'s split at 512 codes per step — programs of ``⌈steps / split⌉``
    steps, the last fewer — for one wave of :data:`U_PER_SM` warps per SM; the nearest divisor again last
    (the same config twice: the drift of the timing); beside them tinygemm,
    in one process (``held_out`` marks a :data:`HELD_OUT` shape)."""
    k, n = sh.k, sh.n
    x = torch.randn(1, k, device=sh.packed[groups[0]][0].words.device, dtype=torch.bfloat16)
    for g in groups:
        p0, nbytes = sh.packed[g][0], sh.packed[g][0].nbytes
        tinygemm_row(sh, label, g, x, "U", held_out, add)
        exact = exactness(x, p0, w4_format.reference_matmul(x.float(), p0).float())
        rule = w4_kernel.narrow_gemv_config(p0, sms=sms, uneven=False)
        tiles, steps = math.ceil(n / rule["BLOCK_N"]), k // (g * rule["GROUPS"])
        splits = {"nearest divisor (the rule)": rule["SPLIT_K"],
                  "largest divisor below": w4_kernel.gemv_split(tiles, steps, sms, rule["num_warps"],
                                                                per_sm=w4_kernel.NARROW_WARPS_PER_SM)}
        for per_sm in U_PER_SM:
            splits[f"uneven, {per_sm} warps/SM"] = w4_kernel.uneven_split(tiles, steps, sms, rule["num_warps"], per_sm)
        splits["nearest divisor (the rule), timed again last"] = rule["SPLIT_K"]   # the drift since its first row
        for how, split in splits.items():
            cfg = {**rule, "SPLIT_K": split}
            ms = try_ours(sh, label, g, x, cfg, "U")
            if ms is not None:
                add(f"ours (narrow rule tile, split: {how})", f"W4A16 g{g}", label, k, n, 1, g, ms, nbytes,
                    "cudagraph", config=cfg, phase="U", held_out=held_out, split_by=how, steps=steps, exact=exact(cfg))


def spans(steps: int, most: int) -> list[int]:
    """Every split of ``steps`` along ``K`` that gives its programs a different number of steps
    (``⌈steps / split⌉``), each the fewest programs for its span (none left empty), up to ``most`` programs:
    43 steps → 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 15, 22, 43."""
    if steps < 1 or most < 1:
        raise ValueError(f"spans needs steps and most ≥ 1, got steps={steps}, most={most}")
    return sorted({math.ceil(steps / math.ceil(steps / s)) for s in range(1, steps + 1)} & set(range(1, most + 1)))


RESIDENT_BLOCKS = 8   # blocks of 2 warps an SM holds of the rule's GEMV at 128 registers (ncu_narrow_a3a5c04.txt)


def every_span(sh: Shape, label: str, groups, sms: int, held_out: bool, add, try_ours) -> None:
    """Phase V on one shape: the one-row rule's tile (``narrow_gemv_config``) at every split of :func:`spans`
    (divisors and not: programs of ``⌈steps / split⌉`` steps, the last fewer) up to 64 programs per SM, each
    row with its programs' warps per SM and waves (programs ÷ :data:`RESIDENT_BLOCKS` per SM), the
    nearest divisor's split (``rule_split``: the rule to round 10) and :func:`~helpers.w4_kernel.uneven_split`'s
    (``candidate_split``: the rule since); both again last (the drift); tinygemm after them, in one
    process — the rows the rule for uneven splits was fitted on (runs "2026-12-06 V", "V2")."""
    k, n = sh.k, sh.n
    x = torch.randn(1, k, device=sh.packed[groups[0]][0].words.device, dtype=torch.bfloat16)
    for g in groups:
        p0, nbytes = sh.packed[g][0], sh.packed[g][0].nbytes
        exact = exactness(x, p0, w4_format.reference_matmul(x.float(), p0).float())
        rule = w4_kernel.narrow_gemv_config(p0, sms=sms, uneven=False)
        candidate = w4_kernel.narrow_gemv_config(p0, sms=sms)["SPLIT_K"]
        tiles, steps = math.ceil(n / rule["BLOCK_N"]), k // (g * rule["GROUPS"])
        todo = ([(sp, "every span") for sp in spans(steps, max(1, 64 * sms // tiles))]
                + [(rule["SPLIT_K"], "the rule, again last"), (candidate, "the candidate, again last")])
        for split, how in todo:
            cfg = {**rule, "SPLIT_K": split}
            ms = try_ours(sh, label, g, x, cfg, "V")
            if ms is not None:
                programs = tiles * split
                add(f"ours (narrow rule tile, {how})", f"W4A16 g{g}", label, k, n, 1, g, ms, nbytes, "cudagraph",
                    config=cfg, phase="V", held_out=held_out, steps=steps, span=math.ceil(steps / split),
                    rule_split=rule["SPLIT_K"], candidate_split=candidate,
                    warps_per_sm=programs * rule["num_warps"] / sms,
                    waves=programs / (RESIDENT_BLOCKS * sms), exact=exact(cfg))
        tinygemm_row(sh, label, g, x, "V", held_out, add)


def main():
    import triton
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernels")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="SHAPES' labels, comma-separated, '_' for a space "
                                                                 "('--shapes=': none, e.g. phase S or T on HELD_OUT "
                                                                 "alone)")
    ap.add_argument("--rows", default="1,2,8,16")
    ap.add_argument("--crossover-rows", default="4,32,64", help="extra M on the first phase-A shape")
    ap.add_argument("--groups", default="64,128")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop phase B (rows kept) after this many seconds")
    ap.add_argument("--phases", default="G,A,B", help="G: the one-row GEMV; A, B: the tensor-core kernel; S: the "
                                                     "GEMV's split rule against every split; T: the tensor-core "
                                                     "kernel's (both with --held-out too); R: the bar at each "
                                                     "size (copy, loads only) and PDL; N: the narrow-tile "
                                                     "GEMV at every split; U: its rule's tile at uneven "
                                                     "splits; V: at every span of steps (N, U, V with "
                                                     "--held-out too)")
    ap.add_argument("--held-out", action="store_true", help="phases S, T, N, U and V also on HELD_OUT's shapes")
    ap.add_argument("--fresh", action="store_true", help="phases S, T, N, U and V also on FRESH's shapes (held out too)")
    args = ap.parse_args()
    # labels hold spaces; "_" stands for one (a shell variable passes the list as one word), and a label's own "_"
    # ("8B lm_head ...") is matched either way
    by_spaces = {lab.replace("_", " "): lab for lab in SHAPES}
    args.shapes = ",".join(by_spaces.get(lab.replace("_", " "), lab) for lab in args.shapes.split(",") if lab)
    unknown = [lab for lab in args.shapes.split(",") if lab and lab not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; SHAPES has {list(SHAPES)}")
    phases = set(args.phases.split(","))
    if not torch.cuda.is_available():
        sys.exit("kernels.py times CUDA kernels; there is no CUDA device here")
    t_start = time.perf_counter()
    cap = torch.cuda.get_device_capability()
    copy = timing.copy_bandwidth_gbps()
    print(f"copy bandwidth {copy:.0f} GB/s on {torch.cuda.get_device_name()}", flush=True)
    groups = [int(g) for g in args.groups.split(",")]
    rows, out = [], Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "capability": list(cap), "copy_GBps": copy, "sms": torch.cuda.get_device_properties(0).multi_processor_count}

    def save():
        write_json(out, {"meta": meta, "rows": rows}, indent=1, default=str)

    def add(kernel, fmt, label, k, n, m, g, ms, nbytes, timing_kind, **extra):
        if ms is None:
            return
        row = {"kernel": kernel, "format": fmt, "shape": label, "K": k, "N": n, "M": m, "group": g, "ms": ms,
               "GBps": nbytes / (ms * 1e-3) / 1e9, "copy_GBps": copy, "timing": timing_kind, **extra}
        rows.append(row)
        print(f"{kernel[:44]:44s} {label[:22]:22s} M={m:3d} g{g or '-':<4} {ms * 1e3:8.1f} µs {row['GBps']:6.0f} GB/s "
              f"[{timing_kind}]", flush=True)

    def try_ours(sh, label, g, x, cfg, phase):
        try:
            r = ours_ms(sh, g, x, cfg)
        except Exception as e:  # noqa: BLE001 - a variant Triton cannot compile is recorded, not fatal
            rows.append({"kernel": "ours (Triton)", "shape": label, "M": x.shape[0], "group": g, "config": cfg,
                         "phase": phase, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print("  failed:", cfg, type(e).__name__, str(e)[:200], flush=True)
            return None
        return r["cudagraph"]

    def best_split(sh, label, g, x, family, phase, **extra):
        best = None
        for split in SPLITS:
            cfg = {**family, "SPLIT_K": split}
            try:
                w4_kernel._check_config(cfg, sh.packed[g][0], x.shape[0])
            except ValueError:
                continue
            ms = try_ours(sh, label, g, x, cfg, phase)
            if ms is not None:
                add("ours (Triton)", f"W4A16 g{g}", label, sh.k, sh.n, x.shape[0], g, ms, sh.packed[g][0].nbytes,
                    "cudagraph", config=cfg, phase=phase, **extra)
                if best is None or ms < best[1]:
                    best = (cfg, ms)
        return best

    # ---------------- phase G: the one-row GEMV on every shape and group: each candidate, the steps, auto_config
    for label in (args.shapes.split(",") if "G" in phases else []):
        k, n = SHAPES[label]
        sh = Shape(k, n, groups=groups)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        add("bf16 cuBLAS", "bf16", label, k, n, 1, None, timing.graph_ms([lambda w=w: x @ w.t() for w in sh.w]),
            n * k * 2, "cudagraph", phase="G")
        for g in groups:
            p0, nbytes = sh.packed[g][0], sh.packed[g][0].nbytes
            if sh.tiny[g] is not None:
                add("tinygemm (torchao int4)", f"W4A16 g{g}", label, k, n, 1, g,
                    timing.graph_ms([lambda t=t: t(x) for t in sh.tiny[g]]), nbytes, "cudagraph", phase="G")
            gemvs = [c for c in w4_kernel.candidate_configs(p0, 1) if c["KERNEL"] == "gemv"]
            for cfg in gemvs:
                add("ours (Triton GEMV)", f"W4A16 g{g}", label, k, n, 1, g, try_ours(sh, label, g, x, cfg, "G"),
                    nbytes, "cudagraph", config=cfg, phase="G")
            for step, scfg in STEPS:
                cfg = step_config(p0, scfg)
                add(step, f"W4A16 g{g}", label, k, n, 1, g, try_ours(sh, label, g, x, cfg, "G"), nbytes,
                    "cudagraph", config=cfg, phase="G")
            auto = w4_kernel.auto_config(p0, 1, w4_kernel.GEMV_RULE)
            add("ours (Triton GEMV, auto_config)", f"W4A16 g{g}", label, k, n, 1, g,
                try_ours(sh, label, g, x, auto, "G-auto"), nbytes, "cudagraph", config=auto, phase="G-auto")
            add("ours (Triton GEMV, auto_config)", f"W4A16 g{g}", label, k, n, 1, g,
                triton.testing.do_bench(lambda: w4_kernel.w4a16_matmul(x, p0, auto), return_mode="median"),
                nbytes, "do_bench", config=auto, phase="G-auto")
            ref = w4_format.reference_matmul(x.float(), p0).float()
            steps = [step_config(p0, scfg) for _, scfg in STEPS]
            for cfg in gemvs + steps + [auto]:   # every timed config, exact against the readable reference
                err = rel_err(x, p0, cfg, ref)
                for r in rows:
                    if r.get("phase", "").startswith("G") and r.get("shape") == label and r.get("group") == g \
                            and r.get("config") == cfg:
                        r["exact"], r["rel_err"] = is_exact(err, cfg), err
        sh.free()
        save()
    # ---------------- phase R: the bar at each size — a copy of the weight's bytes, a kernel that only loads its
    # words (at auto_config's grid and at the best of READ_GRIDS), and our kernel with programmatic dependent launch
    for label in (args.shapes.split(",") if "R" in phases else []):
        k, n = SHAPES[label]
        sh = Shape(k, n, groups=groups, tiny=False)
        reading_bar(sh, label, groups, [int(r) for r in args.rows.split(",")], meta["sms"], add, try_ours)
        sh.free()
        save()
    # the shapes of phases N, U, V, S and T: --shapes, HELD_OUT with --held-out, FRESH with --fresh (rows held out)
    rule_shapes = {**{lab: SHAPES[lab] for lab in args.shapes.split(",") if lab}, **(HELD_OUT if args.held_out else {}),
                   **(FRESH if args.fresh else {})}
    held_out_shapes = {**HELD_OUT, **FRESH}
    # ---------------- phases N, U and V, one shape at a time, in one process with tinygemm: N, the narrow-tile
    # GEMV (phase R's fastest kind) at every split of K beside auto_config — the rows a shape rule for it is
    # fitted on (and held out); U, the rule's tile at uneven_split's splits beside its own and the largest
    # divisor below; V, the rule's tile at every span of steps per program, divisors or not
    for letter, phase in (("N", narrow_tiles), ("U", uneven_splits), ("V", every_span)):
        for label, (k, n) in (rule_shapes.items() if letter in phases else ()):
            sh = Shape(k, n, groups=groups)
            phase(sh, label, groups, meta["sms"], label in held_out_shapes, add, try_ours)
            sh.free()
            save()
    # ---------------- phase S: auto_config's one-row config at every split of K (g128, 2-warp rule; g64, 4-warp)
    for label, (k, n) in (rule_shapes.items() if "S" in phases else ()):
        sh = Shape(k, n, groups=groups, tiny=False)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        sms = meta["sms"]
        for g in groups:
            p0, nbytes = sh.packed[g][0], sh.packed[g][0].nbytes
            auto = w4_kernel.auto_config(p0, 1, w4_kernel.GEMV_RULE)
            tiles, steps = math.ceil(n / auto["BLOCK_N"]), k // (g * auto["GROUPS"])
            picks = {"rule_split": auto["SPLIT_K"], "programs_rule_split": programs_rule_split(tiles, steps, sms)}
            ref = w4_format.reference_matmul(x.float(), p0).float()
            for split in w4_kernel._divisors(steps):
                if split * tiles > 64 * sms:      # past 64 programs per SM nothing is left to gain
                    continue
                cfg = {**auto, "SPLIT_K": split}
                ms = try_ours(sh, label, g, x, cfg, "S")      # a split that fails is recorded there, not fatal
                if ms is None:
                    continue
                err = rel_err(x, p0, cfg, ref)
                add("ours (Triton GEMV, auto_config at each split)", f"W4A16 g{g}", label, k, n, 1, g, ms, nbytes,
                    "cudagraph", config=cfg, phase="S", held_out=label in held_out_shapes, exact=is_exact(err, cfg),
                    rel_err=err, **picks)
        sh.free()
        save()
    # ---------------- phase T: auto_config's tensor-core config (tc_split) against every power-of-2 split, M > 1
    for label, (k, n) in (rule_shapes.items() if "T" in phases else ()):
        sh = Shape(k, n, groups=groups)
        held = label in held_out_shapes
        for m in [int(r) for r in args.rows.split(",") if int(r) > 1]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            add("bf16 cuBLAS", "bf16", label, k, n, m, None, timing.graph_ms([lambda w=w: x @ w.t() for w in sh.w]),
                n * k * 2, "cudagraph", phase="T", held_out=held)
            for g in groups:
                p0, nbytes = sh.packed[g][0], sh.packed[g][0].nbytes
                if sh.tiny[g] is not None:
                    add("tinygemm (torchao int4)", f"W4A16 g{g}", label, k, n, m, g,
                        timing.graph_ms([lambda t=t: t(x) for t in sh.tiny[g]]), nbytes, "cudagraph", phase="T",
                        held_out=held)
                auto = w4_kernel.auto_config(p0, m)
                best_split(sh, label, g, x, {key: v for key, v in auto.items() if key != "SPLIT_K"}, "T",
                           rule_split=auto["SPLIT_K"], held_out=held)     # each split's row names the rule's
                err = rel_err(x, p0, auto)
                add("ours (Triton, auto_config)", f"W4A16 g{g}", label, k, n, m, g, try_ours(sh, label, g, x, auto, "T-auto"),
                    nbytes, "cudagraph", config=auto, phase="T-auto", held_out=held, exact=is_exact(err, auto),
                    rel_err=err)
        sh.free()
        save()
    if not phases & {"A", "B"}:
        meta["seconds"] = time.perf_counter() - t_start
        save()
        print("wrote", out, f"({meta['seconds']:.0f} s)")
        return

    # ---------------- phase A: which kernel family (two shapes, g128, M = 1 and 16)
    base = dict(KERNEL="tc", GROUPS=2, REDUCE="atomic", num_warps=4, num_stages=3)
    a1 = [{**base, "DEQUANT": d, "SWAP": s, "BLOCK_N": bn} for d in ("lop3",) for s in (False, True) for bn in (64, 128)]
    a1 += [{**base, "DEQUANT": "shift", "SWAP": True, "BLOCK_N": 64, "GROUPS": 1}]   # round 1's best, for reference
    shapes_a = {lab: Shape(*SHAPES[lab], groups=(128,)) for lab in PHASE_A_SHAPES}
    xs = {m: {lab: torch.randn(m, SHAPES[lab][0], device="cuda", dtype=torch.bfloat16) for lab in PHASE_A_SHAPES}
          for m in (1, 16)}

    def score(family, phase):
        best = []
        for lab, sh in shapes_a.items():
            for m in (1, 16):
                b = best_split(sh, lab, 128, xs[m][lab], family, phase)
                best.append(b[1] if b else float("inf"))
        return statistics.geometric_mean(best) if all(math.isfinite(v) for v in best) else float("inf")

    scored = sorted(((score(f, "A1"), i) for i, f in enumerate(a1)))
    fam = a1[scored[0][1]]
    print("phase A1 best:", fam, f"{scored[0][0] * 1e3:.1f} µs geomean", flush=True)
    save()
    a2 = [dict(fam), {**fam, "GROUPS": 1}, {**fam, "GROUPS": 4}, {**fam, "REDUCE": "serial"}, {**fam, "num_warps": 8},
          {**fam, "num_stages": 2}, {**fam, "num_stages": 4}, {**fam, "num_stages": 5}]
    scored2 = sorted(((score(f, "A2"), i) for i, f in enumerate(a2)))
    fam = a2[scored2[0][1]]
    meta["family"] = fam
    print("phase A2 best:", fam, f"{scored2[0][0] * 1e3:.1f} µs geomean", flush=True)
    for sh in shapes_a.values():
        sh.free()
    save()

    # ---------------- phase B: every shape, group and M; baselines under the same timing
    ms_rows = [int(r) for r in args.rows.split(",")]
    for si, label in enumerate(args.shapes.split(",")):
        if time.perf_counter() - t_start > args.budget_s:
            meta["stopped"] = f"budget reached before {label}"
            break
        k, n = SHAPES[label]
        sh = Shape(k, n, groups=groups)
        extra_m = [int(r) for r in args.crossover_rows.split(",")] if label == PHASE_A_SHAPES[0] else []
        for m in ms_rows + extra_m:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            add("bf16 cuBLAS", "bf16", label, k, n, m, None, timing.graph_ms([lambda w=w: x @ w.t() for w in sh.w]),
                n * k * 2, "cudagraph")
            add("bf16 cuBLAS", "bf16", label, k, n, m, None,
                triton.testing.do_bench(lambda: x @ sh.w[0].t(), return_mode="median"), n * k * 2, "do_bench")
            for g in groups:
                nbytes = sh.packed[g][0].nbytes
                if sh.tiny[g] is not None:
                    add("tinygemm (torchao int4)", f"W4A16 g{g}", label, k, n, m, g,
                        timing.graph_ms([lambda t=t: t(x) for t in sh.tiny[g]]), nbytes, "cudagraph")
                fam_g = dict(fam)
                if k % (g * fam_g["GROUPS"]):
                    fam_g["GROUPS"] = 1
                best = best_split(sh, label, g, x, fam_g, "B")
                auto = w4_kernel.auto_config(sh.packed[g][0], m)
                auto = {**auto, **{kk: fam_g[kk] for kk in ("DEQUANT", "SWAP", "REDUCE", "BLOCK_N", "num_warps",
                                                              "num_stages")}}
                ams = try_ours(sh, label, g, x, auto, "B-auto")
                add("ours (Triton, auto_config)", f"W4A16 g{g}", label, k, n, m, g, ams, nbytes, "cudagraph",
                    config=auto, phase="B-auto")
                if best is None:
                    continue
                cfg = best[0]
                p0 = sh.packed[g][0]
                add("ours (Triton, best split)", f"W4A16 g{g}", label, k, n, m, g,
                    triton.testing.do_bench(lambda cfg=cfg: w4_kernel.w4a16_matmul(x, p0, cfg), return_mode="median"),
                    nbytes, "do_bench", config=cfg, phase="B")
                err = rel_err(x, p0, cfg)
                rows[-1]["exact"] = is_exact(err, cfg)
                rows[-1]["rel_err"] = err
            if m in (1, 16) and si < 5:
                try:
                    from torchao.quantization import Int8WeightOnlyConfig
                    int8 = decode_bench.torchao_linear(sh.w[0], Int8WeightOnlyConfig())
                    add("torchao int8 weight-only (eager)", "W8A16", label, k, n, m, None,
                        triton.testing.do_bench(lambda: int8(x), return_mode="median"), n * k + n * 2, "do_bench")
                except Exception as e:  # noqa: BLE001
                    print("  int8 failed:", e, flush=True)
                if cap >= (8, 9):
                    fp8, fp8_bytes = decode_bench.fp8_rowwise(sh.w[0])
                    add("FP8 rowwise _scaled_mm (+ act. quant)", "W8A8 fp8", label, k, n, m, None,
                        triton.testing.do_bench(lambda: fp8(x), return_mode="median"), fp8_bytes, "do_bench")
                    add("FP8 rowwise _scaled_mm (matmul only)", "W8A8 fp8", label, k, n, m, None,
                        triton.testing.do_bench(fp8.matmul_only(x), return_mode="median"), fp8_bytes, "do_bench")
        sh.free()
        save()
    meta["seconds"] = time.perf_counter() - t_start
    save()
    print("wrote", out, f"({meta['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
