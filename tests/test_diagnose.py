"""The OOM decision tree (helpers.measure.diagnose_oom) on given numbers: who refused — this
process's cap or the device — then what in this process's allocator explains it."""
import pytest

from helpers import measure

GiB = 2**30


@pytest.mark.parametrize("stats,request_,branch", [
    # this process's budget (cap or card): the allocator's own state decides
    (dict(total=16 * GiB, allocated=10 * GiB, reserved=15 * GiB), 2 * GiB, "fragmentation"),
    (dict(total=16 * GiB, allocated=15.5 * GiB, reserved=15.6 * GiB), 2 * GiB, "too-big"),
    (dict(total=80 * GiB, allocated=10 * GiB, reserved=10.5 * GiB, shm=64 * 2**20), 1 * GiB, "shm"),
    (dict(total=80 * GiB, allocated=10 * GiB, reserved=10.5 * GiB, shm=8 * GiB), 1 * GiB, "unclear"),
    # the device is full and other processes hold most of it
    (dict(total=80 * GiB, allocated=10 * GiB, reserved=11 * GiB, device_free=0.5 * GiB, device_total=80 * GiB,
          others_bytes=68 * GiB), 1 * GiB, "other-process"),
    # the device is full but the driver cannot say who holds it
    (dict(total=80 * GiB, allocated=10 * GiB, reserved=11 * GiB, device_free=0.5 * GiB, others_bytes=None),
     1 * GiB, "device-full"),
    # a shared card, 60 GiB held by others, but this process's 4 GiB cap refused: never "other-process"
    (dict(total=4 * GiB, capped=True, allocated=3.9 * GiB, reserved=3.95 * GiB, device_free=20 * GiB,
          device_total=80 * GiB, others_bytes=60 * GiB), 1 * GiB, "too-big"),
    (dict(total=4 * GiB, capped=True, allocated=2 * GiB, reserved=3.9 * GiB, device_free=0.2 * GiB,
          device_total=80 * GiB, others_bytes=70 * GiB), 1 * GiB, "fragmentation"),
    # the device is full and this process itself filled it: judged against what it could get
    (dict(total=80 * GiB, allocated=78 * GiB, reserved=78.5 * GiB, device_free=0.5 * GiB, device_total=80 * GiB,
          others_bytes=1 * GiB), 2 * GiB, "too-big"),
])
def test_diagnose_branches(stats, request_, branch):
    assert measure.diagnose_oom(stats, request=request_, echo=False)["branch"] == branch


def test_diagnose_need_beats_a_fragmented_looking_heap():
    st = dict(total=4 * GiB, capped=True, allocated=2 * GiB, reserved=3.9 * GiB)
    assert measure.diagnose_oom(st, request=1 * GiB, echo=False)["branch"] == "fragmentation"
    assert measure.diagnose_oom(st, request=1 * GiB, need=9 * GiB, echo=False)["branch"] == "too-big"


def test_diagnose_weights_vs_activations_and_bad_stats():
    base = dict(total=16 * GiB, allocated=15.5 * GiB, reserved=15.6 * GiB)
    w = measure.diagnose_oom({**base, "top": [{"bytes": 10, "parameter": True}]}, echo=False)
    a = measure.diagnose_oom({**base, "top": [{"bytes": 10, "parameter": False}]}, echo=False)
    assert "load phase" in w["why"] and "generation phase" in a["why"]
    with pytest.raises(ValueError, match="need key 'allocated'"):
        measure.diagnose_oom({"total": 1}, echo=False)


def test_views_never_read_the_device_as_this_process():
    import torch
    v = measure.views()
    if not torch.cuda.is_available():
        assert set(v) == {"rss"}
        assert measure.overhead()["source"].startswith("no CUDA")
        return
    assert v["process"] is None or v["process"] >= v["reserved"]
    assert (v["non_torch"] is None) == (v["process"] is None) == (v["others"] is None)
    assert measure.overhead()["context"] == v["non_torch"] or v["non_torch"] is None
