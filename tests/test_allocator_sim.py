import pytest

from helpers import allocator_ops
from helpers import allocator_sim as A
from helpers.units import GiB, MiB


def test_rounding_rules():
    assert A.round_size(1) == 512 and A.round_size(513) == 1024
    assert A.segment_size(1000) == 2 * MiB and A.segment_size(5 * MiB) == 20 * MiB
    assert A.segment_size(11 * MiB + 1) == 12 * MiB
    with pytest.raises(ValueError):
        A.round_size(-1)


def test_split_and_coalesce():
    s = A.CachingAllocatorSim()
    s.malloc(3 * MiB, "a"); s.malloc(3 * MiB, "b"); s.malloc(3 * MiB, "c")
    assert len(s.segments) == 1 and [b.size for b in s.segments[0].blocks] == [3 * MiB] * 3 + [11 * MiB]
    s.free("a"); s.free("c")                  # c merges with the free tail
    assert [(b.size, b.free) for b in s.segments[0].blocks] == [(3 * MiB, True), (3 * MiB, False), (14 * MiB, True)]
    s.free("b")                               # everything coalesces into one block
    assert [(b.size, b.free) for b in s.segments[0].blocks] == [(20 * MiB, True)]


def test_no_split_when_remainder_small():
    s = A.CachingAllocatorSim()
    s.malloc(11 * MiB + 512, "a")              # segment 12 MiB, remainder < 1 MiB: handed out whole
    assert s.allocated == 12 * MiB


def test_best_fit():
    s = A.CachingAllocatorSim()
    s.malloc(40 * MiB, "big"); s.malloc(12 * MiB, "mid"); s.free("big"); s.free("mid")
    s.malloc(12 * MiB, "x")
    assert s.live["x"][0].size == 12 * MiB     # the 12 MiB segment, not the 40 MiB one


def test_best_fit_ties_go_to_the_newest_segment():
    """Equal free blocks in two segments: the real allocator takes the lowest address, and each new
    large segment lies below the earlier ones (results/h200/alloc_events_qwen2.5-0.5B_eager_8192x1)."""
    s = A.CachingAllocatorSim()
    s.malloc(64 * MiB, "old"); s.malloc(64 * MiB, "new"); s.free("old"); s.free("new")
    s.malloc(14 * MiB, "x")
    assert s.live["x"][0] is s.segments[1]
    s.malloc(64 * MiB, "y")                    # the untouched older segment still holds a whole 64 MiB
    assert s.live["y"][0] is s.segments[0] and len(s.segments) == 2


def test_replay_of_recorded_events_reproduces_the_real_reserved_bytes():
    """The H200's own allocator events of one eager generate (Qwen2.5-0.5B, 8192 × 1): replayed in the
    simulator they reserve exactly what the real allocator reserved over the call's start
    (results/h200/alloc_peaks.json, reserved_meas_over_start); with ties to the oldest segment the
    replay was one 3.5 GiB fp32 score block short."""
    import gzip
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "results" / "h200"
    events = json.loads(gzip.decompress((root / "alloc_events_qwen2.5-0.5B_eager_8192x1.json.gz").read_bytes()))["events"]
    point = next(r for r in json.loads((root / "alloc_peaks.json").read_text())
                 if r["point"] == "Qwen2.5-0.5B:eager:8192:1" and r["run"] == "second")
    s, live = A.CachingAllocatorSim(), {}
    for i, (action, addr, size, _frame) in enumerate(events):
        if action == "a":
            live[addr] = f"t{i}"
            s.malloc(size, f"t{i}")
        elif addr in live:
            s.free(live.pop(addr))
    assert s.peak_reserved == point["reserved_meas_over_start"] == 15_321_792_512


