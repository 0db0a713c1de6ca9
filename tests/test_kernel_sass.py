"""The GEMV's machine code, checked without a GPU (scripts/kernel_sass.py compiles it for sm_90)."""
import functools
import importlib.util
import re
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("kernel_sass", Path(__file__).resolve().parent.parent / "scripts" / "kernel_sass.py")
ks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ks)
triton = pytest.importorskip("triton")
if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm").exists():
    pytest.skip("this Triton has no nvdisasm (its NVIDIA backend)", allow_module_level=True)


GEMV = dict(group=128, groups=2, block_n=128, warps=4)   # 128 rows, 4 warps, 2 groups of 128 per step
TC_CASES = [dict(), dict(swap=False), dict(block_n=128), dict(group=64, groups=4)]
REQUESTS = {   # every kernel this module reads, compiled together in one child process by the first test of a worker
               # that needs one (the child's imports cost more than a compile)
    "gemv": ("gemv", GEMV), "half2": ("gemv", {**GEMV, "HALF2": True}),
    "acc16": ("gemv", {**GEMV, "HALF2": True, "ACC16": True}), "pdl": ("gemv", {**GEMV, "PDL": True}),
    **{f"tc{i}": ("tc", kw) for i, kw in enumerate(TC_CASES)},
    "prepared narrow": ("prepared", dict(group=128, groups=16, block_n=8, warps=2)),
    "prepared wide": ("prepared", dict(group=128, groups=4, block_n=32, warps=2)),
    "prepared narrow pdl": ("prepared", dict(group=128, groups=16, block_n=8, warps=2, pdl=True)),
    "prepared narrow subnormal": ("prepared", dict(group=128, groups=16, block_n=8, warps=2, subnormal=True)),
}


@functools.cache
def _compiled() -> dict:
    return dict(zip(REQUESTS, ks.many_sass(list(REQUESTS.values()))))


def sass_of(name: str) -> str:
    """The SASS of :data:`REQUESTS`' ``name``."""
    return _compiled()[name]


def test_the_gemv_streams_wide_loads_and_spends_one_ffma_per_code():
    sass = sass_of("gemv")
    loop = ks.inner_loop(sass)
    ops, mem = ks.opcodes(loop), ks.memory_ops(loop)
    words = ks.words_per_thread(128, 2, 128, 4)                     # 32 int32 words per thread per step
    assert words == 32
    assert mem["LDG.E.EF.128"] == words / 4                          # the codes: 128-bit loads, evict-first
    assert not any(k[:3] in ("STL", "LDL") for k in ks.memory_ops(sass))   # nothing spilled
    assert ops["FFMA"] >= 7 * words and ops["LOP3"] >= 8 * words     # a chained FFMA and a lop3 per code
    assert "I2FP" not in ops                                         # no int→float instruction
    assert sum(ops.values()) / words <= 36                           # 31.3 when this test was written



def test_the_half2_gemv_makes_two_codes_per_instruction():
    """HALF2: per word 4 lop3 (two fp16 codes each) and 4 HFMA2/HMUL2 (two products each), and no fp32
    copy of the loop: a step whose |x| is too large for fp16 sums has x scaled by a power of two
    instead, so the loop is shorter than the fp32 one and needs fewer registers (the point of it:
    more programs per multiprocessor)."""
    sass = sass_of("half2")
    loop = ks.inner_loop(sass)
    ops, mem = ks.opcodes(loop), ks.memory_ops(loop)
    words = ks.words_per_thread(128, 2, 128, 4)
    assert mem["LDG.E.EF.128"] == words / 4
    assert ops["HFMA2"] + ops["HMUL2"] >= 4 * words and ops["LOP3"] >= 4 * words
    assert ops["FFMA"] < words                                       # no FFMA per code: no fp32 copy of the loop
    assert not any(k[:3] in ("STL", "LDL") for k in ks.memory_ops(sass))
    assert sum(ops.values()) / words <= 31                           # 28.1 when this was written (fp32: 33.5)
    assert ks.registers(sass) <= 108                                 # 99-105 (Triton 3.6-3.9; fp32: 126; with the fp32 copy: 156)


def test_a_switch_both_on_and_off_is_refused_by_name(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["kernel_sass.py", "--on", "HALF2", "--off", "HALF2"])
    with pytest.raises(SystemExit):
        ks.main()
    assert "switched both on and off: ['HALF2']" in capsys.readouterr().err


