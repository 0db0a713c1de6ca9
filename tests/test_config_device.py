import pytest
import torch

from helpers import config, device


def test_profile_pick(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "ci")
    assert config.is_ci() and config.pick(full=128, ci=8) == 8
    monkeypatch.setenv("COURSE_PROFILE", "full")
    assert config.pick(full=128, ci=8) == 128


def test_bad_profile(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "fast")
    with pytest.raises(ValueError, match="not a profile"):
        config.profile()


def test_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    assert config.cache_dir("a", "b") == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()


def test_get_device_cpu_and_errors():
    assert device.get_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="unknown device"):
        device.get_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="is_available"):
            device.get_device("cuda")


def test_describe_cpu(capsys):
    info = device.describe(torch.device("cpu"))
    assert info["device"] == "cpu" and info["total_bytes"] > 0
    assert "total_bytes" in capsys.readouterr().out


def test_limit_memory_validates():
    with pytest.raises(ValueError, match="positive"):
        device.limit_memory(-1)
    if not torch.cuda.is_available():
        assert device.limit_memory(15) is None


def test_cap_gib_reads_the_participant_cap(monkeypatch):
    from helpers import device

    monkeypatch.delenv(device.CAP_ENV, raising=False)
    assert device.cap_gib() is None
    monkeypatch.setenv(device.CAP_ENV, "12.5")
    assert device.cap_gib() == 12.5


def test_card_gib_reads_the_emulated_card_size(monkeypatch):
    from helpers import device

    monkeypatch.delenv(device.CARD_ENV, raising=False)
    assert device.card_gib() is None
    monkeypatch.setenv(device.CARD_ENV, "15")
    assert device.card_gib() == 15.0
    for bad in ("fifteen", "0", "-3"):
        monkeypatch.setenv(device.CARD_ENV, bad)
        with pytest.raises(ValueError, match=device.CARD_ENV):
            device.card_gib()


def test_card_share_takes_what_sits_outside_the_allocator_from_the_card():
    GiB = device.GiB
    # 80 GiB card, 1 GiB used in total of which 0.25 GiB is this allocator's: 0.75 GiB sits outside
    assert device.card_share(15, 80 * GiB, 79 * GiB, GiB // 4) == 15 * GiB - 3 * GiB // 4
    assert device.card_share(15, 80 * GiB, 80 * GiB) == 15 * GiB
    with pytest.raises(ValueError, match="leaves nothing"):
        device.card_share(1, 80 * GiB, 78 * GiB)
    with pytest.raises(ValueError, match="inconsistent"):
        device.card_share(15, 80 * GiB, 81 * GiB)
    with pytest.raises(ValueError, match="inconsistent"):
        device.card_share(15, 80 * GiB, 79 * GiB, 2 * GiB)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_emulated_card_bounds_every_cap(monkeypatch):
    from helpers import device

    GiB = device.GiB
    monkeypatch.setenv(device.CARD_ENV, "2")
    try:
        device.limit_memory(None)
        share = device.memory_cap()
        free, total = torch.cuda.mem_get_info()
        outside = total - free - torch.cuda.memory_reserved()
        assert 0 < share < 2 * GiB and abs(share - (2 * GiB - outside)) < 256 * 2**20
        device.limit_memory(50)
        assert device.memory_cap() == share
        with device.memory_limit(share / GiB / 2):
            assert abs(device.memory_cap() - share // 2) <= 1
        assert device.memory_cap() == share
        assert device.free_bytes() <= share
    finally:
        monkeypatch.delenv(device.CARD_ENV)
        device.limit_memory(None)


def test_cpu_has_bf16_reads_the_flags(monkeypatch, tmp_path):
    import builtins
    real_open = builtins.open
    for flags, expected in (("fpu avx2 avx512_bf16", True), ("fpu amx_bf16 sse", True), ("fpu avx2", False)):
        fake = tmp_path / "cpuinfo"
        fake.write_text(f"processor : 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(builtins, "open", lambda p, *a, **k: real_open(fake if p == "/proc/cpuinfo" else p, *a, **k))
        assert device.cpu_has_bf16() is expected
        monkeypatch.setattr(builtins, "open", real_open)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_emulated_card_larger_than_the_device_is_refused(monkeypatch):
    total_gib = torch.cuda.get_device_properties(0).total_memory / device.GiB
    monkeypatch.setenv(device.CARD_ENV, str(round(total_gib * 2)))
    try:
        with pytest.raises(ValueError, match="larger than this device"):
            device.limit_memory(None)
    finally:
        monkeypatch.delenv(device.CARD_ENV)
        device.limit_memory(None)
    assert device.memory_cap() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the H200)")
def test_participant_cap_from_the_environment_holds_in_a_fresh_process():
    """COURSE_GPU_CAP_GIB=2: the process may take 1 GiB, not 3, and a notebook's own cap cannot lift it."""
    import subprocess
    import sys
    code = ("import torch, helpers.device as d\n"
            "a = torch.empty(2**30, dtype=torch.uint8, device='cuda')\n"
            "d.limit_memory(None)\n"
            "try:\n    b = torch.empty(3 * 2**30, dtype=torch.uint8, device='cuda'); print('NO-OOM')\n"
            "except torch.OutOfMemoryError:\n    print('OOM')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "COURSE_GPU_CAP_GIB": "2"})
    assert out.stdout.strip().endswith("OOM") and "NO-OOM" not in out.stdout, out.stderr[-1000:]


def test_results_are_found_from_anywhere_and_helpers_is_a_real_package(tmp_path, monkeypatch):
    import helpers
    from helpers.config import results_path
    monkeypatch.chdir(tmp_path)                      # not the notebooks' folder: no ../results here
    assert results_path("h200", "kernels.json").is_file()
    assert results_path().name == "results" and not results_path("no such file").exists()
    assert helpers.__file__ and helpers.__file__.endswith("__init__.py")   # a namespace package has no file


def test_write_json_replaces_whole_or_not_at_all(tmp_path):
    """A failed write (here: data JSON cannot encode) leaves the previous file as it was, not empty."""
    from helpers.config import read_json, write_json
    p = tmp_path / "rows.json"
    write_json(p, [{"a": 1}])
    assert read_json(p) == [{"a": 1}]
    with pytest.raises(TypeError):
        write_json(p, [{"a": object()}])
    assert read_json(p) == [{"a": 1}] and [f.name for f in tmp_path.iterdir()] == ["rows.json"]
