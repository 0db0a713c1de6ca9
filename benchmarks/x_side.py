"""Round 12's question, measured: how much of the one-row GEMV's time is its activation side?

    python -m benchmarks.x_side --out results/h100/x_side.json
    python -m benchmarks.x_side --pad --out /tmp/x_pad.json    # round 13: K padded to the candidate tile's step
    python -m benchmarks.x_side --pdl --out /tmp/x_pdl.json    # round 16: both launches with PDL

Every step of :func:`helpers.w4_kernel._w4a16_gemv_kernel` (the narrow rule's tile: 32 rows, 2 warps,
fp16-pair sums kept per group) does the work of ``x`` again in every program: eight scalar loads of
each word's columns, the largest ``|x|`` (a reduction across the program's threads), ``log2``/``exp2``
of the shrink, ``x·shrink`` and its fp16 pairs, ``Σx`` per group — and Triton moves those values between
register layouts through shared memory, with barriers (``scripts/kernel_sass.py`` counts them; README,
round 12).

This benchmark times the one-row path that does the activation side **once per call**, in a kernel of its
own (``KERNEL="prepared"`` of :mod:`helpers.w4_kernel`: :func:`~helpers.w4_kernel.prepare_x`, one program
per 512 activations, per group a shrink from its largest ``|x|``, ``Σx`` and ``1/shrink``, the fp16 pairs in
four planes; then :func:`~helpers.w4_kernel.gemv_prepared`, the loop that only loads them) — the loop alone
(the bar: what a step costs without the activation work) and with its preparation (what a layer pays: one
more launch), at four tiles (:data:`TILES`) and a few splits each. Then the control — the rule's kernel,
activation side in every step, at the best prepared tile (:func:`in_kernel_x`), which tells the tile's share
from the preparation's — and the candidate shape rule (:func:`~helpers.w4_kernel.prepared_config`), alone
and with its preparation. Beside them, in one process: the narrow rule as it is
(:func:`~helpers.w4_kernel.narrow_gemv_config`) and tinygemm. The best loop, the control and the candidate
are checked against :func:`helpers.w4_format.reference_matmul` (``rel_err``, ``exact``). The layers took
the prepared path only when asked (``family={"PREPARED": True}``) until round 14 made it ``auto_config``'s
one-row default (``{"PREPARED": False}`` asks for the rule).

Round 13 (``--pad``): where the candidate tile's step does not divide ``K`` its ``GROUPS`` is halved
(Llama-2-7B's down projection runs 256 codes a step, Qwen2.5-72B's 128), and run X3 found those weights at
44–52 % of the copy bandwidth. :func:`padded_rows` pads ``K`` with zero columns to a whole number of a wider
step instead (:func:`helpers.w4_kernel.padded_groups`, at most :data:`MAX_PAD` more bytes) and times the candidate rule there,
its GB/s counted on the weight's own bytes.

Round 16 (``--pdl``): the candidate rule with its preparation, launched plainly and with programmatic dependent
launch (``prepare_x(..., pdl=True)`` and config ``PDL``: the loop launches while its preparation runs and asks L2
for its first step of the weight before it waits for the planes), timed in turn twice each (the faster of each
kept, both written), beside tinygemm; PDL's output is compared with the plain one's bit for bit.

Round 17 (``--subnormal``): the candidate rule's loop alone and with its preparation, with the centred codes and
with the codes as fp16 subnormals (config ``SUBNORMAL``, four instructions a word fewer), timed in turn twice each,
beside tinygemm; the subnormal loop's error against the reference (``exact``: within
:data:`~benchmarks.kernels.SUBNORMAL_SUMS_EXACT`).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from benchmarks.kernels import FP16_SUMS_EXACT, SUBNORMAL_SUMS_EXACT
from helpers import kernel_runs, timing, w4_format, w4_kernel
from helpers.config import write_json
from helpers.w4_kernel import acc16_x_limit, gemv_prepared, prepare_x, prepared_config

try:
    import triton
except ImportError:  # pragma: no cover - benchmarks need Triton; CPU tests skip without it
    triton = None

MIN_MB = 16          # the target weights: at least this many MB of int4 codes, scales and zeros


TILES = ((32, 512, 2), (16, 1024, 2), (8, 2048, 2), (16, 1024, 1))   # (rows per program, codes of a row per step, warps)
SPLIT_SCALES = (0.5, 1, 2, 4)   # around uneven_split's choice for the tile (its wave rule was fitted on the first tile)


def big_shapes(min_mb: float = MIN_MB) -> dict:
    """The (K, N) weights of ``benchmarks.kernels``' three shape sets with at least ``min_mb`` MB at g128."""
    from benchmarks.kernels import FRESH, HELD_OUT, SHAPES
    out = {}
    for label, (k, n) in {**SHAPES, **HELD_OUT, **FRESH}.items():
        if n * k // 2 + 2 * 2 * n * (k // 128) >= min_mb * 1e6:
            out[label] = (k, n)
    return out


