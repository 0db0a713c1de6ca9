"""helpers.kernel_runs: the H100's recorded kernel runs read back, and one weight × group of phases U and V
(the views notebook 08 prints)."""
import pytest

from helpers import kernel_runs


def test_load_reads_a_cards_runs_and_refuses_what_is_not_there():
    meta, rows = kernel_runs.load("h100", "kernels.json", runs="2026-12-06 V2")
    assert meta["sms"] == 132 and set(rows.run) == {"2026-12-06 V2"} and len(rows) == 230
    _, both = kernel_runs.load("h100", "kernels.json", runs=["2026-12-06 V", "2026-12-06 V2"])
    assert len(both) == 346 + 230
    with pytest.raises(ValueError, match="not in .*kernels.json"):
        kernel_runs.load("h100", "kernels.json", runs=["2026-12-06 V", "no such run"])
    with pytest.raises(FileNotFoundError, match="card 'nocard' has no kernels.json"):
        kernel_runs.load("nocard")


def test_phase_v_case_finds_both_rules_splits_on_llama2_down():
    """Llama-2-7B's down projection at g128 (43 steps of 256 codes): the nearest divisor splits 43 ways,
    uneven_split 15, and 15 was the fastest span timed; tinygemm's row is read too."""
    meta, rows = kernel_runs.load("h100", "kernels.json", runs="2026-12-06 V")
    case = rows[(rows["shape"] == "Llama-2-7B down 11008x4096") & (rows.group == 128)]
    v = kernel_runs.phase_v_case(case, meta["sms"])
    assert v["divisor"].config["SPLIT_K"] == 43 and v["uneven"].config["SPLIT_K"] == 15
    assert v["uneven"].ms == v["best_ms"] < v["divisor"].ms and v["tiny_ms"] > 0
    with pytest.raises(ValueError, match="every span"):
        kernel_runs.phase_v_case(case[case.kernel.str.startswith("tinygemm")], meta["sms"])


def test_phase_u_case_pairs_the_rules_first_and_later_timing():
    """Phase U warm (run U2): the rule's row is the first of ours, timed again last — its later ms is the
    one compared; a case timed once has no later timing."""
    _, rows = kernel_runs.load("h100", "kernels.json", runs="2026-12-06 U2")
    case = rows[(rows["shape"] == "8B down 14336x4096") & (rows.group == 64)]
    u = kernel_runs.phase_u_case(case)
    assert u["later_ms"] is not None and u["rule_ms"] == u["later_ms"] and u["rule"].config["SPLIT_K"] == 7
    one = kernel_runs.phase_u_case(case.iloc[:2])          # tinygemm's row (timed first) and the rule's
    assert one["later_ms"] is None and one["rule_ms"] == one["rule"].ms
    with pytest.raises(ValueError, match="rows of ours"):
        kernel_runs.phase_u_case(case[case.kernel.str.startswith("tinygemm")])


def test_x_side_views_count_run_x2_and_x3_as_recorded():
    """Round 12 on the H100 (x_side.json): run X2's best prepared loop meets both targets on 34 of 44 weights ×
    groups (29 with its preparation paid, the rule 17), exact everywhere; run X3's candidate rule with its
    preparation on 11 of the 18 it was fitted on and 13 of the 26 held out — the numbers notebook 08 prints."""
    _, xs = kernel_runs.load("h100", "x_side.json")
    t = kernel_runs.per_weight(xs[xs.run == "2026-12-06 X2"], kernel_runs.x_side_best)
    assert len(t) == 44 and t.exact.all()
    met = [int(kernel_runs.meets_targets(t[a], t[b]).sum()) for a, b in (
        ("loop alone, best", "best ÷ tinygemm"), ("with its preparation", "with prep ÷ tinygemm"), ("rule", "rule ÷ tinygemm"))]
    assert met == [34, 29, 17]
    cand = kernel_runs.per_weight(xs[xs.run == "2026-12-06 X3"], kernel_runs.x_side_candidate)
    by_set = {s: int(kernel_runs.meets_targets(c["of copy, with preparation"], c["÷ tinygemm"]).sum())
              for s, c in cand.groupby("set")}
    assert by_set == {"twelve (fitted)": 11, "held out or fresh": 13} and cand.exact.all()
    x1 = xs[xs.run == "2026-12-06 X1"]                        # the rule's tile only: no best loop, no candidate
    with pytest.raises(ValueError, match="has no rows"):
        kernel_runs.x_side_best(x1[(x1["shape"] == t["shape"].iloc[0]) & (x1.group == t.group.iloc[0])])


