"""benchmarks.alloc_trace.alive_at_peaks on a hand-made event list (the GPU run records real ones)."""
from benchmarks.alloc_trace import MARK_BYTES, alive_at_peaks


def ev(action, addr, size, frame=""):
    return {"action": action, "addr": addr, "size": size, "frame": frame}


def test_peaks_per_phase_and_the_blocks_alive_then():
    events = [ev("alloc", 1, 100, "generate ids"),                   # before the first forward: counted, no phase
              ev("alloc", 99, MARK_BYTES), ev("free_completed", 99, MARK_BYTES),
              ev("alloc", 2, 1000, "kv"), ev("alloc", 3, 5000, "scores"), ev("free_completed", 3, 5000),
              ev("alloc", 99, MARK_BYTES), ev("free_completed", 99, MARK_BYTES),
              ev("alloc", 4, 300, "repeat_kv"), ev("alloc", 5, 300, "repeat_kv"),
              ev("free_completed", 4, 300), ev("free_completed", 5, 300),
              ev("free_completed", 7, 4096)]                        # freed but allocated before the trace: ignored
    out = alive_at_peaks(events)
    assert out["prefill"]["peak"] == 100 + 1000 + 5000
    assert out["prefill"]["blocks"][0] == {"frame": "scores", "count": 1, "bytes": 5000}
    assert out["decode"]["peak"] == 100 + 1000 + 600
    assert {"frame": "repeat_kv", "count": 2, "bytes": 600} in out["decode"]["blocks"]
    assert all(b["bytes"] != MARK_BYTES for b in out["decode"]["blocks"])


def test_no_marks_means_no_phase_peaks():
    out = alive_at_peaks([ev("alloc", 1, 100), ev("free_completed", 1, 100)])
    assert out["prefill"]["peak"] == 0 and out["decode"]["blocks"] == []