def test_acc16_converts_a_groups_sums_once_not_every_word():
    """ACC16: the fp16 pair sums of a whole group are added in fp16 (one HADD2 per word) and converted to
    fp32 once per group, so the per-word conversions and fp32 adds of HALF2 leave the loop (128 rows on 4
    warps, 2 groups of 128 per step: 26.2 instructions per word against 28.2 with Triton 3.6, 25.6
    against 27.5 with 3.9; 64 rows on 2 warps with 4 groups, auto_config's: 21.1 against 23.2)."""
    words = ks.words_per_thread(128, 2, 128, 4)
    half2 = ks.opcodes(ks.inner_loop(sass_of("half2")))
    sass = sass_of("acc16")
    acc16 = ks.opcodes(ks.inner_loop(sass))
    assert acc16["FADD"] < words < half2["FADD"]                      # no fp32 add per word
    assert sum(acc16.values()) <= sum(half2.values()) - 1.5 * words
    assert ks.memory_ops(ks.inner_loop(sass))["LDG.E.EF.128"] == words / 4
    assert not any(k[:3] in ("STL", "LDL") for k in ks.memory_ops(sass))


COPY_BYTES = {".64": 8, ".128": 16}   # an asynchronous copy's width, from its modifier (bare LDGSTS.E: 4 bytes)


@pytest.mark.parametrize("case", range(len(TC_CASES)))
def test_the_tensor_core_kernel_copies_its_weights_several_bytes_at_a_time_and_pipelines(case):
    """Each group's bytes and columns are addressed from the step index times constexprs, so the compiler
    knows they start on a multiple of the group: the weights and the activations arrive by asynchronous
    copies of 8 or 16 bytes (``LDGSTS``, software-pipelined over ``num_stages``), not one byte per load.
    Before (a running ``k`` of unknown alignment): 64 ``LDG.E.EF.U8`` per thread per step, 1,579
    instructions in the loop and 216 registers at the default config, and 139 spills at 128 rows
    (Triton 3.9); after: eight 8-byte weight copies, 689 instructions and 126 registers, no spill."""
    kw = TC_CASES[case]
    cfg = dict(group=128, groups=2, block_n=64, warps=4) | kw
    sass = sass_of(f"tc{case}")
    loop = ks.inner_loop(sass)
    mem = ks.memory_ops(loop)
    assert not [k for k in mem if k.endswith(".U8")]                                    # no byte loads at all
    assert "LDGSTS.E" not in mem                                                        # no 4-byte copies
    copied = sum(v * COPY_BYTES.get(k[k.rfind("."):], 4) for k, v in mem.items() if k.startswith("LDGSTS"))
    weight_bytes = cfg["block_n"] * cfg["group"] * cfg["groups"] // 2 // (32 * cfg["warps"])
    x_bytes = 16 * cfg["group"] * cfg["groups"] * 2 // (32 * cfg["warps"])             # 16 rows of bf16
    assert copied == weight_bytes + x_bytes                                             # every byte by async copy
    assert not any(k[:3] in ("STL", "LDL") for k in ks.memory_ops(sass))                 # nothing spilled
    if not kw:
        assert mem["LDGSTS.E.64"] == weight_bytes // 8    # the weights: 8-byte copies, evict-first (x: 16-byte)
        assert sum(ks.opcodes(loop).values()) <= 800     # 689 (Triton 3.9), 667 (3.6) when written; 1,579 before
        assert ks.registers(sass) <= 160                 # 126 when written; 216 before


def test_pdl_asks_l2_for_one_step_then_waits_for_the_previous_kernel():
    """PDL: before the loop, an L2 prefetch (``CCTL.E.PF2``), ``griddepcontrol.launch_dependents``
    (``PREEXIT``) and ``griddepcontrol.wait`` (``ACQBULK``); the loop loads the same and does the same
    work (a few compares and moves of difference); without PDL none of the three."""
    _pdl_before_the_same_loop(sass_of("pdl"), sass_of("gemv"), 0.01)


