"""scripts/add_run.py: a device run's rows added to a results file under a run name, bad input refused."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts/add_run.py"), *map(str, args)],
                          capture_output=True, text=True)


def write(path, device, rows, **meta):
    path.write_text(json.dumps({"meta": {"device": device, **meta}, "rows": rows}))
    return path


def test_a_run_is_added_with_its_name_commit_and_entry(tmp_path):
    dest = write(tmp_path / "kernels.json", "H100", [{"ms": 1.0, "run": "old"}], runs={"old": {"commit": "a"}})
    src = write(tmp_path / "new.json", "H100", [{"ms": 2.0}, {"ms": 3.0, "commit": "b"}], copy_GBps=3000.0, seconds=9)
    r = run(src, dest, "--run", "new", "--commit", "c", "--what", "phase V", "--command", "gpu_owed.sh 14")
    assert r.returncode == 0, r.stderr
    out = json.loads(dest.read_text())
    assert [(x.get("run"), x.get("commit")) for x in out["rows"]] == [("old", None), ("new", "c"), ("new", "b")]
    assert out["meta"]["runs"]["new"] == {"commit": "c", "what": "phase V", "command": "gpu_owed.sh 14",
                                          "copy_GBps": 3000.0, "seconds": 9}
    assert out["meta"]["runs"]["old"] == {"commit": "a"} and out["meta"]["device"] == "H100"


def test_bad_input_is_refused_by_name_and_leaves_the_file(tmp_path):
    dest = write(tmp_path / "kernels.json", "H100", [], runs={"old": {}})
    before = dest.read_text()
    src = write(tmp_path / "new.json", "H100", [{"ms": 1.0}])
    other = write(tmp_path / "h200.json", "H200", [{"ms": 1.0}])
    args = ("--commit", "c", "--what", "w", "--command", "x")
    r = run(src, dest, "--run", "old", *args)
    assert r.returncode != 0 and "--run 'old'" in r.stderr
    r = run(other, dest, "--run", "new", *args)
    assert r.returncode != 0 and "'H200'" in r.stderr and "results folder" in r.stderr
    r = run(tmp_path / "missing.json", dest, "--run", "new", *args)
    assert r.returncode != 0 and "missing.json: no such file" in r.stderr
    (tmp_path / "bad.json").write_text("[1, 2]")
    r = run(tmp_path / "bad.json", dest, "--run", "new", *args)
    assert r.returncode != 0 and "not a results file" in r.stderr
    assert dest.read_text() == before
