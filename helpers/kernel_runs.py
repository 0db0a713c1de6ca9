"""The W4A16 kernel and decode runs a lent card recorded (``results/CARD/kernels.json``, ``decode.json``, ``x_side.json``,
written by ``benchmarks/kernels.py``, ``decode.py`` and ``x_side.py``, joined by ``scripts/add_run.py``), read
back as tables, and the views of one weight × group that notebook 08 prints from them.

A phase-U case (:func:`phase_u_case`) is the one-row rule's tile timed at several splits of ``K``, the
rule's first; a phase-V case (:func:`phase_v_case`) the same tile at every span of steps per program
(``benchmarks.kernels.every_span``), with the nearest divisor's split (:func:`~helpers.w4_kernel.narrow_split`,
the rule to round 10) and :func:`~helpers.w4_kernel.uneven_split`'s (the rule since) worked out again from
the shape, so runs recorded before either field existed read the same way.
"""
from __future__ import annotations

from helpers import occupancy, w4_format, w4_kernel
from helpers.config import read_json, results_path


def load(card: str, file: str = "kernels.json", runs=None):
    """``results/CARD/FILE`` as ``(meta, table)``: its ``meta`` dict and a pandas DataFrame of its rows,
    only those of ``runs`` (a name or a list of names) when given. A missing file or run is refused,
    naming it and what the file holds."""
    import pandas as pd
    path = results_path(card, file)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: card {card!r} has no {file} in this checkout "
                                f"(results/ holds {sorted(p.name for p in results_path().iterdir() if p.is_dir())})")
    data = read_json(path)
    table = pd.DataFrame(data["rows"])
    if runs is not None:
        wanted = [runs] if isinstance(runs, str) else list(runs)
        known = set(table["run"].dropna()) if "run" in table else set()
        missing = [r for r in wanted if r not in known]
        if missing:
            raise ValueError(f"runs {missing} are not in {path}; it holds {sorted(known)}")
        table = table[table["run"].isin(wanted)]
    return data["meta"], table.reset_index(drop=True)


def phase_u_case(case) -> dict:
    """One weight × group of phase U (its rows in timing order): our rows, the rule's row (the first of
    ours), the same config's later timing (``None`` where it was timed once), the rule's ms to compare with
    (the later timing, else the first), and tinygemm's ms (timed first of the case)."""
    ours = case[case.kernel.str.startswith("ours")].reset_index(drop=True)
    if ours.empty:
        raise ValueError("phase_u_case needs a case with rows of ours (kernel 'ours …'); got none")
    rule = ours.iloc[0]
    again = ours[(ours.index > 0) & [c == rule.config for c in ours.config]]
    later = float(again.ms.min()) if len(again) else None
    return {"ours": ours, "rule": rule, "later_ms": later, "rule_ms": rule.ms if later is None else later,
            "tiny_ms": case[case.kernel.str.startswith("tinygemm")].ms.min()}


def phase_v_case(case, sms: int) -> dict:
    """One weight × group of phase V on ``sms`` multiprocessors: ours at every span (``by``: split → row),
    the rows at the nearest divisor's split (``divisor``) and at :func:`~helpers.w4_kernel.uneven_split`'s
    (``uneven``), the fastest span's ms (``best_ms``) and tinygemm's ms (timed after ours)."""
    span = case[case.kernel.str.contains("every span")]
    if span.empty:
        raise ValueError("phase_v_case needs a phase-V case with rows 'ours (narrow rule tile, every span)'; got none")
    by = {c["SPLIT_K"]: r for c, r in zip(span.config, span.itertuples())}
    p = w4_format.W4Weight.stand_in(int(span.N.iloc[0]), int(span.K.iloc[0]), int(span.group.iloc[0]))
    divisor = w4_kernel.narrow_gemv_config(p, sms=sms, uneven=False)["SPLIT_K"]
    uneven = w4_kernel.narrow_gemv_config(p, sms=sms)["SPLIT_K"]
    return {"by": by, "divisor": by[divisor], "uneven": by[uneven], "best_ms": min(r.ms for r in by.values()),
            "tiny_ms": case[case.kernel.str.startswith("tinygemm")].ms.min()}