def test_meets_targets_needs_both():
    import pandas as pd
    assert kernel_runs.meets_targets(pd.Series([0.7, 0.9, 0.69]), pd.Series([1.3, 1.2, 2.0])).tolist() == [True, False, False]


def test_x_side_control_is_run_x3s():
    """Run X3's control (the rule's kernel at the best prepared tile): 1.02–1.90× the prepared loop's time,
    median 1.33× (README, round 12); a table without the control's rows gives None."""
    _, xs = kernel_runs.load("h100", "x_side.json")
    c = kernel_runs.x_side_control(xs)
    r = c["control_vs_loop"]
    assert c["run"] == "2026-12-06 X3" and len(r) == 44 == len(c["rule_vs_control"])
    assert (round(r.min(), 2), round(r.max(), 2), round(r.median(), 2)) == (1.02, 1.90, 1.33)
    assert kernel_runs.x_side_control(xs[xs.run == "2026-12-06 X1"]) is None


def test_x_side_padded_reads_run_x4():
    """Round 13 (run X4): on the ten weights × groups whose K the candidate tile's step does not divide, K padded
    by at most 5 % with zero columns; Qwen2.5-72B's down at g128 goes from 51 % of copy (candidate, with its
    preparation) to 89 % padded, exact; a run without padded rows is refused."""
    _, xs = kernel_runs.load("h100", "x_side.json", runs="2026-12-06 X4")
    t = kernel_runs.per_weight(xs, kernel_runs.x_side_padded)
    assert len(t) == 10 and t.exact.all() and (t["extra bytes"] <= 0.05).all() and (t["K padded"] > t.K).all()
    q = t[(t["shape"] == "Qwen2.5-72B down 29568x8192") & (t.group == 128)].iloc[0]
    assert (q.K, q["K padded"]) == (29568, 30720)
    assert (round(q["candidate, with preparation"], 2), round(q["padded, with preparation"], 2)) == (0.51, 0.89)
    _, x3 = kernel_runs.load("h100", "x_side.json", runs="2026-12-06 X3")
    with pytest.raises(ValueError, match="has no rows"):
        kernel_runs.x_side_padded(x3.groupby(["shape", "group"]).get_group(("Qwen2.5-72B down 29568x8192", 128)))


def test_decode_tok_s_reads_one_row_by_run_format_and_family():
    """Run 2026-12-06e (Llama-3.1-8B, batch 1): ours at the rule 349.9 tok/s and prepared 370.6 (family
    PREPARED), the numbers notebook 08 and the README quote; a selection of no row, or of rows the family
    does not tell apart, is refused."""
    _, rows = kernel_runs.load("h100", "decode.json")
    assert round(kernel_runs.decode_tok_s(rows, "2026-12-06e", "W4A16 ours", "fused+head+attn"), 1) == 349.9
    assert round(kernel_runs.decode_tok_s(rows, "2026-12-06e", "W4A16 ours", "fused+head+attn", flag="PREPARED"), 1) == 370.6
    assert round(kernel_runs.decode_tok_s(rows, "2026-12-06g", "bf16", "fused+attn", batch=8, compiled=False)) == 879
    h200 = kernel_runs.load("h200", "decode.json")[1]        # run 2026-12-07a: the rule, prepared, prepared + padded
    assert [round(kernel_runs.decode_tok_s(h200, "2026-12-07a", "W4A16 ours", "fused+head+attn", flag=f), 1)
            for f in (None, "PREPARED", ("PREPARED", "PAD"))] == [364.6, 405.5, 418.5]
    with pytest.raises(ValueError, match="PAD"):
        kernel_runs.decode_tok_s(h200, "2026-12-07a", "W4A16 ours", "fused+head+attn", flag="PAD")
    with pytest.raises(ValueError, match="0 rows"):
        kernel_runs.decode_tok_s(rows, "2026-12-06e", "bf16", "fused+attn")
    with pytest.raises(ValueError, match="2 rows"):     # two families in one run: the flag must pick one
        kernel_runs.decode_tok_s(rows.assign(family=None), "2026-12-06e", "W4A16 ours", "fused+head+attn")


