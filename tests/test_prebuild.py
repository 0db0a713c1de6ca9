"""scripts/prebuild.py --check: it lists the workshop variants of the cache and fails when there are none."""
import importlib.util
import json
from pathlib import Path

import pytest

from helpers.variants import CACHE_VERSION

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("prebuild", ROOT / "scripts" / "prebuild.py")
prebuild = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prebuild)


def test_check_lists_only_the_profiles_variants(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    assert prebuild.main(["--check"]) == 1 and "none: run" in capsys.readouterr().out
    store = tmp_path / "variants"
    store.mkdir()
    for key, profile, version, size in (("a-gptq", "workshop", CACHE_VERSION, 8), ("b-awq", "ci", CACHE_VERSION, 8),
                                        ("c-rtn", "workshop", CACHE_VERSION, 8), ("d-old", "workshop", 3, 8),
                                        ("e-cut", "workshop", CACHE_VERSION, 4)):
        (store / f"{key}.json").write_text(json.dumps({"profile": profile, "seconds": 1.0, "file_bytes": 8,
                                                       "cache_version": version}))
        (store / f"{key}.safetensors").write_bytes(b"x" * size)
    (store / "c-rtn.safetensors").unlink()          # incomplete, of an older store, truncated: not listed
    assert [r["variant"] for r in prebuild.stored_variants("workshop")] == ["a-gptq"]
    assert prebuild.main(["--check"]) == 0 and "1 variants for the workshop profile" in capsys.readouterr().out


def test_only_some_builders_by_number_and_an_unknown_one_is_refused(capsys):
    assert prebuild.select_builders(None) == prebuild.BUILDERS
    assert prebuild.select_builders(["08", "07"]) == ["07_kv_cache_ab", "08_quantized_inference"]
    assert prebuild.select_builders(["09_clinic"]) == ["09_clinic"]
    with pytest.raises(ValueError, match=r"--only \['02'\]: not notebooks the prebuild runs"):
        prebuild.select_builders(["02", "03"])
    with pytest.raises(SystemExit):
        prebuild.main(["--only", "11"])
    assert "not notebooks the prebuild runs" in capsys.readouterr().err
