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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_emulated_card_bounds_every_cap(monkeypatch):
    from helpers import device

    monkeypatch.setenv(device.CARD_ENV, "2")
    try:
        device.limit_memory(None)
        assert torch.cuda._course_memory_cap == 2 * device.GiB
        device.limit_memory(50)
        assert torch.cuda._course_memory_cap == 2 * device.GiB
        with device.memory_limit(1):
            assert torch.cuda._course_memory_cap == 1 * device.GiB
        assert torch.cuda._course_memory_cap == 2 * device.GiB
        assert device.free_bytes() <= 2 * device.GiB
    finally:
        monkeypatch.delenv(device.CARD_ENV)
        device.limit_memory(None)


def test_cpu_has_bf16_is_a_bool():
    assert device.cpu_has_bf16() in (True, False)