def test_time_line_recovers_a_fixed_cost_and_a_stream_rate_and_what_they_allow():
    """time_line on rows made from t = 3 µs + bytes at 2000 GB/s (copy 2500): fixed 3 µs, stream 2000 GB/s (80 % of
    copy); smallest_at is the size read at exactly 70 % of copy, where fixed_allowed is the line's own fixed cost."""
    import pandas as pd
    mb = [16.0, 32.0, 64.0, 300.0]
    ms = [(3 + 1e3 * m / 2000) * 1e-3 for m in mb]
    rows = pd.DataFrame({"kernel": "k", "shape": [f"s{i}" for i in range(4)], "group": 128, "ms": ms,
                         "GBps": [m / t for m, t in zip(mb, ms)], "copy_GBps": 2500.0})
    line = kernel_runs.time_line(rows, "k")
    assert line["fixed_us"] == pytest.approx(3) and line["stream_GBps"] == pytest.approx(2000)
    assert line["of_copy"] == pytest.approx(0.8) and line["r2"] == pytest.approx(1) and line["n"] == 4
    at = kernel_runs.smallest_at(line)
    assert at / (3 + 1e3 * at / 2000) * 1e3 == pytest.approx(0.7 * 2500)          # MB per µs → GB/s
    assert kernel_runs.fixed_allowed(line, at) == pytest.approx(3)
    assert kernel_runs.fixed_allowed(line, 1.0) == pytest.approx(1e3 / 1750 - 1e3 / 2000)   # 1 MB: 0.07 µs
    assert kernel_runs.fixed_allowed(line, 64.0, share=0.9) < 0 and kernel_runs.smallest_at(line, share=0.9) == float("inf")
    with pytest.raises(ValueError, match="'missing'.*2 sizes or more"):
        kernel_runs.time_line(rows, "missing")
    with pytest.raises(ValueError, match="one run's rows"):
        kernel_runs.time_line(rows.assign(run=["a", "a", "b", "b"]), "k")
    with pytest.raises(ValueError, match="does not rise"):
        kernel_runs.time_line(rows.assign(ms=ms[::-1], GBps=[m / t for m, t in zip(mb, ms[::-1])]), "k")
    with pytest.raises(ValueError, match="share"):
        kernel_runs.smallest_at(line, share=0)
    with pytest.raises(ValueError, match="mb"):
        kernel_runs.fixed_allowed(line, 0)


def test_time_line_on_run_x3_on_both_cards():
    """The candidate rule with its preparation, run X3 on the H100 (2026-12-06) and the H200 (2026-12-07): about
    the same fixed cost on both (6.4 and 6.7 µs), a stream rate nearer the copy's on the H100 (96 % against 82 %),
    so the line crosses 70 % of copy at 50 MB on the H100 and 137 MB on the H200 — a coarse model: the smallest
    weights measured at 70 % or more are 38 MB and 62 MB (8B gate|up joined on the H200)."""
    lines = {card: kernel_runs.time_line(kernel_runs.load(card, "x_side.json", runs=run)[1], kernel_runs.X_CAND_PAID)
             for card, run in (("h100", "2026-12-06 X3"), ("h200", "2026-12-07 X3"))}
    assert [round(v["fixed_us"], 1) for v in lines.values()] == [6.4, 6.7]
    assert [round(v["of_copy"], 2) for v in lines.values()] == [0.96, 0.82]
    assert [round(kernel_runs.smallest_at(v)) for v in lines.values()] == [50, 137]
    measured = []
    for card, run in (("h100", "2026-12-06 X3"), ("h200", "2026-12-07 X3")):
        rows = kernel_runs.load(card, "x_side.json", runs=run)[1]
        paid = rows[rows.kernel == kernel_runs.X_CAND_PAID]
        measured.append(round((paid.GBps * paid.ms)[paid.GBps >= 0.7 * paid.copy_GBps].min()))
        assert kernel_runs.smallest_measured(rows, kernel_runs.X_CAND_PAID) == pytest.approx(
            (paid.GBps * paid.ms)[paid.GBps >= 0.7 * paid.copy_GBps].min())
    assert measured == [38, 62]
    assert kernel_runs.smallest_measured(rows, kernel_runs.X_RULE, share=1.0) != kernel_runs.smallest_measured(
        rows, kernel_runs.X_RULE, share=1.0)                                     # NaN: no weight at the copy's speed
    with pytest.raises(ValueError, match="'nope' has no rows"):
        kernel_runs.smallest_measured(rows, "nope")


