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