def test_replay_from_a_recorded_state_reproduces_the_real_decode_peak():
    """Mistral-7B (SDPA, 512 × 1, 32 new tokens) on the H200: started from the segments the allocator
    held before the call (the weights' blocks and their holes) and fed the call's recorded events, the
    simulator's allocated bytes inside the decode forwards peak where ``max_memory_allocated`` did
    (``decode_meas``): a K or V of 1.002 MiB takes a whole free block when less than 1 MiB would remain
    (results/h200/alloc_events_mistral-7b_sdpa_512x1_2026-12-03.json.gz, benchmarks/alloc_trace.py)."""
    import gzip
    import json
    from pathlib import Path

    from benchmarks.alloc_trace import MARK_BYTES
    path = Path(__file__).resolve().parents[1] / "results" / "h200" / "alloc_events_mistral-7b_sdpa_512x1_2026-12-03.json.gz"
    (point,) = json.loads(gzip.decompress(path.read_bytes()))
    s = A.CachingAllocatorSim.from_snapshot(point["segments_before"])
    live, forward, now, peak = {}, -1, 0, 0            # now: the blocks' bytes allocated since the start
    for i, (action, addr, size, _frame) in enumerate(point["events"]):
        if action == "a":
            forward += size == MARK_BYTES              # the mark allocated at each forward call's start
            live[addr] = f"t{i}"
            s.malloc(size, f"t{i}")
            now += s.live[f"t{i}"][1].size
        elif action == "f" and addr in live:
            now -= s.live[live[addr]][1].size
            s.free(live.pop(addr))
        if forward >= 1:
            peak = max(peak, now)
    assert peak == pytest.approx(point["decode_meas"], rel=1e-3)    # 110.42 vs 110.41 MB
    assert peak > 1.4 * point["decode"]["peak"]      # the tensors' own bytes at that peak: the blocks add 36 MiB
    with pytest.raises(ValueError, match="total_size"):
        A.CachingAllocatorSim.from_snapshot([{"address": 0, "total_size": 4 * MiB, "segment_type": "large",
                                              "blocks": [[2 * MiB, "active_allocated"]]}])


def test_release_only_wholly_free_segments():
    r = A.simulate(allocator_ops.empty_cache_sequence())
    assert r["reserved"] == 8 * 64 * MiB and r["allocated"] == 64 * MiB


def test_fragmentation_oom_and_expandable_fix():
    ops, cap = allocator_ops.fragmenting_sequence(), allocator_ops.fragmenting_cap()
    r = A.simulate(ops, cap)
    assert r["oom"] and r["reserved"] - r["allocated"] >= 2 * 64 * MiB
    x = A.simulate(ops, cap, expandable=True)
    assert not x["oom"] and x["reserved"] == 760 * MiB   # as measured on the H200


def test_seed_snippet_no_oom():
    """As written the seed's loop frees nothing (27 GiB stay reserved); as meant, empty_cache returns
    the twenty 1 GiB segments (5 GiB of small tensors + the 2 GiB request). Neither runs out."""
    r = A.simulate(allocator_ops.seed_snippet("as_written"))
    assert not r["oom"] and r["reserved"] == 20 * (GiB + 256 * MiB) + 2 * GiB
    r = A.simulate(allocator_ops.seed_snippet("corrected"))
    assert not r["oom"] and r["reserved"] == 5 * GiB + 2 * GiB


def test_seed_loop_deletes_only_the_loop_variable():
    assert allocator_ops.seed_loop_keeps_tensors_alive(7) == {"n": 7, "alive_as_written": 7, "alive_after_fix": 0}


def test_small_pool_and_errors():
    s = A.CachingAllocatorSim()
    s.malloc(1000, "a")
    assert s.segments[0].pool == "small" and s.reserved == 2 * MiB
    with pytest.raises(ValueError):
        s.malloc(10, "a")
    with pytest.raises(KeyError):
        s.free("zzz")
    with pytest.raises(ValueError, match="unknown op"):
        A.simulate([["realloc", "a", 1]])


