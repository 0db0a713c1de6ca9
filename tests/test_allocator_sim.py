import pytest

from helpers import allocator_sim as A

MB = A.MB


def test_rounding_rules():
    assert A.round_size(1) == 512 and A.round_size(513) == 1024
    assert A.segment_size(1000) == 2 * MB and A.segment_size(5 * MB) == 20 * MB
    assert A.segment_size(11 * MB + 1) == 12 * MB
    with pytest.raises(ValueError):
        A.round_size(-1)


def test_split_and_coalesce():
    s = A.CachingAllocatorSim()
    s.malloc(3 * MB, "a"); s.malloc(3 * MB, "b"); s.malloc(3 * MB, "c")
    assert len(s.segments) == 1 and [b.size for b in s.segments[0].blocks] == [3 * MB] * 3 + [11 * MB]
    s.free("a"); s.free("c")                  # c merges with the free tail
    assert [(b.size, b.free) for b in s.segments[0].blocks] == [(3 * MB, True), (3 * MB, False), (14 * MB, True)]
    s.free("b")                               # everything coalesces into one block
    assert [(b.size, b.free) for b in s.segments[0].blocks] == [(20 * MB, True)]


def test_no_split_when_remainder_small():
    s = A.CachingAllocatorSim()
    s.malloc(11 * MB + 512, "a")              # segment 12 MiB, remainder < 1 MiB: handed out whole
    assert s.allocated == 12 * MB


def test_best_fit():
    s = A.CachingAllocatorSim()
    s.malloc(40 * MB, "big"); s.malloc(12 * MB, "mid"); s.free("big"); s.free("mid")
    s.malloc(12 * MB, "x")
    assert s.live["x"][0].size == 12 * MB     # the 12 MiB segment, not the 40 MiB one


def test_release_only_wholly_free_segments():
    r = A.simulate(A.empty_cache_sequence())
    assert r["reserved"] == 8 * 64 * MB and r["allocated"] == 64 * MB


def test_fragmentation_oom_and_expandable_fix():
    ops, cap = A.fragmenting_sequence(), A.fragmenting_cap()
    r = A.simulate(ops, cap)
    assert r["oom"] and r["reserved"] - r["allocated"] >= 2 * 64 * MB
    x = A.simulate(ops, cap, expandable=True)
    assert not x["oom"] and x["reserved"] == 760 * MB   # as measured on the H200


def test_seed_snippet_no_oom():
    """As written the seed's loop frees nothing (27 GiB stay reserved); as meant, empty_cache returns
    the twenty 1 GiB segments (5 GiB of small tensors + the 2 GiB request). Neither runs out."""
    r = A.simulate(A.seed_snippet(as_written=True))
    assert not r["oom"] and r["reserved"] == 20 * (A.GB + 256 * MB) + 2 * A.GB
    r = A.simulate(A.seed_snippet(as_written=False))
    assert not r["oom"] and r["reserved"] == 5 * A.GB + 2 * A.GB


def test_seed_loop_deletes_only_the_loop_variable():
    assert A.seed_loop_keeps_tensors_alive(7) == {"n": 7, "alive_as_written": 7, "alive_after_fix": 0}


def test_small_pool_and_errors():
    s = A.CachingAllocatorSim()
    s.malloc(1000, "a")
    assert s.segments[0].pool == "small" and s.reserved == 2 * MB
    with pytest.raises(ValueError):
        s.malloc(10, "a")
    with pytest.raises(KeyError):
        s.free("zzz")
    with pytest.raises(ValueError, match="unknown op"):
        A.simulate([["realloc", "a", 1]])


def test_oversize_blocks_not_split():
    s = A.CachingAllocatorSim(max_split_size=100 * MB)
    s.malloc(200 * MB, "big"); s.free("big")
    s.malloc(50 * MB, "small")                # may not take the oversize cached block
    assert len(s.segments) == 2


def test_playground_ops_are_read_as_typed():
    from helpers.allocator_sim import parse_ops
    assert parse_ops("a=300MiB; b = 1.5 KiB\nfree a; empty_cache; a=2GB") == [
        ["alloc", "a", 300 * MB], ["alloc", "b", 1536], ["free", "a"], ["empty_cache"], ["alloc", "a", 2 * 1024**3]]


@pytest.mark.parametrize("text, match", [
    ("a=3XB", "cannot read op 'a=3XB'"), ("free z", "nothing named 'z'"), ("a=1MiB; a=2MiB", "already allocated"),
    ("a=0B", "at least 1 B"), (None, "ops must be text")])
def test_playground_ops_bad_input(text, match):
    from helpers.allocator_sim import parse_ops
    with pytest.raises(ValueError, match=match):
        parse_ops(text)


def test_playground_run_on_cpu_says_it_predicts():
    from helpers import widgets
    r = widgets.allocator_run("a=300MiB; b=20MiB; c=300MiB; free a; d=310MiB", cap_mib=650, on_device=False)
    assert r["real"] is None and "simulator only" in r["note"]
    # the 300 MiB hole cannot take 310 MiB; a new segment would pass the cap, so the wholly free one goes
    assert not r["sim"]["oom"] and r["sim"]["reserved"] == 630 * MB and r["sim"]["allocated"] == 630 * MB
    assert widgets.allocator_run("a=300MiB; b=300MiB", cap_mib=500, on_device=False)["sim"]["oom"]


def test_expandable_splits_whenever_512_bytes_remain():
    """shouldSplit: under expandable_segments every pool splits when ≥ 512 B would remain (the
    default large pool needs more than 1 MiB)."""
    ops = [["alloc", "a", 40 * MB], ["free", "a"], ["alloc", "b", 40 * MB - 600 * 1024]]
    default, exp = A.simulate(ops), A.simulate(ops, expandable=True)
    assert default["allocated"] == 40 * MB                          # 600 KiB ≤ 1 MiB: handed out whole
    assert exp["allocated"] == 40 * MB - 600 * 1024                 # split: the 600 KiB stays free


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
    ops, cap = A.random_sequence(3)
    assert (ops, cap) == A.random_sequence(3) and ops != A.random_sequence(4)[0]
    live, now, peak = {}, 0, 0
    for op in ops:
        if op[0] == "alloc":
            live[op[1]] = op[2]; now += op[2]; peak = max(peak, now)
        else:
            now -= live.pop(op[1])
    assert 0.7 * peak <= cap <= 1.4 * peak
    outcomes = {A.simulate(*A.random_sequence(s))["oom"] for s in range(12)}
    assert outcomes == {True, False}                                # some run out, some do not
