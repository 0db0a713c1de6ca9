import json

import pandas as pd
import torch

from helpers import key_numbers as report


def test_key_numbers_merge_and_noop(tmp_path, monkeypatch):
    monkeypatch.delenv(report.ENV_VAR, raising=False)
    assert report.record("nb", a=1) is None
    path = tmp_path / "k.json"
    monkeypatch.setenv(report.ENV_VAR, str(path))
    report.record("nb", table=pd.DataFrame({"x": [1.5, float("nan")]}), t=torch.tensor(3.0))
    report.record("nb", oom=True)
    data = json.loads(path.read_text())
    assert data == {"nb": {"table": [{"x": 1.5}, {"x": None}], "t": 3.0, "oom": True}}