def test_oversize_blocks_not_split():
    s = A.CachingAllocatorSim(max_split_size=100 * MiB)
    s.malloc(200 * MiB, "big"); s.free("big")
    s.malloc(50 * MiB, "small")                # may not take the oversize cached block
    assert len(s.segments) == 2


def test_playground_ops_are_read_as_typed():
    from helpers.allocator_ops import parse_ops
    assert parse_ops("a=300MiB; b = 1.5 KiB\nfree a; empty_cache; a=2GB") == [
        ["alloc", "a", 300 * MiB], ["alloc", "b", 1536], ["free", "a"], ["empty_cache"], ["alloc", "a", 2 * 1024**3]]


@pytest.mark.parametrize("text, match", [
    ("a=3XB", "cannot read op 'a=3XB'"), ("free z", "nothing named 'z'"), ("a=1MiB; a=2MiB", "already allocated"),
    ("a=0B", "at least 1 B"), (None, "ops must be text")])
def test_playground_ops_bad_input(text, match):
    from helpers.allocator_ops import parse_ops
    with pytest.raises(ValueError, match=match):
        parse_ops(text)


def test_playground_run_on_cpu_says_it_predicts():
    from helpers import widgets
    r = widgets.allocator_run("a=300MiB; b=20MiB; c=300MiB; free a; d=310MiB", cap_mib=650, on_device=False)
    assert r["real"] is None and "simulator only" in r["note"]
    # the 300 MiB hole cannot take 310 MiB; a new segment would pass the cap, so the wholly free one goes
    assert not r["sim"]["oom"] and r["sim"]["reserved"] == 630 * MiB and r["sim"]["allocated"] == 630 * MiB
    assert widgets.allocator_run("a=300MiB; b=300MiB", cap_mib=500, on_device=False)["sim"]["oom"]


def test_expandable_splits_whenever_512_bytes_remain():
    """shouldSplit: under expandable_segments every pool splits when ≥ 512 B would remain (the
    default large pool needs more than 1 MiB)."""
    ops = [["alloc", "a", 40 * MiB], ["free", "a"], ["alloc", "b", 40 * MiB - 600 * 1024]]
    default, exp = A.simulate(ops), A.simulate(ops, expandable=True)
    assert default["allocated"] == 40 * MiB                          # 600 KiB ≤ 1 MiB: handed out whole
    assert exp["allocated"] == 40 * MiB - 600 * 1024                 # split: the 600 KiB stays free


def test_expandable_maps_only_the_pages_a_reused_hole_needs():
    """A hole whose pages were unmapped, partly reused: only the pages the new tensor touches are
    mapped again; the rest of the hole stays unmapped (counted out of reserved)."""
    P = A.PAGE
    sim = A.CachingAllocatorSim(expandable=True)
    sim.malloc(10 * P, "hole")
    sim.malloc(P, "pin")
    sim.free("hole")
    sim.empty_cache()                                               # unmaps the hole's 10 pages
    assert sim.reserved == P
    sim.malloc(2 * P + 1024, "x")                                   # touches 3 pages of the hole
    assert sim.reserved == P + 3 * P and sim.allocated == P + 2 * P + 1024


def test_expandable_oom_when_the_mapping_passes_the_cap():
    P = A.PAGE
    r = A.simulate([["alloc", "a", 3 * P], ["alloc", "b", 2 * P]], cap=4 * P, expandable=True)
    assert r["oom"] and r["failed_at"] == 1 and r["reserved"] == 3 * P


def test_random_sequences_are_seeded_and_capped_around_their_peak():
    ops, cap = allocator_ops.random_sequence(3)
    assert (ops, cap) == allocator_ops.random_sequence(3) and ops != allocator_ops.random_sequence(4)[0]
    live, now, peak = {}, 0, 0
    for op in ops:
        if op[0] == "alloc":
            live[op[1]] = op[2]; now += op[2]; peak = max(peak, now)
        else:
            now -= live.pop(op[1])
    assert 0.7 * peak <= cap <= 1.4 * peak
    outcomes = {A.simulate(*allocator_ops.random_sequence(s))["oom"] for s in range(12)}
    assert outcomes == {True, False}                                # some run out, some do not