def test_ncu_cases_reads_each_profiled_case_of_the_committed_reports():
    """The prepared loop's report (results/h100/ncu_prepared_e6e91b9.txt): three cases, the values its lines print;
    the first value of a metric a case repeats is kept; a report without cases, or a metric it lacks, is refused."""
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "results" / "h100" / "ncu_prepared_e6e91b9.txt").read_text()
    cases = kernel_runs.ncu_cases(text, ("Waves Per SM", "Grid Size", "DRAM Throughput"))
    assert [c["weight"] for c in cases] == ["8B gate/up 4096x14336", "8B down 14336x4096", "14B-class 5120x13824"]
    assert [c["Waves Per SM"] for c in cases] == [1.36, 0.39, 0.94] and {c["group"] for c in cases} == {128}
    assert [c["Grid Size"] for c in cases] == [1792.0, 512.0, 1728.0]          # "1,792": the comma dropped
    assert cases[1]["DRAM Throughput"] == 55.34
    with pytest.raises(ValueError, match="no profiled case"):
        kernel_runs.ncu_cases("Waves Per SM   1.0\n", ("Waves Per SM",))
    with pytest.raises(ValueError, match=r"has no \['Stalls On Nothing'\]"):
        kernel_runs.ncu_cases(text, ("Stalls On Nothing",))
    cut = text + '{"shape": "cut off", "group": 64}\n'                    # a case its call's limit cut off
    with pytest.raises(ValueError, match="the report of cut off has no"):
        kernel_runs.ncu_cases(cut, ("Waves Per SM",))
    assert [c["weight"] for c in kernel_runs.ncu_cases(cut, ("Waves Per SM",), complete_only=True)] == [
        c["weight"] for c in cases]


def test_time_ratio_counts_and_repeat_spread_on_the_committed_runs():
    """Run X5 (round 16): PDL slower on 33 of 44, beyond 2 % on 25 (the README's numbers); run X6's two timings of
    each launch differ by a median under 1 %; bad input is refused by name."""
    import pandas as pd
    _, rows = kernel_runs.load("h100", "x_side.json", runs="2026-12-07 X5")
    c = kernel_runs.time_ratio_counts(kernel_runs.per_weight(rows, kernel_runs.x_side_pdl)["PDL time ÷ plain"])
    assert (c["slower"], c["slower_beyond"], c["faster"], c["of"]) == (33, 25, 11, 44) and c["median"] > 1
    _, x6 = kernel_runs.load("h100", "x_side.json", runs="2026-12-07 X6")
    spread = kernel_runs.repeat_spread(x6)
    assert len(spread) == 4 * 44 and 0 < spread.median() < 0.01
    assert kernel_runs.time_ratio_counts(pd.Series([0.5, 1.0, 1.01, 1.5]), margin=0.0) == {
        "slower": 2, "slower_beyond": 2, "faster": 1, "faster_beyond": 1, "of": 4, "median": 1.005}
    with pytest.raises(ValueError, match="margin must be a share"):
        kernel_runs.time_ratio_counts(pd.Series([1.0]), margin=2)
    with pytest.raises(ValueError, match="ratio is empty"):
        kernel_runs.time_ratio_counts(pd.Series([], dtype=float))
    _, x2 = kernel_runs.load("h100", "x_side.json", runs="2026-12-06 X2")
    with pytest.raises(ValueError, match="timed more than once"):
        kernel_runs.repeat_spread(x2)
    with pytest.raises(ValueError, match="timed more than once"):
        kernel_runs.repeat_spread(x2.drop(columns="ms_each"))