OF_COPY, VS_TINYGEMM = 0.7, 1.3
"""The one-row kernel's targets (issue #31): bytes read at ≥ 70 % of the copy bandwidth and ≥ 1.3× tinygemm's speed."""


def meets_targets(of_copy, vs_tinygemm):
    """Where both kernel targets hold: ``of_copy`` (GB/s ÷ the copy's) ≥ :data:`OF_COPY` and ``vs_tinygemm``
    (tinygemm's time ÷ ours) ≥ :data:`VS_TINYGEMM`; element-wise on pandas Series or arrays."""
    return (of_copy >= OF_COPY) & (vs_tinygemm >= VS_TINYGEMM)


def time_ratio_counts(ratio, margin: float = 0.02) -> dict:
    """How a Series of time ratios (a candidate's time ÷ a baseline's, one per weight × group) splits around 1:
    ``slower`` (> 1) and ``slower_beyond`` (> 1 + ``margin``), ``faster`` (< 1) and ``faster_beyond`` (< 1 −
    ``margin``), ``of`` (how many), and the ``median``."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be a share in [0, 1) (0.02 for 2 %), got {margin!r}")
    if len(ratio) == 0:
        raise ValueError("ratio is empty: no weight × group to count")
    return {"slower": int((ratio > 1).sum()), "slower_beyond": int((ratio > 1 + margin).sum()),
            "faster": int((ratio < 1).sum()), "faster_beyond": int((ratio < 1 - margin).sum()), "of": len(ratio),
            "median": float(ratio.median())}


def repeat_spread(rows):
    """Per row of an x_side run timed more than once (``ms_each``, tinygemm's rows left out): how far its slowest
    timing is above its fastest, ``max / min − 1`` — the run's own noise, to set beside the ratios it reports."""
    timed = rows.iloc[:0] if "ms_each" not in rows else \
        rows[(rows.kernel != X_TINY) & rows.ms_each.map(lambda t: isinstance(t, list) and len(t) > 1)]
    if timed.empty:
        raise ValueError("no row of these was timed more than once (ms_each): runs X5 and later time twice")
    return timed.ms_each.map(lambda t: max(t) / min(t) - 1)


# the kernel names of benchmarks/x_side.py's rows (it writes them from here; the views below read them)
X_RULE, X_TINY = "ours (the rule)", "tinygemm (torchao int4)"
X_LOOP, X_PREP = "prepared x: loop alone", "prepared x: preparation alone"
X_BEST, X_BEST_PAID = "prepared x: loop alone, the best", "prepared x: preparation + the best"
X_CONTROL = "in-kernel x (the rule's kernel) at the best tile"
X_CAND, X_CAND_PAID = "prepared x: the candidate rule, loop alone", "prepared x: the candidate rule with its preparation"
X_PAD, X_PAD_PAID = ("prepared x: padded K, the candidate rule, loop alone",
                     "prepared x: padded K, the candidate rule with its preparation")
X_PDL_PAID = "prepared x: the candidate rule with its preparation, both launched with PDL"
X_SUB, X_SUB_PAID = ("prepared x: the candidate rule, subnormal codes, loop alone",
                     "prepared x: the candidate rule, subnormal codes, with its preparation")


def _kernels(case, needed: set) -> object:
    """Each kernel's first row of one x_side case, by kernel name; refuses a case without ``needed``."""
    one = case.drop_duplicates("kernel").set_index("kernel")
    missing = sorted(needed - set(one.index))
    if missing:
        raise ValueError(f"case (one weight × group of results/CARD/x_side.json) has no rows {missing}, only "
                         f"{sorted(one.index)}: pass a case of a run that timed them (run X2 or later for x_side_best, "
                         "X3 or later for x_side_candidate, X4 for x_side_padded, X5 — x_side --pdl — for x_side_pdl, "
                         "x_side --subnormal for x_side_subnormal)")
    return one


def x_side_best(case) -> dict:
    """One weight × group of an x_side sweep (``benchmarks/x_side.py``, run X2 or later): the rule, the best
    prepared loop alone and with its preparation — each as a share of the copy bandwidth and as tinygemm's time
    ÷ its own — the best loop's tile and split, and whether that loop was exact."""
    one = _kernels(case, {X_RULE, X_TINY, X_BEST, X_BEST_PAID})
    tiny, best, rule, paid = one.loc[X_TINY], one.loc[X_BEST], one.loc[X_RULE], one.loc[X_BEST_PAID]
    cfg, g = best.config, int(best.group)
    return {"shape": best["shape"], "group": g, "rule": rule.GBps / rule.copy_GBps,
            "loop alone, best": best.GBps / best.copy_GBps, "with its preparation": paid.GBps / paid.copy_GBps,
            "rule ÷ tinygemm": tiny.ms / rule.ms, "best ÷ tinygemm": tiny.ms / best.ms,
            "with prep ÷ tinygemm": tiny.ms / paid.ms,
            "best tile": f"{cfg['BLOCK_N']} rows × {cfg['GROUPS'] * g} codes, {cfg['num_warps']} warps"
                         + (", prefetch" if cfg["PREFETCH"] else "") + f", split {cfg['SPLIT_K']}",
            "exact": bool(best.exact)}


def x_side_candidate(case) -> dict:
    """One weight × group of an x_side run with the candidate shape rule (``w4_kernel.prepared_config``, run
    X3): whether the weight was held out of the fit, the candidate loop's time ÷ the best loop's, its share of
    the copy bandwidth with its preparation paid, tinygemm's time ÷ that, its split, and its exactness."""
    one = _kernels(case, {X_TINY, X_BEST, X_CAND, X_CAND_PAID})
    alone, paid = one.loc[X_CAND], one.loc[X_CAND_PAID]
    return {"set": "held out or fresh" if bool(alone.held_out) else "twelve (fitted)", "shape": alone["shape"],
            "group": int(alone.group), "× the best loop": alone.ms / one.loc[X_BEST].ms,
            "of copy, with preparation": paid.GBps / paid.copy_GBps, "÷ tinygemm": one.loc[X_TINY].ms / paid.ms,
            "split": alone.config["SPLIT_K"], "exact": bool(alone.exact)}


def x_side_padded(case) -> dict:
    """One weight × group of an x_side run with padded ``K`` (``benchmarks/x_side.py --pad``, round 13, run X4):
    ``K`` and ``K`` padded with zero columns to a whole number of the candidate tile's steps, the extra bytes'
    share, the rule, the candidate rule with its preparation unpadded and padded — each as a share of the copy
    bandwidth, GB/s counted on the weight's own bytes — tinygemm's time ÷ the padded path's, and its exactness."""
    one = _kernels(case, {X_RULE, X_TINY, X_CAND_PAID, X_PAD_PAID})
    rule, cand, pad, tiny = one.loc[X_RULE], one.loc[X_CAND_PAID], one.loc[X_PAD_PAID], one.loc[X_TINY]
    return {"shape": pad["shape"], "group": int(pad.group), "K": int(pad.K), "K padded": int(pad.K_padded),
            "extra bytes": pad.pad_share, "rule": rule.GBps / rule.copy_GBps,
            "candidate, with preparation": cand.GBps / cand.copy_GBps,
            "padded, with preparation": pad.GBps / pad.copy_GBps, "padded ÷ tinygemm": tiny.ms / pad.ms,
            "exact": bool(pad.exact)}


def x_side_pdl(case) -> dict:
    """One weight × group of an x_side run with PDL (``benchmarks/x_side.py --pdl``, round 16): the candidate rule
    with its preparation, launched plainly and with programmatic dependent launch (the loop launched while its
    preparation runs) — each as a share of the copy bandwidth and tinygemm's time ÷ its own —, the time with PDL ÷
    without, and whether PDL's output equals the plain one's bit for bit."""
    one = _kernels(case, {X_TINY, X_CAND_PAID, X_PDL_PAID})
    plain, pdl, tiny = one.loc[X_CAND_PAID], one.loc[X_PDL_PAID], one.loc[X_TINY]
    return {"shape": pdl["shape"], "group": int(pdl.group), "plain": plain.GBps / plain.copy_GBps,
            "PDL": pdl.GBps / pdl.copy_GBps, "PDL time ÷ plain": pdl.ms / plain.ms,
            "plain ÷ tinygemm": tiny.ms / plain.ms, "PDL ÷ tinygemm": tiny.ms / pdl.ms,
            "same output": bool(pdl.same_as_plain)}


def x_side_subnormal(case) -> dict:
    """One weight × group of an x_side run with subnormal codes (``benchmarks/x_side.py --subnormal``, round 17):
    the candidate rule's loop alone and with its preparation, with the centred codes and with the subnormal ones
    (config ``SUBNORMAL``) — each as a share of the copy bandwidth —, the subnormal time ÷ the centred one (loop
    alone, and with the preparation), tinygemm's time ÷ the subnormal pair's, and the subnormal loop's error."""
    one = _kernels(case, {X_TINY, X_CAND, X_CAND_PAID, X_SUB, X_SUB_PAID})
    loop, paid, sub, sub_paid, tiny = (one.loc[k] for k in (X_CAND, X_CAND_PAID, X_SUB, X_SUB_PAID, X_TINY))
    return {"shape": sub["shape"], "group": int(sub.group), "centred loop": loop.GBps / loop.copy_GBps,
            "subnormal loop": sub.GBps / sub.copy_GBps, "loop time ÷ centred": sub.ms / loop.ms,
            "centred with prep": paid.GBps / paid.copy_GBps, "subnormal with prep": sub_paid.GBps / sub_paid.copy_GBps,
            "with prep time ÷ centred": sub_paid.ms / paid.ms, "subnormal with prep ÷ tinygemm": tiny.ms / sub_paid.ms,
            "rel_err": float(sub.rel_err), "exact": bool(sub.exact)}


def x_side_control(rows) -> dict | None:
    """The control of the first x_side run that timed it (run X3): per weight × group, the rule's own kernel
    at the best prepared tile ÷ the best prepared loop (``control_vs_loop``: what the activation side in the
    loop costs at that tile) and the rule ÷ that control (``rule_vs_control``: what the tile alone buys), with
    the ``run``'s name; None where no run has the control's rows."""
    ctrl = rows[rows.kernel == X_CONTROL]
    if ctrl.empty:
        return None
    run = ctrl.run.iloc[0]
    ctrl, same = ctrl[ctrl.run == run], rows[rows.run == run]
    loop = ctrl.merge(same[same.kernel == X_BEST], on=["shape", "group"], suffixes=("", "_p"))
    rule = same[same.kernel == X_RULE].drop_duplicates(["shape", "group"]).merge(ctrl, on=["shape", "group"],
                                                                                suffixes=("", "_c"))
    return {"run": run, "control_vs_loop": loop.ms / loop.ms_p, "rule_vs_control": rule.ms / rule.ms_c}


def ncu_cases(text: str, metrics, complete_only: bool = False) -> list[dict]:
    """The Nsight Compute report of ``scripts/gpu.sh ncu`` (``results/CARD/ncu_*.txt``: each profiled case opens with
    ``benchmarks.kernel_once``'s JSON line, then ncu's sections) as one dict per case: ``weight`` (the JSON's
    ``shape``), its ``group`` and the value of each of ``metrics`` — ncu's metric names, e.g. ``"Waves Per SM"`` — read from its
    line (name, unit or none, value; thousands' commas dropped). A metric a case's report lacks is refused by name —
    or, with ``complete_only``, the case left out (one its call's time limit cut off before ncu printed it)."""
    import json
    cases = []
    for line in text.splitlines():
        if line.startswith("{"):
            once = json.loads(line)
            cases.append({"weight": once["shape"], "group": once.get("group")})
        elif cases:
            for name in metrics:
                if name not in cases[-1] and line.strip().startswith(name + " "):
                    cases[-1][name] = float(line.split()[-1].replace(",", ""))
    if not cases:
        raise ValueError("no profiled case in this report (no kernel_once JSON line): is it a gpu.sh ncu report?")
    if complete_only:
        return [case for case in cases if all(m in case for m in metrics)]
    for case in cases:
        missing = [m for m in metrics if m not in case]
        if missing:
            raise ValueError(f"the report of {case['weight']} has no {missing} (ncu's section names, as it prints them)")
    return cases


NCU_LAUNCH = ("Registers Per Thread", "Block Size", "Grid Size", "# SMs", "Waves Per SM", "Block Limit Registers")


def ncu_waves(paths, arch: int = 90):
    """Each profiled kernel of the Nsight Compute reports ``paths`` (``scripts/gpu.sh ncu``'s; a report without
    ``benchmarks.kernel_once``'s lines is passed over, a case its call's limit cut off left out) as a row: its
    ``registers``, ``warps`` and ``programs``, the programs per SM its registers allow by
    :func:`helpers.occupancy.block_limits` beside ncu's "Block Limit Registers", and the waves
    :func:`helpers.occupancy.waves` gives from them (with the smallest of the limits) beside ncu's "Waves Per SM"
    — the occupancy arithmetic checked against the card's own reports (``arch``: their compute capability × 10)."""
    import pandas as pd
    rows = []
    for path in paths:
        try:
            cases = ncu_cases(path.read_text(), NCU_LAUNCH, complete_only=True)
        except ValueError:   # no profiled case: an older report
            continue
        for c in cases:
            registers, warps, programs = int(c["Registers Per Thread"]), int(c["Block Size"]) // 32, int(c["Grid Size"])
            per_sm = occupancy.programs_per_sm(registers, warps, arch=arch)
            rows.append({"report": path.stem, "weight": c["weight"], "group": c["group"], "registers": registers,
                         "warps": warps, "programs": programs,
                         "by registers": occupancy.block_limits(registers, warps, arch=arch)["registers"],
                         "by registers (ncu)": int(c["Block Limit Registers"]),
                         "waves": occupancy.waves(programs, int(c["# SMs"]), per_sm), "waves (ncu)": c["Waves Per SM"]})
    return pd.DataFrame(rows, columns=["report", "weight", "group", "registers", "warps", "programs", "by registers",
                                       "by registers (ncu)", "waves", "waves (ncu)"])


def per_weight(rows, view) -> object:
    """A table of ``view(case)`` (:func:`x_side_best`, :func:`x_side_candidate`, :func:`x_side_padded`,
    :func:`x_side_pdl`, :func:`x_side_subnormal`) for each
    weight × group of ``rows`` (one x_side run's), in the run's order."""
    import pandas as pd
    return pd.DataFrame([view(case) for _, case in rows.groupby(["shape", "group"], sort=False)])


def _timings(rows, kernel: str):
    """``kernel``'s first timing of each weight × group in ``rows``, and their MB (GB/s × ms = MB)."""
    one = rows[rows.kernel == kernel].drop_duplicates(["shape", "group"])
    return one, (one.GBps * one.ms).to_numpy()


def smallest_measured(rows, kernel: str, share: float = OF_COPY) -> float:
    """MB: the smallest weight ``kernel`` was measured reading at ``share`` of its row's copy bandwidth or more in
    ``rows`` (NaN where none was) — beside :func:`smallest_at`, where a line through all of them crosses it."""
    one, mb = _timings(rows, kernel)
    if one.empty:
        raise ValueError(f"kernel {kernel!r} has no rows here (kernels here: {sorted(set(rows.kernel))})")
    fast = mb[(one.GBps >= _share(share) * one.copy_GBps).to_numpy()]
    return float(fast.min()) if len(fast) else float("nan")


def time_line(rows, kernel: str) -> dict:
    """One kernel's time against the bytes it reads, over every weight × group of one x_side run (``rows``: that
    run's rows, one timing per weight × group used): the least-squares line

        t = fixed + bytes / stream        (t in µs, bytes in MB)

    ``fixed`` (µs) is what a call costs whatever the weight's size — launches, the preparation, the first loads'
    latency, the last wave's tail — and ``stream`` (GB/s) the rate the bytes arrive at past it, also as a share
    of the run's copy bandwidth (``of_copy``, the median of its rows' ``copy_GBps``); ``r2`` is the fit's, ``n``
    the weights × groups, ``mb`` their range. Bytes are the rows' own (``GBps × ms``). A line through many shapes
    is a coarse model: where it crosses a share of the copy bandwidth (:func:`smallest_at`) is not where each
    measured weight does. Refuses rows of several runs, fewer than two sizes, and a line that does not rise."""
    import numpy as np
    if "run" in rows and rows.run.nunique() > 1:
        raise ValueError(f"rows hold runs {sorted(rows.run.dropna().unique())}: pass one run's rows "
                         "(kernel_runs.load(card, 'x_side.json', runs=NAME))")
    one, mb = _timings(rows, kernel)
    if len(set(mb.round(6))) < 2:
        raise ValueError(f"kernel {kernel!r}: {len(one)} weights × groups of {len(set(mb.round(6)))} sizes in these "
                         f"rows, a line needs 2 sizes or more (kernels here: {sorted(set(rows.kernel))})")
    us = (one.ms * 1e3).to_numpy()
    slope, fixed = np.polyfit(mb, us, 1)
    if slope <= 0:
        raise ValueError(f"kernel {kernel!r}: the time does not rise with the bytes in these rows (slope {slope:.3g} "
                         "µs per MB), so they give no stream rate")
    r2 = 1 - ((us - (fixed + slope * mb)) ** 2).sum() / ((us - us.mean()) ** 2).sum()
    copy = float(one.copy_GBps.median())
    return {"kernel": kernel, "fixed_us": float(fixed), "stream_GBps": float(1e3 / slope), "of_copy": float(1e3 / slope / copy),
            "copy_GBps": copy, "r2": float(r2), "n": len(one), "mb": (float(mb.min()), float(mb.max()))}


def _share(share: float) -> float:
    if not 0 < share <= 1:
        raise ValueError(f"share must be a fraction of the copy bandwidth in (0, 1], got {share}")
    return share


def smallest_at(line: dict, share: float = OF_COPY) -> float:
    """MB: where :func:`time_line`'s ``line`` crosses ``share`` of the copy bandwidth ``c`` — the smallest weight the
    *line* reads that fast (measured weights of other shapes fall on either side):
    ``bytes ÷ (fixed + bytes ÷ stream) = share · c`` gives ``bytes = share · c · fixed ÷ (1 − share · c ÷ stream)``;
    infinite where the stream itself is below ``share · c``, 0 where the line has no fixed cost."""
    rate = _share(share) * line["copy_GBps"]
    if line["stream_GBps"] <= rate:
        return float("inf")
    return max(0.0, rate * 1e-3 * line["fixed_us"] / (1 - rate / line["stream_GBps"]))


def fixed_allowed(line: dict, mb: float, share: float = OF_COPY) -> float:
    """µs: the fixed cost a weight of ``mb`` MB can carry and still be read at ``share`` of the copy bandwidth at
    ``line``'s stream rate: ``mb ÷ (share · c) − mb ÷ stream`` (negative: not even with none)."""
    if mb <= 0:
        raise ValueError(f"mb must be a weight's size in MB > 0, got {mb}")
    return 1e3 * mb / (_share(share) * line["copy_GBps"]) - 1e3 * mb / line["stream_GBps"]


def decode_tok_s(rows, run: str, fmt: str, recipe: str, batch: int = 1, compiled: bool = True,
                 flag: str | tuple[str, ...] | None = None) -> float:
    """Decode tokens per second of the one row of ``rows`` (``decode.json``'s table, :func:`load`) of ``run`` with
    this format, recipe, batch and compilation whose kernel ``family`` switches on exactly ``flag`` (a name, or
    a tuple of names all on, e.g. ``("PREPARED", "PAD")``; None: no switch on — at one row the GEMV rule, the
    default family's kernel before round 14; later runs write ``PREPARED`` out); refuses
    none or several, naming the selection."""
    want = ({flag} if flag else set()) if isinstance(flag, str) else set(flag or ())
    sel = rows[(rows.run == run) & (rows.format == fmt) & (rows.recipe == recipe) & (rows.batch == batch)
               & (rows.compiled == compiled) & rows.decode_tok_s.notna()]
    if "family" in sel:
        on = [{k for k, v in f.items() if v} if isinstance(f, dict) else set() for f in sel.family]
        sel = sel[[o == want for o in on]]
    elif want:
        sel = sel.iloc[:0]
    if len(sel) != 1:
        raise ValueError(f"run {run!r}, {fmt}, {recipe}, batch {batch}, compiled={compiled}, family flag {flag!r}: "
                         f"{len(sel)} rows with a decode speed, not one — check the run's rows in decode.json")
    return float(sel.decode_tok_s.iloc[0])