# ------------------------------------------------------------------ expandable segments, block by block
def _offset(sim, name):
    return sim.live[name][1].offset


def test_expandable_fills_the_lowest_unmapped_hole_first():
    """find_expandable_block: after an OOM-driven unmap, new pages go into the lowest hole that has
    room, not at the end of the segment."""
    P = A.PAGE
    sim = A.CachingAllocatorSim(expandable=True)
    for n in ("a", "pin1", "b", "pin2"):
        sim.malloc(3 * P if n in "ab" else P, n)
    sim.free("a"), sim.free("b")
    sim.empty_cache()                                                # both 3-page holes unmapped
    assert sim.reserved == 2 * P
    sim.malloc(2 * P, "c")
    assert _offset(sim, "c") == 0 and sim.reserved == 4 * P          # the first hole, two pages mapped


def test_expandable_cap_is_checked_against_the_allocation_size_not_the_pages_needed():
    """alloc_block compares mapped bytes + the request's allocation size with the cap, even when a
    free mapped tail means fewer new pages would do."""
    P = A.PAGE
    ops = [["alloc", "a", 50 * MiB], ["alloc", "c", 30 * MiB]]       # a leaves a 10 MiB mapped tail
    assert not A.simulate(ops, cap=90 * MiB, expandable=True)["oom"]
    r = A.simulate(ops, cap=85 * MiB, expandable=True)                # 60 + 30 > 85, though 4 pages = 80 fit
    assert r["oom"] and r["failed_at"] == 1 and r["reserved"] == 3 * P


def test_expandable_best_fit_keeps_a_block_that_can_grow():
    """get_free_block: among free mapped blocks that fit, move up in size while the next one's
    'expandable size' (plus an unmapped neighbour) is smaller: the tail block that can grow is kept."""
    sim = A.CachingAllocatorSim(expandable=True)
    for n, mib in (("b", 60), ("pin", 20), ("a", 40)):
        sim.malloc(mib * MiB, n)
    sim.free("b"), sim.free("a")                                     # b: 60 MiB inside; a: 40 MiB at the end
    sim.malloc(30 * MiB, "c")
    assert _offset(sim, "c") == 0                                    # b, although a is the tighter fit


def test_expandable_small_pool_maps_2_mib_pages_and_snapshot_shows_mapped_runs():
    sim = A.CachingAllocatorSim(expandable=True)
    for i in range(3):
        sim.malloc(MiB, f"s{i}")                                      # 1 MiB each: small pool
    assert sim.reserved == 4 * MiB
    assert [s["total_size"] for s in sim.snapshot()] == [4 * MiB]    # one run of two pages


def test_simulator_matches_every_recorded_h200_run():
    """results/h200/allocator_agreement.json holds the real allocator's outcome for each sequence
    (measured on the H200); the simulator must reproduce OOM, failing op, reserved and allocated bytes
    and the segment list for every one of them, in both modes."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("agreement", root / "benchmarks/allocator_agreement.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = json.loads((root / "results/h200/allocator_agreement.json").read_text())
    assert {r["mode"] for r in rows} == {"default", "expandable"} and len(rows) >= 80
    bad = []
    for r in rows:
        sim = A.simulate(bench.ops_of(r["sequence"]), r["cap"], r["expandable"])
        got = (sim["oom"], sim["failed_at"], sim["reserved"], sim["allocated"],
               sorted(s["total_size"] for s in sim["snapshot"]))
        want = (r["real_oom"], r["real_failed_at"], r["real_reserved"], r["real_allocated"], sorted(r["real_segments"]))
        if got != want:
            bad.append((r["sequence"], want[:4], got[:4]))
    assert not bad, bad