def in_kernel_x(x: torch.Tensor, p: w4_format.W4Weight, cfg: dict, locks: torch.Tensor) -> torch.Tensor:
    """The control: :func:`helpers.w4_kernel._w4a16_gemv_kernel` (the activation side in every step, as the
    rule's) at a prepared loop's tile — launched here as :func:`helpers.w4_kernel.w4a16_matmul` launches it
    (``HALF2``, ``ACC16``, ``MAGIC`` where compiled), since that refuses tiles under 16 rows."""
    n, k = p.shape
    split = cfg["SPLIT_K"]
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), split)
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    ws = torch.empty(split, n, dtype=torch.float32, device=x.device) if split > 1 else y
    w4_kernel._kernel("gemv")[grid](x, p.words, p.scale, p.zero, y, ws, locks if split > 1 else y, n, k, split,
                                    p.words.stride(0), p.scale.stride(0), GROUP=p.group_size, GROUPS=cfg["GROUPS"],
                                    BLOCK_N=cfg["BLOCK_N"], SERIAL=split > 1, MAGIC=not w4_kernel._interpreted(),
                                    HALF2=True, ACC16=True,
                                    ACC_LIMIT=acc16_x_limit(p.group_size), STAGES=1, PDL=False,
                                    EVEN=(k // (p.group_size * cfg["GROUPS"])) % split == 0,
                                    num_warps=cfg["num_warps"], num_stages=1)
    return y


def tile_configs(p: w4_format.W4Weight, sms: int) -> list[dict]:
    """The prepared loop's configs for weight ``p``: each of :data:`TILES`, with and without ``PREFETCH``, at
    :func:`helpers.w4_kernel.uneven_split`'s split for the tile times each of :data:`SPLIT_SCALES` (distinct,
    1 … steps)."""
    n, k = p.shape
    out = []
    for rows, codes, warps in TILES:
        groups = w4_kernel._fitting_groups(p, max(1, codes // p.group_size))
        tiles, steps = math.ceil(n / rows), k // (p.group_size * groups)
        base = w4_kernel.uneven_split(tiles, steps, sms, warps, codes=p.group_size * groups)
        splits = sorted({max(1, min(steps, round(base * f))) for f in SPLIT_SCALES})
        for split in splits:
            split = w4_kernel.same_span_split(steps, split)   # no program left empty
            for prefetch in (False, True):
                cfg = dict(BLOCK_N=rows, GROUPS=groups, SPLIT_K=split, num_warps=warps, PREFETCH=prefetch)
                if cfg not in out:
                    out.append(cfg)
    return out


MAX_PAD = w4_kernel.PREPARED_MAX_PAD   # the most extra bytes padding may add (a share of the weight's)


def pad_weight(w: torch.Tensor, k_padded: int) -> torch.Tensor:
    """``w`` [N, K] with ``k_padded − K`` zero columns appended."""
    if k_padded < w.shape[1]:
        raise ValueError(f"k_padded ({k_padded}) is below the weight's K ({w.shape[1]})")
    return torch.nn.functional.pad(w, (0, k_padded - w.shape[1]))


def padded_rows(x: torch.Tensor, w: torch.Tensor, g: int, sms: int, copies: int = 1) -> dict | None:
    """Round 13's question for one weight ``w`` [N, K] and group ``g``: the candidate rule on ``K`` padded to a
    whole number of the candidate tile's steps (:func:`~helpers.w4_kernel.padded_groups`). ``None`` where ``K`` needs no padding;
    else the padded weight's ``copies`` (for timing past L2), the padded row of ``x`` and its preparation, the
    config (:func:`~helpers.w4_kernel.prepared_config` on the padded weight), ``K'`` and the extra bytes' share,
    and the relative error against :func:`helpers.w4_format.reference_matmul` on the *unpadded* weight."""
    n, k = w.shape
    groups, kp = w4_kernel.padded_groups(k, g, max_pad=MAX_PAD)
    if kp == k:          # the tile (or its half) already divides K: the candidate rule runs it unpadded
        return None
    wp = pad_weight(w, kp)
    ps = [w4_format.pack_w4(wp, g) for _ in range(copies)]
    xp = torch.nn.functional.pad(x, (0, kp - k))
    prep = prepare_x(xp, g)
    cfg = prepared_config(ps[0], sms)
    ref = w4_format.reference_matmul(x.float(), w4_format.pack_w4(w, g)).float()
    got = gemv_prepared(prep, ps[0], cfg, out_dtype=torch.float32)
    return {"packed": ps, "x": xp, "prep": prep, "config": cfg, "K_padded": kp, "pad_share": kp / k - 1,
            "rel_err": w4_format.max_rel_err(got, ref)}


def in_turn(calls: dict, repeats: int = 2) -> dict:
    """Each entry of ``calls`` (a name → its list of calls, one per weight copy) timed under graph replay
    (:func:`helpers.timing.graph_ms`), the names in turn, ``repeats`` rounds: name → its times, in order. Taking
    turns spreads a card's drift (clocks, temperature) over all of them instead of favouring the one timed first."""
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fns in calls.items():
            times[name].append(timing.graph_ms(fns))
    return times


def pdl_rows(x: torch.Tensor, ps: list, g: int, sms: int, prep, locks: torch.Tensor, add) -> None:
    """Round 16 on one weight × group (``ps``: its copies): the candidate rule with its preparation, plain and with
    PDL on both launches, timed in turn twice each under graph replay (``ms`` the faster, ``ms_each`` both), and
    PDL's output against the plain one's (``same_as_plain``: bit for bit) and the reference (``rel_err``)."""
    plain = prepared_config(ps[0], sms)
    pdl = {**plain, "PDL": True}
    ref = w4_format.reference_matmul(x.float(), ps[0]).float()
    want = gemv_prepared(prepare_x(x, g, prep), ps[0], plain, locks, out_dtype=torch.float32)
    got = gemv_prepared(prepare_x(x, g, prep, pdl=True), ps[0], pdl, locks, out_dtype=torch.float32)
    err = w4_format.max_rel_err(got, ref)
    times = in_turn({what: [lambda p=p, cfg=cfg, on=what == "pdl": gemv_prepared(prepare_x(x, g, prep, pdl=on), p,
                                                                                   cfg, locks) for p in ps]
                     for what, cfg in (("plain", plain), ("pdl", pdl))})
    add(kernel_runs.X_CAND_PAID, min(times["plain"]), config=plain, ms_each=times["plain"])
    add(kernel_runs.X_PDL_PAID, min(times["pdl"]), config=pdl, ms_each=times["pdl"], rel_err=err,
        exact=err <= FP16_SUMS_EXACT, same_as_plain=bool(torch.equal(got, want)))


def subnormal_rows(x: torch.Tensor, ps: list, g: int, sms: int, prep, locks: torch.Tensor, add) -> None:
    """Round 17 on one weight × group (``ps``: its copies): the candidate rule's loop alone (on ``prep``, and on the
    row prepared for subnormal codes) and with its preparation, centred and subnormal codes in turn, twice each
    under graph replay (``ms`` the faster, ``ms_each`` both); the subnormal loop against the reference."""
    plain = prepared_config(ps[0], sms)
    sub = {**plain, "SUBNORMAL": True}
    sprep = prepare_x(x, g, subnormal=True)
    ref = w4_format.reference_matmul(x.float(), ps[0]).float()
    err = w4_format.max_rel_err(gemv_prepared(sprep, ps[0], sub, locks, out_dtype=torch.float32), ref)
    cases = {kernel_runs.X_CAND: (prep, plain, None), kernel_runs.X_SUB: (sprep, sub, None),
             kernel_runs.X_CAND_PAID: (prep, plain, False), kernel_runs.X_SUB_PAID: (sprep, sub, True)}
    times = in_turn({name: [lambda p=p, pr=pr, cfg=cfg: gemv_prepared(pr, p, cfg, locks) for p in ps]
                            if paid is None else
                            [lambda p=p, pr=pr, cfg=cfg, s=paid: gemv_prepared(prepare_x(x, g, pr, subnormal=s), p, cfg,
                                                                                locks) for p in ps]
                            for name, (pr, cfg, paid) in cases.items()})
    for name, (_, cfg, _) in cases.items():
        mine = {"rel_err": err, "exact": err <= SUBNORMAL_SUMS_EXACT} if cfg.get("SUBNORMAL") else {}
        add(name, min(times[name]), config=cfg, ms_each=times[name], **mine)


def main():
    ap = argparse.ArgumentParser(prog="python -m benchmarks.x_side")
    ap.add_argument("--out", required=True)
    ap.add_argument("--groups", default="128,64")
    ap.add_argument("--budget-s", type=float, default=420, help="stop after this many seconds (rows kept)")
    ap.add_argument("--pad", action="store_true",
                    help="round 13: only the weights whose K the candidate tile's step does not divide, the candidate "
                         "rule unpadded and on K padded with zero columns (padded_rows), beside the rule and tinygemm")
    ap.add_argument("--pdl", action="store_true",
                    help="round 16: the candidate rule with its preparation, plain and with PDL (both launches), "
                         "beside tinygemm, on every weight")
    ap.add_argument("--subnormal", action="store_true",
                    help="round 17: the candidate rule's loop alone and with its preparation, centred and subnormal "
                         "codes (config SUBNORMAL), beside tinygemm, on every weight")
    args = ap.parse_args()
    if sum((args.pad, args.pdl, args.subnormal)) > 1:
        ap.error("--pad, --pdl and --subnormal are three runs: give one")
    if not torch.cuda.is_available():
        sys.exit("x_side.py times CUDA kernels; there is no CUDA device here")
    from benchmarks.kernels import FRESH, HELD_OUT, Shape, ours_ms, tinygemm_row
    t0 = time.perf_counter()
    copy = timing.copy_bandwidth_gbps()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "copy_GBps": copy, "sms": sms, "tiles": TILES, "split_scales": SPLIT_SCALES, "max_pad": MAX_PAD}
    rows, out = [], Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"copy bandwidth {copy:.0f} GB/s on {meta['device']}", flush=True)

    def save():
        write_json(out, {"meta": meta, "rows": rows}, indent=1, default=str)

    def add(kernel, label, k, n, g, ms, nbytes, echo=True, **extra):
        row = {"kernel": kernel, "format": f"W4A16 g{g}", "shape": label, "K": k, "N": n, "M": 1, "group": g,
               "ms": ms, "GBps": nbytes / (ms * 1e-3) / 1e9, "copy_GBps": copy, "timing": "cudagraph",
               "held_out": label in HELD_OUT or label in FRESH, **extra}
        rows.append(row)
        if echo:
            print(f"{kernel[:40]:40s} {label[:30]:30s} g{g:<4} {ms * 1e3:8.1f} µs {row['GBps']:6.0f} GB/s "
                  f"({100 * row['GBps'] / copy:.0f} % of copy)", flush=True)

    groups = [int(g) for g in args.groups.split(",")]
    for label, (k, n) in big_shapes().items():
        if time.perf_counter() - t0 > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: stopping before {label}", flush=True)
            break
        sh = Shape(k, n, groups=groups)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        for g in groups:
            ps, nbytes = sh.packed[g], sh.packed[g][0].nbytes
            rule = w4_kernel.narrow_gemv_config(ps[0], sms=sms)
            locks = torch.zeros(math.ceil(n / min(t[0] for t in TILES)), dtype=torch.int32, device="cuda")
            prep = prepare_x(x, g)
            if args.pdl or args.subnormal:
                (pdl_rows if args.pdl else subnormal_rows)(
                    x, ps, g, sms, prep, locks, lambda kernel, ms, **extra: add(kernel, label, k, n, g, ms, nbytes, **extra))
                tinygemm_row(sh, label, g, x, "X", label in HELD_OUT or label in FRESH,
                             lambda kernel, fmt, lab, k_, n_, m, g_, ms, nb, tk, **e: add(kernel, lab, k_, n_, g_, ms, nb))
                save()
                continue
            if args.pad:
                pad = padded_rows(x, sh.w[0], g, sms, copies=len(ps))
                if pad is None:
                    continue
                add(kernel_runs.X_RULE, label, k, n, g, ours_ms(sh, g, x, rule)["cudagraph"], nbytes, config=rule)
                cand = prepared_config(ps[0], sms)
                add(kernel_runs.X_CAND_PAID, label, k, n, g,
                    timing.graph_ms([lambda p=p: gemv_prepared(prepare_x(x, g, prep), p, cand, locks) for p in ps]),
                    nbytes, config=cand)
                pcfg, pps, pprep, xp = pad["config"], pad["packed"], pad["prep"], pad["x"]
                extra = dict(config=pcfg, K_padded=pad["K_padded"], pad_share=pad["pad_share"], rel_err=pad["rel_err"],
                             exact=pad["rel_err"] <= FP16_SUMS_EXACT)   # GB/s of the weight's own bytes (padding: overhead)
                add(kernel_runs.X_PAD, label, k, n, g,
                    timing.graph_ms([lambda p=p: gemv_prepared(pprep, p, pcfg, locks) for p in pps]), nbytes, **extra)
                add(kernel_runs.X_PAD_PAID, label, k, n, g,
                    timing.graph_ms([lambda p=p: gemv_prepared(prepare_x(xp, g, pprep), p, pcfg, locks) for p in pps]),
                    nbytes, **extra)
                tinygemm_row(sh, label, g, x, "X", label in HELD_OUT or label in FRESH,
                             lambda kernel, fmt, lab, k_, n_, m, g_, ms, nb, tk, **e: add(kernel, lab, k_, n_, g_, ms, nb))
                del pad, pps
                save()
                continue
            ref = w4_format.reference_matmul(x.float(), ps[0]).float()
            add(kernel_runs.X_RULE, label, k, n, g, ours_ms(sh, g, x, rule)["cudagraph"], nbytes, config=rule)
            best = None
            for cfg in tile_configs(ps[0], sms):
                ms = timing.graph_ms([lambda p=p, cfg=cfg: gemv_prepared(prep, p, cfg, locks) for p in ps])
                add(kernel_runs.X_LOOP, label, k, n, g, ms, nbytes, echo=False, config=cfg)
                if best is None or ms < best[1]:
                    best = (cfg, ms)
            cfg = best[0]
            got = gemv_prepared(prep, ps[0], cfg, out_dtype=torch.float32)
            err = w4_format.max_rel_err(got, ref)
            add(kernel_runs.X_BEST, label, k, n, g, best[1], nbytes, config=cfg, rel_err=err,
                exact=err <= FP16_SUMS_EXACT)
            ctrl = dict(cfg, PREFETCH=False)
            got = in_kernel_x(x, ps[0], ctrl, locks).float()
            cerr = w4_format.max_rel_err(got, ref)
            add(kernel_runs.X_CONTROL, label, k, n, g,
                timing.graph_ms([lambda p=p: in_kernel_x(x, p, ctrl, locks) for p in ps]), nbytes, config=ctrl,
                rel_err=cerr, exact=cerr <= FP16_SUMS_EXACT)
            cand = prepared_config(ps[0], sms)
            got = gemv_prepared(prep, ps[0], cand, out_dtype=torch.float32)
            aerr = w4_format.max_rel_err(got, ref)
            add(kernel_runs.X_CAND, label, k, n, g,
                timing.graph_ms([lambda p=p: gemv_prepared(prep, p, cand, locks) for p in ps]), nbytes, config=cand,
                rel_err=aerr, exact=aerr <= FP16_SUMS_EXACT)
            add(kernel_runs.X_CAND_PAID, label, k, n, g,
                timing.graph_ms([lambda p=p: gemv_prepared(prepare_x(x, g, prep), p, cand, locks) for p in ps]),
                nbytes, config=cand)
            add(kernel_runs.X_BEST_PAID, label, k, n, g,
                timing.graph_ms([lambda p=p: gemv_prepared(prepare_x(x, g, prep), p, cfg, locks) for p in ps]),
                nbytes, config=cfg)
            prep_ms = timing.graph_ms([lambda: prepare_x(x, g, prep)] * 8)
            rows.append({"kernel": kernel_runs.X_PREP, "shape": label, "K": k, "group": g,
                         "ms": prep_ms, "timing": "cudagraph"})
            print(f"{'  preparation alone':40s} {prep_ms * 1e3:8.1f} µs; the best loop {cfg}", flush=True)
            add("ours (the rule), again last", label, k, n, g, ours_ms(sh, g, x, rule)["cudagraph"], nbytes, config=rule)
            tinygemm_row(sh, label, g, x, "X", label in HELD_OUT or label in FRESH,
                         lambda kernel, fmt, lab, k_, n_, m, g_, ms, nb, tk, **e: add(kernel, lab, k_, n_, g_, ms, nb))
            save()
        sh.free()
    save()
    print(f"wrote {out} ({len(rows)} rows, {time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