def _pdl_before_the_same_loop(on: str, off: str, share: float) -> None:
    """The kernel with PDL (``on``) has the L2 prefetch, then ``PREEXIT`` and ``ACQBULK``, all before its inner
    loop (so every load of what the previous kernel wrote, in the loop, comes after the wait), the one without none
    of them, and their inner loops load the same and differ by at most ``share`` of the instructions."""
    assert ks.memory_ops(ks.inner_loop(on)) == ks.memory_ops(ks.inner_loop(off))
    n_on, n_off = sum(ks.opcodes(ks.inner_loop(on)).values()), sum(ks.opcodes(ks.inner_loop(off)).values())
    assert abs(n_on - n_off) <= share * n_off
    for op in ("CCTL.E.PF2", "PREEXIT", "ACQBULK"):
        assert op in on and op not in off, op
    assert on.index("CCTL.E.PF2") < on.index("PREEXIT") < on.index("ACQBULK") < on.index(ks.inner_loop(on))


def test_the_prepared_loop_with_pdl_asks_l2_for_its_first_step_then_waits_for_its_planes():
    """Round 16: the prepared loop with PDL does before its loop what the GEMV's does (an L2 prefetch, then
    ``griddepcontrol.launch_dependents`` and ``.wait``, in that order: the planes, loaded in the loop, only after the
    wait), and its loop is the same loads and about the same work."""
    _pdl_before_the_same_loop(sass_of("prepared narrow pdl"), sass_of("prepared narrow"), 0.02)


def test_the_prepared_loop_at_a_narrow_tile_loads_its_planes_where_they_are_used():
    """Round 12 (benchmarks/x_side.py): with the activation side prepared, at 8 rows × 2048 codes a step the
    four planes of fp16 pairs arrive as 128-bit loads in the registers the words' threads use — no shared-memory
    move of them — while at the rule's tile (32 rows × 512 codes) each plane is loaded one word a thread and
    moved through shared memory with two barriers."""
    narrow = ks.inner_loop(sass_of("prepared narrow"))
    wide = ks.inner_loop(sass_of("prepared wide"))
    n_mem, w_mem = ks.memory_ops(narrow), ks.memory_ops(wide)
    assert n_mem["LDG.E.128"] == 4 and not any(k.startswith("STSM") for k in n_mem)
    assert any(k.startswith("STSM") for k in w_mem)
    assert ks.opcodes(narrow)["BAR"] <= 2 < ks.opcodes(wide)["BAR"]
    assert sum(ks.opcodes(narrow).values()) / ks.words_per_thread(128, 16, 8, 2) <= 21   # 19.4 when written


def test_the_subnormal_codes_spend_fewer_instructions_a_word():
    """Round 17: with the codes as fp16 subnormals the loop drops the four ``HADD2`` a word that took the magic
    number off the codes (only the group sums' ``HADD2`` stay), loads what it loaded and one more 128-bit load (the
    centring plane), flushes no subnormal (no ``.FTZ`` on its fp16 arithmetic), and runs about 3.6 fewer
    instructions a word."""
    plain = ks.inner_loop(sass_of("prepared narrow"))
    sub = ks.inner_loop(sass_of("prepared narrow subnormal"))
    words = ks.words_per_thread(128, 16, 8, 2)
    more = ks.memory_ops(sub) - ks.memory_ops(plain)
    assert dict(more) == {"LDG.E.128": 1} and not ks.memory_ops(plain) - ks.memory_ops(sub)
    assert ks.opcodes(plain)["HADD2"] / words >= 5 > 2 >= ks.opcodes(sub)["HADD2"] / words   # 5.2 and 1.25 when written
    assert not [line for line in sub.splitlines() if re.search(r"\b(HFMA2|HMUL2|HADD2)\.\S*FTZ", line)]
    per_word = sum(ks.opcodes(plain).values()) / words - sum(ks.opcodes(sub).values()) / words
    assert 3 <= per_word <= 4.5                                                               # 19.4 → 15.8 when written


def test_many_sass_refuses_a_request_it_cannot_compile():
    with pytest.raises(ValueError, match="kernel one of"):
        ks.many_sass([("gemm", {})])
    with pytest.raises(ValueError, match="keywords a dict"):
        ks.many_sass([("gemv", 128)])


def test_the_allocated_registers_are_read_beside_the_named_ones():
    """``resources`` reads ``cuobjdump -res-usage``'s line that ``_sass_of`` puts before the SASS: at least the
    registers the code names (the allocation rounds up; 94 named at this tile, as Nsight Compute reported for the
    8B gate/up on an H100), no local memory; a SASS without the line reads as empty."""
    sass = sass_of("prepared narrow")
    res = ks.resources(sass)
    assert res["REG"] >= ks.registers(sass) >= 90 and res["LOCAL"] == 0 and "SHARED" in res
    assert ks.resources("\n".join(sass.splitlines()[1:])) == {}
