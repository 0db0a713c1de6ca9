"""Round 12: the one-row GEMV with its activation side prepared (helpers/w4_kernel.py: prepare_x, gemv_prepared,
prepared_config, KERNEL="prepared") and benchmarks/x_side.py's sweep and control, exact in Triton's interpreter
against the readable reference; the timing itself runs only on a GPU."""
import math

import pytest
import torch

from helpers import device

device.use_triton_interpreter_without_gpu()
triton = pytest.importorskip("triton")

from benchmarks import x_side  # noqa: E402
from helpers import w4_format, w4_kernel  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _fp16_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    lo = a.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    return lo | ((b.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF) << 16)


@pytest.mark.parametrize("group", [64, 128])
def test_prepare_x_writes_each_groups_shrunk_pairs_and_sums(group):
    k = 1024 + 512   # not a multiple of the 512 activations one preparing program takes at g128... (3 of them)
    torch.manual_seed(0)
    x = torch.randn(1, k, dtype=torch.bfloat16, device=DEV) * 3
    x[0, 7] = -900.0             # an outlier sets its own group's shrink, not the others'
    x[0, group:2 * group] = 0.0  # a group of zeros keeps shrink 1
    prep = w4_kernel.prepare_x(x, group)
    limit = w4_kernel.acc16_x_limit(group)
    most = x[0].float().abs().view(-1, group).amax(1)
    shrink = torch.where(most > 0, 2.0 ** torch.floor(torch.log2(limit / most.clamp_min(1e-30))), 1.0)
    assert torch.equal(prep.inv.cpu(), (1 / shrink).cpu())
    assert shrink[0] == 2.0 ** math.floor(math.log2(limit / 900.0)) and shrink[1] == 1.0
    xs = (x[0].float().view(-1, group) * shrink[:, None]).view(-1)
    assert xs.view(-1, group).abs().amax(1).max() <= limit
    cols = xs.view(-1, 8)
    want = [_fp16_pair(cols[:, 0], cols[:, 4]), _fp16_pair(cols[:, 1] / 16, cols[:, 5] / 16),
            _fp16_pair(cols[:, 2], cols[:, 6]), _fp16_pair(cols[:, 3] / 16, cols[:, 7] / 16)]
    for plane, w in enumerate(want):
        got = prep.planes[plane * prep.plane_stride:plane * prep.plane_stride + k // 8]
        assert torch.equal(got.cpu(), w.cpu()), f"plane {plane}"
    assert prep.plane_stride % w4_kernel.PLANE_ALIGN == 0
    torch.testing.assert_close(prep.xs.cpu(), x[0].float().view(-1, group).sum(1).cpu(), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("group,n,k,split,prefetch", [(128, 64, 2048, 1, False), (128, 40, 2048, 3, True),
                                                      (64, 32, 1536, 2, False), (64, 48, 2048, 3, True)])
def test_the_prepared_loop_is_exact_against_the_reference(group, n, k, split, prefetch):
    torch.manual_seed(1)
    w = torch.randn(n, k, dtype=torch.bfloat16, device=DEV) * 0.02
    p = w4_format.pack_w4(w, group)
    x = torch.randn(1, k, dtype=torch.bfloat16, device=DEV)
    x[0, 5] = 3000.0   # past fp16 sums' reach unless its group is shrunk
    cfg = {**w4_kernel.narrow_gemv_config(p, sms=4), "SPLIT_K": split, "PREFETCH": prefetch}
    got = w4_kernel.gemv_prepared(w4_kernel.prepare_x(x, group), p, cfg, out_dtype=torch.float32)
    ref = w4_format.reference_matmul(x.float(), p).float()
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 2e-3


def test_bad_input_names_what_is_wrong():
    x = torch.randn(2, 256, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="one row"):
        w4_kernel.prepare_x(x, 128)
    with pytest.raises(ValueError, match="multiple of 8 and of the group size"):
        w4_kernel.PreparedX(200, 128, DEV)
    prep = w4_kernel.prepare_x(x[:1], 128)
    p = w4_format.pack_w4(torch.randn(16, 512, dtype=torch.bfloat16, device=DEV), 128)
    with pytest.raises(ValueError, match="prep is for K = 256"):
        w4_kernel.gemv_prepared(prep, p, w4_kernel.narrow_gemv_config(p, sms=4))


def test_big_shapes_are_the_issues_target_weights():
    shapes = x_side.big_shapes()
    assert "8B gate/up 4096x14336" in shapes and "8B q|k|v 4096x6144" not in shapes   # 29 MB in, 12.6 MB out
    assert all(n * k / 2 >= 15e6 for k, n in shapes.values())


def test_every_tile_of_the_sweep_is_exact():
    """One config of each of TILES (with PREFETCH where the sweep has it), on a weight with fewer rows than a tile."""
    torch.manual_seed(2)
    w = torch.randn(20, 4096, dtype=torch.bfloat16, device=DEV) * 0.02
    p = w4_format.pack_w4(w, 128)
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device=DEV)
    prep = w4_kernel.prepare_x(x, 128)
    ref = w4_format.reference_matmul(x.float(), p).float()
    configs = x_side.tile_configs(p, sms=2)
    seen = set()
    for cfg in configs:
        tile = (cfg["BLOCK_N"], cfg["GROUPS"], cfg["num_warps"])
        if tile in seen:
            continue
        seen.add(tile)
        got = w4_kernel.gemv_prepared(prep, p, {**cfg, "PREFETCH": cfg["SPLIT_K"] > 1}, out_dtype=torch.float32)
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= 2e-3, cfg
    assert len(seen) == len(x_side.TILES)
    assert all(1 <= c["SPLIT_K"] <= 4096 // (128 * c["GROUPS"]) for c in configs)


def test_the_control_is_the_rules_kernel_at_a_narrow_tile():
    torch.manual_seed(3)
    w = torch.randn(24, 2048, dtype=torch.bfloat16, device=DEV) * 0.02
    p = w4_format.pack_w4(w, 64)
    x = torch.randn(1, 2048, dtype=torch.bfloat16, device=DEV)
    ref = w4_format.reference_matmul(x.float(), p).float()
    locks = torch.zeros(8, dtype=torch.int32, device=DEV)
    for cfg in (dict(BLOCK_N=8, GROUPS=8, SPLIT_K=1, num_warps=2), dict(BLOCK_N=8, GROUPS=8, SPLIT_K=3, num_warps=2)):
        got = x_side.in_kernel_x(x, p, cfg, locks).float()
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-2   # bf16 output
    assert int(locks.abs().sum()) == 0   # the serial reduction left its counters at zero


def test_the_prepared_rule_splits_only_where_too_few_codes_are_in_flight():
    stand_in = w4_format.W4Weight.stand_in
    assert w4_kernel.prepared_config(stand_in(14336, 4096, 128), 132) == dict(
        KERNEL="prepared", BLOCK_N=8, GROUPS=16, SPLIT_K=1, num_warps=2, PREFETCH=False)   # 8B gate/up: 2048 codes
    c14 = w4_kernel.prepared_config(stand_in(5120, 13824, 128), 132)             # 108 groups: 4 per step, 27 steps
    assert (c14["GROUPS"], c14["SPLIT_K"]) == (4, 3)
    c72 = w4_kernel.prepared_config(stand_in(8192, 29568, 128), 132)             # 231 groups: one per step
    assert (c72["GROUPS"], c72["SPLIT_K"]) == (1, 8)   # 1,986 codes in flight per SM at one split: 16,384 / 1,986
    torch.manual_seed(4)
    w = torch.randn(40, 2048 + 1024, dtype=torch.bfloat16, device=DEV) * 0.02
    p = w4_format.pack_w4(w, 128)
    x = torch.randn(1, p.shape[1], dtype=torch.bfloat16, device=DEV)
    cfg = w4_kernel.prepared_config(p, sms=1)
    got = w4_kernel.gemv_prepared(w4_kernel.prepare_x(x, 128), p, cfg, out_dtype=torch.float32)
    ref = w4_format.reference_matmul(x.float(), p).float()
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 2e-3


def test_w4a16_matmul_runs_the_prepared_path_from_a_kernel_family():
    """``auto_config(p, 1, {"PREPARED": True})`` picks ``prepared_config``; w4a16_matmul runs the preparation and
    the loop; more rows keep the tensor-core kernel; a W4Linear built with that family matches the reference."""
    from helpers.w4_linear import W4Linear
    torch.manual_seed(5)
    lin = torch.nn.Linear(1024, 48, bias=False).to(DEV, torch.bfloat16)
    p = w4_format.pack_w4(lin.weight.data, 64)
    cfg = w4_kernel.auto_config(p, 1, {"PREPARED": True})
    assert cfg["KERNEL"] == "prepared" and w4_kernel.auto_config(p, 16, {"PREPARED": True})["KERNEL"] == "tc"
    x = torch.randn(1, 1024, dtype=torch.bfloat16, device=DEV)
    ref = w4_format.reference_matmul(x.float(), p).float()
    got = w4_kernel.w4a16_matmul(x, p, cfg, out_dtype=torch.float32)
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 2e-3
    layer = W4Linear(lin, 64, family={"PREPARED": True})
    assert layer.configs[1]["KERNEL"] == "prepared"
    assert ((layer(x).float() - ref).abs().max() / ref.abs().max()).item() <= 1e-2   # bf16 output


def test_a_bad_prepared_config_is_refused_by_name():
    p = w4_format.pack_w4(torch.randn(16, 512, dtype=torch.bfloat16, device=DEV), 128)
    x = torch.randn(1, 512, dtype=torch.bfloat16, device=DEV)
    good = w4_kernel.prepared_config(p, sms=2)
    with pytest.raises(ValueError, match="unknown keys"):
        w4_kernel.w4a16_matmul(x, p, {**good, "HALF2": True})
    with pytest.raises(ValueError, match="SPLIT_K=9 must be at most"):
        w4_kernel.w4a16_matmul(x, p, {**good, "SPLIT_K": 9})
    with pytest.raises(ValueError, match="one row"):
        w4_kernel.w4a16_matmul(torch.randn(2, 512, dtype=torch.bfloat16, device=DEV), p, good)
    with pytest.raises(ValueError, match="BLOCK_N must be a power of 2"):
        w4_kernel.w4a16_matmul(x, p, {**good, "BLOCK_N": 12})


def test_padded_groups_pads_where_the_step_pays_and_never_past_max_pad():
    """Round 13: Llama-2-7B's down projection (86 groups of 128) pads to 88 for 8 groups a step (+2.3 %), not
    to 96 for 16 (+11.6 %); Qwen2.5-72B's (231 groups) to 240 for 16 (+3.9 %); 3584 columns (28 groups) would
    need 14 % for a wider step and stay as they are; a K the tile divides is not padded."""
    assert w4_kernel.padded_groups(11008, 128) == (8, 11264)
    assert w4_kernel.padded_groups(29568, 128) == (16, 30720) and w4_kernel.padded_groups(29568, 64) == (32, 30720)
    assert w4_kernel.padded_groups(3584, 128) == (4, 3584)
    assert w4_kernel.padded_groups(4096, 128) == (16, 4096)
    assert w4_kernel.padded_groups(11008, 128, max_pad=0.2) == (16, 12288)
    for bad, match in (((11008, 100), "multiples of group"), ((0, 128), "k must be"), ((4096, 128, 2048, 1.0), "max_pad")):
        with pytest.raises(ValueError, match=match):
            w4_kernel.padded_groups(*bad)
    with pytest.raises(ValueError, match="below the weight's K"):
        x_side.pad_weight(torch.zeros(2, 128), 64)


def test_the_padded_weight_gives_the_unpadded_product():
    """63 groups of 64 padded to 64 (one step of 32 groups, +1.6 %): zero activations in the padded columns, so
    the candidate rule's loop on the padded weight is exact against the reference on the weight as it was."""
    torch.manual_seed(3)
    w = torch.randn(8, 4032, dtype=torch.bfloat16, device=DEV) * 0.02
    x = torch.randn(1, 4032, dtype=torch.bfloat16, device=DEV)
    pad = x_side.padded_rows(x, w, 64, sms=2)
    assert pad["K_padded"] == 4096 and pad["config"]["GROUPS"] == 32 and pad["rel_err"] <= 2e-3
    assert abs(pad["pad_share"] - 64 / 4032) < 1e-9 and pad["x"][0, 4032:].abs().sum() == 0
    assert x_side.padded_rows(x[:, :2048], w[:, :2048], 64, sms=2) is None      # one whole step: nothing to pad


def test_a_layer_padded_at_pack_time_gives_the_unpadded_product():
    """Round 13 in the layers: ``W4Linear(..., family={"PREPARED": True, "PAD": True})`` packs 4032 columns (63
    groups of 64) as 4096 (one step of 32 groups) — the real groups unchanged, the padded ones dequantize to 0;
    one row goes through the prepared loop with zeros past K (``prepare_x(..., k=4096)``), three rows through
    the tensor-core kernel on x padded with zero columns; both agree with the unpadded layer. x narrower than
    its weight is refused on any kernel but the prepared one, and a layer refuses x of the wrong width."""
    from helpers.w4_linear import W4Linear
    torch.manual_seed(11)
    lin = torch.nn.Linear(4032, 16, bias=True).to(DEV, torch.bfloat16)
    padded = W4Linear(lin, 64, family={"PREPARED": True, "PAD": True})
    plain = W4Linear(lin, 64, family={"PREPARED": True})
    assert padded.shape == (16, 4096) and padded.in_features == 4032 and plain.shape == (16, 4032)
    assert padded.configs[1]["KERNEL"] == "prepared" and padded.configs[1]["GROUPS"] == 32
    assert plain.configs[1]["GROUPS"] < 32                                       # the step shrunk instead
    assert torch.equal(padded.words[:, :4032 // 8], plain.words) and torch.equal(padded.scale[:, :63], plain.scale)
    assert w4_format.dequantize_w4(padded.p, torch.float32)[:, 4032:].abs().max() == 0
    ref_p = w4_format.pack_w4(lin.weight.data, 64)
    for rows in (1, 3, 17):                       # the prepared loop, a tensor-core tile, the dense path
        x = torch.randn(rows, 4032, dtype=torch.bfloat16, device=DEV)
        ref = w4_format.reference_matmul(x.float(), ref_p).float() + lin.bias.float()
        got = padded(x).float()
        assert got.shape == (rows, 16) and ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-2
    x32 = torch.randn(1, 4032, device=DEV)                   # one fp32 row: the CUDA-core GEMV on padded x
    ref32 = w4_format.reference_matmul(x32, ref_p).float() + lin.bias.float()
    assert ((padded(x32).float() - ref32).abs().max() / ref32.abs().max()).item() <= 1e-2
    always_dense = W4Linear(lin, 64, family={"PREPARED": True, "PAD": True}, dense_above=0)
    assert always_dense(x32.to(torch.bfloat16)).shape == (1, 16)   # one row, dense: x padded first
    x = torch.randn(1, 4032, dtype=torch.bfloat16, device=DEV)
    prep = w4_kernel.prepare_x(x, 64, k=4096)
    assert prep.k == 4096 and prep.xs[63:].abs().sum() == 0 and prep.inv[63:].eq(1).all()
    assert all(prep.planes[j * prep.plane_stride + 4032 // 8: j * prep.plane_stride + 4096 // 8].eq(0).all()
               for j in range(4))
    with pytest.raises(ValueError, match="at most k"):
        w4_kernel.prepare_x(x, 64, k=2048)
    with pytest.raises(ValueError, match="only one row on KERNEL='prepared'"):
        w4_kernel.w4a16_matmul(torch.randn(2, 4032, dtype=torch.bfloat16, device=DEV), padded.p, padded.configs[16])
    with pytest.raises(ValueError, match="padded at pack time from x's width"):   # 3072 packs as 3072, not 4096
        w4_kernel.w4a16_matmul(torch.randn(1, 3072, dtype=torch.bfloat16, device=DEV), padded.p, padded.configs[1])
    with pytest.raises(ValueError, match="k must be an int"):
        w4_kernel.prepare_x(x, 64, k=4096.0)
    for off in ({"PREPARED": False, "PAD": True}, {"UNEVEN": True, "PAD": True}):   # the GEMV asked for: no padding
        with pytest.raises(ValueError, match="PAD pads the weight for the prepared path, which family .* turns off"):
            W4Linear(lin, 64, family=off)
    with pytest.raises(ValueError, match="this layer takes 4032"):
        padded(torch.randn(1, 4096, dtype=torch.bfloat16, device=DEV))


def test_pack_width_pads_only_where_the_step_held_few_codes():
    """Round 13's rule for the layers (run X4): Llama-2-7B's down (256 codes a step unpadded) → 11264,
    Qwen2.5-72B's (128) → 30720, Phi-3-medium's and the 14B-class (512) → 18432 and 14336; Qwen2.5-32B's down
    (1024 codes a step already; X4: 0.97–1.01×) and a K the tile divides stay as they are."""
    assert w4_kernel.pack_width(11008, 128) == 11264 and w4_kernel.pack_width(29568, 128) == 30720
    assert w4_kernel.pack_width(17920, 128) == 18432 and w4_kernel.pack_width(13824, 64) == 14336
    assert w4_kernel.pack_width(27648, 128) == 27648 == w4_kernel.pack_width(27648, 64)
    assert w4_kernel.pack_width(4096, 128) == 4096 and w4_kernel.pack_width(4032, 64) == 4096
    assert w4_kernel.pack_width(4000, 64) == 4000 == w4_kernel.pack_width(4000, 96)   # no whole groups / tile steps
    with pytest.raises(ValueError, match="k must be"):
        w4_kernel.pack_width(0, 128)


@pytest.mark.parametrize("group,k,k_out,subnormal", [(64, 1536, None, False), (128, 2048, None, False),
                                                     (64, 4032, 4096, False), (128, 2048, None, True),
                                                     (64, 4032, 4096, True)])
def test_prepare_x_torch_writes_what_the_preparing_kernel_writes(group, k, k_out, subnormal):
    """Round 15: the activation side in torch operations (for torch.compile to fuse into the kernel that writes
    x) is the preparing kernel's: the same planes and 1/shrink bit for bit, Σx to fp32 rounding; zeros past K;
    at either limit (round 17's ``subnormal``)."""
    torch.manual_seed(3)
    x = torch.randn(1, k, dtype=torch.bfloat16, device=DEV) * 3
    x[0, 9] = -1500.0
    x[0, group:2 * group] = 0.0
    want = w4_kernel.prepare_x(x, group, k=k_out, subnormal=subnormal)
    planes, xs, inv = w4_kernel.prepare_x_torch(x, group, k=k_out, subnormal=subnormal)
    assert want.limit == (w4_kernel.SUBNORMAL_X_LIMIT if subnormal else w4_kernel.acc16_x_limit(group))
    assert planes.dtype == torch.int32 and planes.numel() == want.planes.numel()
    for j in range(4 + subnormal):   # the subnormal loop's fifth: the centring plane
        sl = slice(j * want.plane_stride, j * want.plane_stride + want.k // 8)
        assert torch.equal(planes[sl].cpu(), want.planes[sl].cpu()), f"plane {j}"
    if subnormal:   # the centring plane, half by half, from the four planes' own fp16 values
        def halves(j):
            w = want.planes[j * want.plane_stride:j * want.plane_stride + want.k // 8].cpu()
            return [(w & 0xFFFF).to(torch.int16).view(torch.float16).float(),
                    ((w >> 16) & 0xFFFF).to(torch.int16).view(torch.float16).float()]
        x4 = [halves(j) for j in range(5)]
        for h in (0, 1):   # low halves: codes 0-3 of each word; high: 4-7
            held = (x4[0][h] + 16 * x4[1][h]) + (x4[2][h] + 16 * x4[3][h])
            assert torch.equal(x4[4][h], (held * -2.0 ** -21).half().float()), h
    assert torch.equal(inv.cpu(), want.inv.cpu())
    torch.testing.assert_close(xs.cpu(), want.xs.cpu(), rtol=1e-6, atol=1e-4)
    prep = w4_kernel.PreparedX.of(planes, xs, inv, group, subnormal=subnormal)
    assert (prep.k, prep.plane_stride, prep.limit) == (want.k, want.plane_stride, want.limit)
    with pytest.raises(ValueError, match=f"{5 - subnormal} planes: subnormal={not subnormal}"):
        w4_kernel.PreparedX.of(planes, xs, inv, group, subnormal=not subnormal)
    with pytest.raises(ValueError, match="planes must be int32"):
        w4_kernel.PreparedX.of(planes[:-1], xs, inv, group, subnormal=subnormal)
    with pytest.raises(ValueError, match="one row"):
        w4_kernel.prepare_x_torch(torch.cat([x, x]), group)
    with pytest.raises(ValueError, match="at most k"):
        w4_kernel.prepare_x_torch(x, group, k=k - group)
    with pytest.raises(ValueError, match="multiple of the group"):
        w4_kernel.prepare_x_torch(x, group, k=k + 8)
    with pytest.raises(ValueError, match="group must be a positive multiple of 8"):
        w4_kernel.prepare_x_torch(x, 0)
    with pytest.raises(ValueError, match="xs and inv must be float32"):
        w4_kernel.PreparedX.of(planes, xs.double(), inv, group, subnormal=subnormal)
    with pytest.raises(ValueError, match="multiple of 8"):
        w4_kernel.shrunk_planes(torch.ones(12))
    assert w4_kernel.plane_stride(k_out or k) == want.plane_stride
    assert w4_kernel.pow2_shrink(torch.tensor([0.0, w4_kernel.acc16_x_limit(group)]), group).tolist() == [1.0, 1.0]


def test_prep_fusions_row_variant_is_the_group_one_where_every_group_has_the_rows_largest_value():
    """benchmarks/prep_fusion.py's row-shrink planes: with every group holding the row's largest |x|, the
    per-group shrinks all equal the row's, so its planes, Σx and 1/shrink are prepare_x_torch's; otherwise each
    group's shrunk values stay within the fp16 sums' limit. Without CUDA the benchmark says where to run it."""
    from benchmarks import prep_fusion
    torch.manual_seed(5)
    x = torch.randn(1, 1024, dtype=torch.bfloat16) * 2
    x.view(-1, 128)[:, 3] = 40.0
    planes, xs, inv = prep_fusion.row_shrink_planes(x, 128)
    want = w4_kernel.prepare_x_torch(x, 128)
    assert torch.equal(planes, want[0]) and torch.equal(inv, want[2]) and torch.equal(xs, want[1])
    x[0, 5] = 900.0                                    # one outlier shrinks the whole row
    planes, xs, inv = prep_fusion.row_shrink_planes(x, 128)
    assert inv.unique().numel() == 1 and 900.0 / inv[0] <= w4_kernel.acc16_x_limit(128)
    assert prep_fusion.row_shrink_planes(x, 128, sums=False)[1] is None
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="run it where CUDA is"):
            prep_fusion.main(["--out", "/tmp/never.json"])


def test_pdl_rows_time_both_launch_modes_and_compare_their_outputs(monkeypatch):
    """Round 16 (``x_side --pdl``): the candidate rule with its preparation, plain and with PDL on both launches,
    each timed twice in turn (the faster kept), PDL's output compared with the plain one's and the reference —
    read back by ``kernel_runs.x_side_pdl``. Without a GPU the timings are stand-ins and PDL is not launched (the
    interpreter has none); on a GPU both are real."""
    import pandas as pd

    from helpers import kernel_runs
    if DEV == "cpu":
        fake = iter([4.0, 3.0, 2.0, 5.0])   # plain, PDL, plain, PDL
        monkeypatch.setattr(x_side.timing, "graph_ms", lambda calls: ([c() for c in calls], next(fake))[1])
    torch.manual_seed(5)
    ps = [w4_format.pack_w4((torch.randn(24, 1024) * 0.02).to(DEV), 128) for _ in range(2)]
    x = torch.randn(1, 1024, dtype=torch.bfloat16, device=DEV)
    rows = []
    locks = torch.zeros(8, dtype=torch.int32, device=DEV)
    x_side.pdl_rows(x, ps, 128, 2, w4_kernel.prepare_x(x, 128), locks,
                    lambda kernel, ms, **extra: rows.append({"kernel": kernel, "ms": ms, "shape": "s", "group": 128,
                                                             "GBps": 1.0 / ms, "copy_GBps": 1.0, **extra}))
    plain, pdl = rows
    assert (plain["kernel"], pdl["kernel"]) == (kernel_runs.X_CAND_PAID, kernel_runs.X_PDL_PAID)
    assert pdl["config"] == {**plain["config"], "PDL": True} and pdl["exact"] and pdl["same_as_plain"]
    assert len(plain["ms_each"]) == len(pdl["ms_each"]) == 2
    assert plain["ms"] == min(plain["ms_each"]) and pdl["ms"] == min(pdl["ms_each"])
    if DEV == "cpu":
        assert plain["ms_each"] == [4.0, 2.0] and pdl["ms_each"] == [3.0, 5.0]
    tiny = {"kernel": kernel_runs.X_TINY, "ms": 6.0, "shape": "s", "group": 128, "GBps": 1 / 6, "copy_GBps": 1.0}
    view = kernel_runs.x_side_pdl(pd.DataFrame(rows + [tiny]))
    assert view["PDL time ÷ plain"] == pytest.approx(pdl["ms"] / plain["ms"]) and view["same output"]
    assert view["PDL ÷ tinygemm"] == pytest.approx(6.0 / pdl["ms"])
    with pytest.raises(ValueError, match="has no rows"):
        kernel_runs.x_side_pdl(pd.DataFrame(rows))


def test_subnormal_rows_time_the_loop_and_its_preparation_both_ways(monkeypatch):
    """Round 17 (``x_side --subnormal``): the candidate rule's loop alone and with its preparation, centred and
    subnormal codes, each timed twice in turn (the faster kept), the subnormal loop against the reference — read
    back by ``kernel_runs.x_side_subnormal``. Without a GPU the timings are stand-ins."""
    import pandas as pd

    from helpers import kernel_runs
    if DEV == "cpu":
        fake = iter([4.0, 3.0, 6.0, 5.0, 2.0, 3.5, 7.0, 4.5])   # loop, sub loop, paid, sub paid; twice
        monkeypatch.setattr(x_side.timing, "graph_ms", lambda calls: ([c() for c in calls], next(fake))[1])
    torch.manual_seed(6)
    ps = [w4_format.pack_w4((torch.randn(16, 512) * 0.02).to(DEV), 64)]
    x = torch.randn(1, 512, dtype=torch.bfloat16, device=DEV)
    rows = []
    x_side.subnormal_rows(x, ps, 64, 2, w4_kernel.prepare_x(x, 64), torch.zeros(8, dtype=torch.int32, device=DEV),
                          lambda kernel, ms, **extra: rows.append({"kernel": kernel, "ms": ms, "shape": "s", "group": 64,
                                                                   "GBps": 1.0 / ms, "copy_GBps": 1.0, **extra}))
    by = {r["kernel"]: r for r in rows}
    assert list(by) == [kernel_runs.X_CAND, kernel_runs.X_SUB, kernel_runs.X_CAND_PAID, kernel_runs.X_SUB_PAID]
    assert by[kernel_runs.X_SUB]["config"] == {**by[kernel_runs.X_CAND]["config"], "SUBNORMAL": True}
    assert by[kernel_runs.X_SUB]["exact"] and "rel_err" not in by[kernel_runs.X_CAND]
    assert all(r["ms"] == min(r["ms_each"]) and len(r["ms_each"]) == 2 for r in rows)
    if DEV == "cpu":
        assert by[kernel_runs.X_CAND]["ms_each"] == [4.0, 2.0] and by[kernel_runs.X_SUB_PAID]["ms_each"] == [5.0, 4.5]
    tiny = {"kernel": kernel_runs.X_TINY, "ms": 9.0, "shape": "s", "group": 64, "GBps": 1 / 9, "copy_GBps": 1.0}
    view = kernel_runs.x_side_subnormal(pd.DataFrame(rows + [tiny]))
    assert view["loop time ÷ centred"] == pytest.approx(by[kernel_runs.X_SUB]["ms"] / by[kernel_runs.X_CAND]["ms"])
    assert view["subnormal with prep ÷ tinygemm"] == pytest.approx(9.0 / by[kernel_runs.X_SUB_PAID]["ms"])
    with pytest.raises(ValueError, match="x_side --subnormal"):
        kernel_runs.x_side_subnormal(pd.DataFrame(rows))
